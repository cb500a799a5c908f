//! SandboxTemplate (`ember.run`) → an ember template on the node: the pure
//! plan (desired + observed → one action) and the status it reports; the IO
//! is `template_controller.rs`. ember cannot change a template in place, so
//! a spec ember has not taken yet (`generation` past the status'
//! `observedGeneration`) replaces the node's template. Deleting the resource
//! removes the template, held while a SandboxPool of the namespace names it.
use crate::conditions;
use crate::crd::{Condition, SandboxTemplate, SandboxTemplateSpec, SandboxTemplateStatus};
use ember_types::image::{TemplateInfo, TemplateRequest};
use kube::ResourceExt;

/// The ember template a SandboxTemplate `namespace/name` makes on the node:
/// `k8s-<namespace>-<name>`, fitted to ember's names as pools' are.
pub fn ember_name(namespace: &str, name: &str) -> String {
    crate::node_pool_name(namespace, name)
}

/// The template request a spec asks ember for.
pub fn request(name: String, spec: &SandboxTemplateSpec) -> TemplateRequest {
    TemplateRequest {
        name,
        // `host`: the host's root filesystem, as ember's own `host` template.
        image: (spec.image != "host").then(|| spec.image.clone()),
        auth: None,
        resources: spec.resources.as_ref().map(crate::resources),
        runtime_class: spec.runtime_class.clone(),
        network: None,
        user: spec.user.clone(),
        workdir: spec.workdir.clone(),
        env: (!spec.env.is_empty()).then(|| spec.env.clone()),
        entrypoint: spec.entrypoint.clone(),
    }
}

/// What the resource wants while it lives: its request and its generation.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub req: TemplateRequest,
    pub generation: Option<i64>,
    /// The generation ember last took (the status' `observedGeneration`).
    pub observed_generation: Option<i64>,
}

/// The one step the reconciler takes next.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Create(Box<TemplateRequest>),
    /// A newer spec than the node's template: removed, then made anew.
    Replace(Box<TemplateRequest>),
    Delete(String),
    /// Being deleted, and these SandboxPools still build from it: the
    /// template stays until they go.
    Hold(Vec<String>),
    Nothing,
}

/// `desired` is `None` once the resource is being deleted; `users` are the
/// SandboxPools of its namespace naming it.
pub fn plan(desired: Option<&Desired>, observed: Option<&TemplateInfo>, users: &[String]) -> Action {
    match (desired, observed) {
        (None, _) if !users.is_empty() => Action::Hold(users.to_vec()),
        (None, Some(o)) => Action::Delete(o.name.clone()),
        (None, None) => Action::Nothing,
        (Some(d), None) => Action::Create(Box::new(d.req.clone())),
        (Some(d), Some(_)) if d.observed_generation < d.generation => Action::Replace(Box::new(d.req.clone())),
        (Some(_), Some(_)) => Action::Nothing,
    }
}

/// The SandboxPools (names) among `pools` that build from the template
/// `name`: node-mode pools of the same namespace whose `template` names it,
/// deleting ones included (their node pool lives until their finalizer ran).
pub fn users<'a>(pools: impl IntoIterator<Item = &'a crate::crd::SandboxPool>, name: &str) -> Vec<String> {
    let mut out: Vec<String> =
        pools.into_iter().filter(|p| p.spec.mode.is_node() && p.spec.template == name).map(|p| p.name_any()).collect();
    out.sort();
    out
}

/// The status after a pass: `node` the template as ember holds it now,
/// `error` ember's refusal of this pass' request.
pub fn status(
    prev: Option<&SandboxTemplateStatus>,
    node: Option<&TemplateInfo>,
    error: Option<&str>,
    generation: Option<i64>,
    now: &str,
) -> SandboxTemplateStatus {
    let ready = match (node, error) {
        (_, Some(e)) => Condition::new("Ready", false, "NodeRefused", e),
        (Some(t), None) => Condition::new("Ready", true, "Accepted", format!("ember template {}", t.name)),
        (None, None) => Condition::new("Ready", false, "Pending", "not on the node yet"),
    };
    let prev_conditions = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    let mut conditions = conditions::set(prev_conditions, ready.generation(generation), now);
    conditions.retain(|c| c.type_ != "DeletionBlocked");
    SandboxTemplateStatus {
        template: node.map(|t| t.name.clone()),
        image_digest: node.and_then(|t| t.image_digest.clone()),
        observed_generation: generation,
        conditions,
    }
}

/// The status of a deletion held by `users`.
pub fn held(prev: Option<&SandboxTemplateStatus>, users: &[String], now: &str) -> SandboxTemplateStatus {
    let mut st = prev.cloned().unwrap_or_default();
    let why = format!("SandboxPool {} builds from it: delete or repoint it first", users.join(", "));
    st.conditions = conditions::set(&st.conditions, Condition::new("DeletionBlocked", true, "InUse", why), now);
    st
}

/// How a SandboxPool's `template` reaches the node.
#[derive(Clone, Debug, PartialEq)]
pub enum TemplateRef {
    /// No SandboxTemplate of that name in the namespace: an ember template
    /// of that name on the node (`host`, one made with `ember template`).
    Node(String),
    /// The SandboxTemplate's ember template, accepted for its generation.
    Made(String),
    /// A SandboxTemplate of that name that ember has not accepted (yet):
    /// why, for the pool's status.
    NotReady(String),
}

/// `cr`: the SandboxTemplate of the pool's namespace named by its
/// `template`, if there is one.
pub fn resolve(namespace: &str, template: &str, cr: Option<&SandboxTemplate>) -> TemplateRef {
    let Some(cr) = cr else { return TemplateRef::Node(template.to_string()) };
    let st = cr.status.clone().unwrap_or_default();
    let ready = conditions::find(&st.conditions, "Ready");
    let current = st.observed_generation == cr.metadata.generation;
    match ready {
        Some(r) if r.is_true() && current => TemplateRef::Made(ember_name(namespace, template)),
        Some(r) if current => TemplateRef::NotReady(format!("SandboxTemplate {template}: {}", r.message)),
        _ => TemplateRef::NotReady(format!("SandboxTemplate {template} is not on the node yet")),
    }
}
