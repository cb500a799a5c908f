//! SandboxClaim → a sandbox claimed from the pool's node: the pure plan and
//! the status. The sandbox carries the claim's uid in its metadata
//! (`CLAIM_KEY`), so what the node has for a claim is found by that label, not
//! read back from the claim's status: an operator killed between the node's
//! answer and the status write finds the sandbox again instead of claiming a
//! second one (level-triggered), and a second one made anyway is removed.
use crate::conditions;
use crate::crd::{Condition, SandboxClaimStatus};
use ember_types::api::SandboxInfo;
use k8s_openapi::jiff::Timestamp;

/// Sandbox metadata naming the claim (its uid) that owns it.
pub const CLAIM_KEY: &str = "ember.run.claim";
/// Sandbox metadata naming the node pool a claimed sandbox came from (the
/// pool status counts its claimed sandboxes by it).
pub const POOL_KEY: &str = "ember.run.pool";

/// States after which a sandbox never runs again.
fn ended(s: &SandboxInfo) -> bool {
    matches!(s.status.state.as_str(), "Terminated" | "Failed" | "Stopping" | "Removing")
}

/// What the reconciler does for a live (not deleting) claim.
#[derive(Clone, Debug, PartialEq)]
pub enum Apply {
    /// No sandbox has the claim's label: claim one from the pool.
    Claim,
    /// `keep` answers the claim; `remove` are extra sandboxes for it (a
    /// claim repeated after a crash), removed.
    Bound { keep: String, remove: Vec<String> },
}

/// `found`: the node's sandboxes labelled with this claim. The claim is
/// answered once: a sandbox that ended (TTL, OOM, removed by hand) leaves the
/// claim bound to it and not Ready, it is not replaced behind the user's back.
pub fn plan_apply(found: &[SandboxInfo]) -> Apply {
    // The oldest sandbox wins, whatever its state: it is the one the claim's
    // status may already name. Compared as times, not text: ember's RFC 3339
    // drops a zero fraction, so "01.5Z" sorts before "01Z" as text. The id
    // breaks ties; an unreadable time counts as the newest.
    let key = |s: &SandboxInfo| {
        let t = s.created_at.parse::<Timestamp>().ok();
        (t.is_none(), t, s.id.clone())
    };
    let Some(keep) = found.iter().min_by_key(|s| key(s)) else {
        return Apply::Claim;
    };
    let remove = found.iter().filter(|s| s.id != keep.id && !ended(s)).map(|s| s.id.clone()).collect();
    Apply::Bound { keep: keep.id.clone(), remove }
}

/// The sandboxes to remove when the claim is deleted: every one still there
/// with its label. The finalizer stays until this is empty.
pub fn plan_cleanup(found: &[SandboxInfo]) -> Vec<String> {
    found.iter().filter(|s| s.status.state != "Removing").map(|s| s.id.clone()).collect()
}

/// The `Ready` condition of a resource answered by `bound` (`None`: the
/// node refused it with `error`, reported with reason `failed`).
pub fn ready(bound: Option<&SandboxInfo>, error: Option<&str>, failed: &str) -> Condition {
    match (bound, error) {
        (Some(s), _) if s.status.state == "Running" => {
            Condition::new("Ready", true, "Running", format!("sandbox {} is running", s.id))
        }
        (Some(s), _) if ended(s) => Condition::new(
            "Ready",
            false,
            "SandboxEnded",
            format!("sandbox {} is {}: {}", s.id, s.status.state, s.status.message.clone().unwrap_or_default()),
        ),
        (Some(s), _) => Condition::new("Ready", false, "Starting", format!("sandbox {} is {}", s.id, s.status.state)),
        (None, Some(e)) => Condition::new("Ready", false, failed, e),
        (None, None) => Condition::new("Ready", false, "Pending", "no sandbox yet"),
    }
}

/// The claim's status for the sandbox bound to it (`None`: the claim failed
/// with `error`, e.g. no such pool).
pub fn status(
    prev: Option<&SandboxClaimStatus>,
    bound: Option<&SandboxInfo>,
    error: Option<&str>,
    ember_url: &str,
    generation: Option<i64>,
    now: &str,
) -> SandboxClaimStatus {
    let ready = ready(bound, error, "ClaimFailed");
    let prev_conditions = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    SandboxClaimStatus {
        sandbox_id: bound.map(|s| s.id.clone()),
        endpoint: bound.map(|s| format!("{}/v1/sandboxes/{}", ember_url.trim_end_matches('/'), s.id)),
        launch: bound.and_then(|s| s.launch.as_ref()).map(|l| l.kind.clone()),
        conditions: conditions::set(prev_conditions, ready.generation(generation), now),
    }
}
