//! agent-sandbox's resources → ember: the pure parts. A SandboxWarmPool is an
//! ember pool (`pool::plan` drives it, as for ember's own SandboxPool) whose
//! template, runtime class and limits are read from its SandboxTemplate; a
//! SandboxClaim is a sandbox claimed from that pool (`claim::plan_apply`
//! finds it again by the claim's uid) with a Sandbox resource of the claim's
//! name naming it; the statuses are agent-sandbox's, so its clients read them.
use super::crd::{
    ClaimedSandbox, SandboxClaimStatus, SandboxStatus, SandboxTemplate, SandboxWarmPool, SandboxWarmPoolStatus,
};
use crate::conditions;
use crate::crd::Condition;
use crate::pool::Desired;
use ember_types::api::{PoolInfo, ResourcesSpec, SandboxInfo};
use k8s_openapi::jiff::Timestamp;

/// A SandboxTemplate annotation naming the ember template its sandboxes are
/// made from; without it, the first container's image is taken as one.
pub const TEMPLATE_ANNOTATION: &str = "ember.run/template";
/// A Sandbox resource annotation: the ember sandbox backing it.
pub const SANDBOX_ID_ANNOTATION: &str = "ember.run/sandbox-id";

/// The ember pool a warm pool asks for, or why the template cannot be served.
pub fn desired(node_pool: String, pool: &SandboxWarmPool, template: &SandboxTemplate) -> Result<Desired, String> {
    let spec = &template.spec.blueprint.pod_template.spec;
    let container = spec.get("containers").and_then(|c| c.get(0));
    let annotated = template.metadata.annotations.as_ref().and_then(|a| a.get(TEMPLATE_ANNOTATION)).cloned();
    let image = container.and_then(|c| c.get("image")).and_then(|i| i.as_str()).map(str::to_string);
    let ember_template = annotated.or(image).filter(|t| !t.is_empty()).ok_or_else(|| {
        format!("SandboxTemplate has neither the {TEMPLATE_ANNOTATION} annotation nor a container image")
    })?;
    let limits = container.and_then(|c| c.pointer("/resources/limits"));
    let limit = |k: &str| limits.and_then(|l| l.get(k)).and_then(|v| v.as_str()).map(str::to_string);
    let resources = ResourcesSpec { memory: limit("memory"), cpu: limit("cpu"), ..Default::default() };
    Ok(Desired {
        name: node_pool,
        template: ember_template,
        // agent-sandbox's default is one warm sandbox; the schema keeps it >= 0.
        replicas: u32::try_from(pool.spec.replicas.unwrap_or(1)).unwrap_or(0),
        resources: (resources != ResourcesSpec::default()).then_some(resources),
        runtime_class: spec.get("runtimeClassName").and_then(|r| r.as_str()).map(str::to_string),
    })
}

/// The warm pool's status for the node's pool: `replicas` the warm ones
/// (idle and starting), `readyReplicas` the idle ones a claim takes now.
pub fn pool_status(observed: &PoolInfo, generation: Option<i64>, selector: String) -> SandboxWarmPoolStatus {
    let warm = observed.idle.saturating_add(observed.starting);
    SandboxWarmPoolStatus {
        replicas: i32::try_from(warm).unwrap_or(i32::MAX),
        ready_replicas: i32::try_from(observed.idle).unwrap_or(i32::MAX),
        selector,
        observed_generation: generation.unwrap_or_default(),
        conditions: Vec::new(),
    }
}

/// A warm pool the node cannot serve: its status says why.
pub fn pool_refused(
    prev: Option<&SandboxWarmPoolStatus>,
    reason: &str,
    why: String,
    now: &str,
) -> SandboxWarmPoolStatus {
    let mut status = prev.cloned().unwrap_or_default();
    status.conditions = conditions::set(&status.conditions, Condition::new("Ready", false, reason, why), now);
    status
}

/// States after which a sandbox never runs again.
fn ended(s: &SandboxInfo) -> bool {
    matches!(s.status.state.as_str(), "Terminated" | "Failed" | "Stopping" | "Removing")
}

/// The Ready condition of a claim and of its Sandbox resource. The reasons
/// that end a claim are those agent-sandbox's clients stop waiting on
/// (`WarmPoolNotFound`, `SandboxExpired`, `PodFailed`).
pub fn ready(bound: Option<&SandboxInfo>, error: Option<(&str, &str)>) -> Condition {
    match (bound, error) {
        (Some(s), _) if s.status.state == "Running" => {
            Condition::new("Ready", true, "SandboxReady", format!("ember sandbox {} is running", s.id))
        }
        (Some(s), _) if ended(s) => {
            let reason = if s.status.state == "Failed" { "PodFailed" } else { "SandboxExpired" };
            let why = s.status.message.clone().unwrap_or_default();
            Condition::new("Ready", false, reason, format!("ember sandbox {} is {}: {why}", s.id, s.status.state))
        }
        (Some(s), _) => {
            Condition::new("Ready", false, "SandboxNotReady", format!("ember sandbox {} is {}", s.id, s.status.state))
        }
        (None, Some((reason, why))) => Condition::new("Ready", false, reason, why),
        (None, None) => Condition::new("Ready", false, "SandboxMissing", "no sandbox claimed yet"),
    }
}

/// The claim's status: the Sandbox resource's name once a sandbox is bound.
pub fn claim_status(
    prev: Option<&SandboxClaimStatus>,
    sandbox_name: &str,
    ready: Condition,
    bound: bool,
    generation: Option<i64>,
    now: &str,
) -> SandboxClaimStatus {
    let prev_conditions = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    SandboxClaimStatus {
        conditions: conditions::set(prev_conditions, ready.generation(generation), now),
        sandbox: ClaimedSandbox { name: if bound { sandbox_name.into() } else { String::new() }, pod_ips: Vec::new() },
    }
}

/// The Sandbox resource's status: its Ready condition (the claim's forwards it).
pub fn sandbox_status(prev: Option<&SandboxStatus>, ready: Condition, now: &str) -> SandboxStatus {
    let prev_conditions = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    SandboxStatus { conditions: conditions::set(prev_conditions, ready, now), ..prev.cloned().unwrap_or_default() }
}

/// The sandbox's time to live from the claim's `lifecycle.shutdownTime`:
/// `None` without one, at least a second when it is already past (ember
/// takes whole seconds and ends it at once then).
pub fn timeout_secs(shutdown_time: Option<&str>, now: Timestamp) -> Result<Option<u64>, String> {
    let Some(t) = shutdown_time else { return Ok(None) };
    let at: Timestamp = t.parse().map_err(|e| format!("lifecycle.shutdownTime {t:?}: {e}"))?;
    let secs = at.duration_since(now).as_secs();
    Ok(Some(u64::try_from(secs).unwrap_or(0).max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::crd::{NameRef, SandboxTemplateSpec, SandboxWarmPoolSpec};

    fn template(pod: serde_json::Value, annotation: Option<&str>) -> SandboxTemplate {
        let mut t = SandboxTemplate::new("t", SandboxTemplateSpec::of_pod(pod));
        t.metadata.annotations = annotation.map(|a| [(TEMPLATE_ANNOTATION.to_string(), a.to_string())].into());
        t
    }

    fn pool(replicas: Option<i32>) -> SandboxWarmPool {
        SandboxWarmPool::new(
            "p",
            SandboxWarmPoolSpec { replicas, sandbox_template_ref: NameRef { name: "t".into() }, update_strategy: None },
        )
    }

    #[test]
    fn the_pool_takes_the_image_its_class_and_limits_or_the_annotation() {
        let pod = serde_json::json!({
            "runtimeClassName": "gvisor",
            "containers": [{"image": "python:3.12", "resources": {"limits": {"memory": "512Mi", "cpu": "1"}}}]
        });
        let d = desired("n".into(), &pool(Some(3)), &template(pod.clone(), None)).expect("served");
        assert_eq!((d.template.as_str(), d.replicas, d.runtime_class.as_deref()), ("python:3.12", 3, Some("gvisor")));
        let r = d.resources.expect("limits");
        assert_eq!((r.memory.as_deref(), r.cpu.as_deref()), (Some("512Mi"), Some("1")));
        let d = desired("n".into(), &pool(None), &template(pod, Some("host"))).expect("served");
        assert_eq!((d.template.as_str(), d.replicas), ("host", 1));
        let none = desired("n".into(), &pool(Some(1)), &template(serde_json::json!({"containers": []}), None));
        assert!(none.is_err_and(|e| e.contains(TEMPLATE_ANNOTATION)));
    }

    #[test]
    fn a_shutdown_time_is_a_timeout_of_at_least_a_second() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        assert_eq!(timeout_secs(None, now), Ok(None));
        assert_eq!(timeout_secs(Some("2026-01-01T00:01:00Z"), now), Ok(Some(60)));
        assert_eq!(timeout_secs(Some("2025-12-31T00:00:00Z"), now), Ok(Some(1)));
        assert!(timeout_secs(Some("tomorrow"), now).is_err());
    }

    #[test]
    fn an_unclaimed_claim_is_not_ready_and_names_no_sandbox() {
        let c = claim_status(None, "c", ready(None, Some(("WarmPoolNotFound", "no pool"))), false, Some(1), "t");
        assert_eq!(c.sandbox.name, "");
        let r = &c.conditions[0];
        assert_eq!(
            (r.status.as_str(), r.reason.as_str(), r.observed_generation),
            ("False", "WarmPoolNotFound", Some(1))
        );
    }
}
