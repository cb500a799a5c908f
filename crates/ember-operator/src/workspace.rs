//! Workspace (`ember.run`) → an ember workspace on the node: the pure plan
//! and the status (holder, fencing epoch, newest checkpoint, as ember's API
//! reports them); the IO is `workspace_controller.rs`. The size is fixed
//! once made (the CRD's CEL rule refuses a change), so a live resource only
//! ever creates. Deleting it deletes the workspace, which ember refuses
//! while a live sandbox writes it: the deletion then waits, its status says
//! why.
use crate::conditions;
use crate::crd::{Condition, WorkspaceCheckpoint, WorkspaceStatus};
use ember_types::api::{WorkspaceInfo, WorkspaceSnapshotInfo};

/// The ember workspace a Workspace `namespace/name` makes on the node:
/// `k8s-<namespace>-<name>` (ember's workspace names are pools' names).
pub fn ember_name(namespace: &str, name: &str) -> String {
    crate::node_pool_name(namespace, name)
}

/// The one step the reconciler takes next.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Create { name: String, size: String },
    Delete(String),
    Nothing,
}

/// `desired`: the ember name and size while the resource lives, `None`
/// once it is being deleted.
pub fn plan(desired: Option<(&str, &str)>, observed: Option<&WorkspaceInfo>) -> Action {
    match (desired, observed) {
        (Some((name, size)), None) => Action::Create { name: name.into(), size: size.into() },
        (None, Some(o)) => Action::Delete(o.name.clone()),
        _ => Action::Nothing,
    }
}

/// The newest of the workspace's snapshots (a checkpoint is one), by time.
pub fn last_checkpoint(snapshots: &[WorkspaceSnapshotInfo]) -> Option<WorkspaceCheckpoint> {
    let key = |s: &WorkspaceSnapshotInfo| s.created_at.parse::<k8s_openapi::jiff::Timestamp>().ok();
    let newest = snapshots.iter().max_by_key(|s| (key(s), s.id.clone()))?;
    Some(WorkspaceCheckpoint { snapshot_id: newest.id.clone(), at: newest.created_at.clone(), epoch: newest.epoch })
}

/// The status after a pass: `node` the workspace as ember reports it,
/// `error` ember's refusal of this pass' create.
pub fn status(
    prev: Option<&WorkspaceStatus>,
    node: Option<&WorkspaceInfo>,
    checkpoint: Option<WorkspaceCheckpoint>,
    error: Option<&str>,
    generation: Option<i64>,
    now: &str,
) -> WorkspaceStatus {
    let (ready, phase) = match (node, error) {
        (_, Some(e)) => (Condition::new("Ready", false, "NodeRefused", e), "Failed"),
        (Some(w), None) => {
            let phase = if w.lease.is_some() { "Held" } else { "Available" };
            (Condition::new("Ready", true, "Available", format!("ember workspace {}", w.name)), phase)
        }
        (None, None) => (Condition::new("Ready", false, "Pending", "not on the node yet"), "Pending"),
    };
    let prev_conditions = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    let mut conditions = conditions::set(prev_conditions, ready.generation(generation), now);
    conditions.retain(|c| c.type_ != "DeletionBlocked");
    let lease = node.and_then(|w| w.lease.as_ref());
    WorkspaceStatus {
        phase: Some(phase.into()),
        workspace: node.map(|w| w.name.clone()),
        size_bytes: node.map_or(0, |w| w.size_bytes),
        used_bytes: node.map_or(0, |w| w.used_bytes),
        holder: lease.map(|l| l.holder.clone()),
        epoch: lease.map_or(node.map_or(0, |w| w.epoch), |l| l.epoch),
        last_checkpoint: checkpoint,
        observed_generation: generation,
        conditions,
    }
}

/// The status of a deletion ember refused (`why`: its code and message).
pub fn held(prev: Option<&WorkspaceStatus>, why: &str, now: &str) -> WorkspaceStatus {
    let mut st = prev.cloned().unwrap_or_default();
    let cond = Condition::new("DeletionBlocked", true, "InUse", format!("ember refuses the delete: {why}"));
    st.conditions = conditions::set(&st.conditions, cond, now);
    st
}
