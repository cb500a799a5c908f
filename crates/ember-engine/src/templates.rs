//! Templates: named defaults a sandbox is created from. The built-in `host`
//! template uses the host's `/usr` read-only under a generated `/etc`; OCI image
//! templates arrive with image support.
use ember_types::{Resources, SandboxSpec, UserSpec};

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

/// The spec a pool starts its idle sandboxes with: the template's defaults and
/// the pool's resources; everything per-caller is bound at claim.
pub(crate) fn pooled_spec(p: &crate::pool::PoolSpec) -> SandboxSpec {
    let user = builtin(&p.template).map_or(UserSpec::SANDBOX, |t| t.user);
    SandboxSpec {
        template: p.template.clone(),
        runtime_class: p.runtime_class.clone(),
        resources: p.resources.clone(),
        ttl_secs: None,
        env: Default::default(),
        metadata: Default::default(),
        entrypoint: Vec::new(),
        user,
        network: p.network,
        egress: p.egress.clone(),
        volumes: Vec::new(),
    }
}
