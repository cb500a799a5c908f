//! Templates: named defaults a sandbox is created from. The built-in `host`
//! template uses the host's `/usr` read-only under a generated `/etc`; OCI image
//! templates arrive with image support.
use ember_types::{Resources, UserSpec};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    pub name: String,
    pub runtime_class: String,
    pub resources: Resources,
    pub user: UserSpec,
}

pub fn builtin(name: &str) -> Option<Template> {
    (name == "host").then(|| Template {
        name: "host".into(),
        runtime_class: "native".into(),
        resources: Resources::default(),
        user: UserSpec::SANDBOX,
    })
}
