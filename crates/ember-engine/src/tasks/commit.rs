//! The workspace side of an attempt's end. An attempt writes into a layer of
//! its own over the workspace (`WorkspaceRequest::layered`); after its command
//! exits 0 the layer is committed, but only while both the workspace epoch
//! and the task lease are still the attempt's, checked under the lease lock
//! with the sandbox frozen. Any other end drops the layer with the sandbox,
//! so a failed, killed or fenced attempt leaves no writes behind.
//!
//! A commit names its task. An attempt whose task already committed (an
//! earlier attempt's report was lost after its commit, say to a lease that
//! expired during it) reports success without running again: exactly once
//! in effect.
use super::TaskService;
use super::Tasks;
use ember_queue::{Lease, Outcome};
use std::sync::Arc;
use std::time::Instant;

/// The outcome of an attempt whose command exited 0 in sandbox `sb`.
pub(super) async fn settle(
    e: &Arc<Tasks>,
    svc: &Arc<TaskService>,
    lease: &Lease,
    workspace: &str,
    sb: &str,
    epoch: Option<u64>,
) -> Outcome {
    let (queue, l) = (svc.queue.clone(), lease.clone());
    // A heartbeat both checks the task lease and renews it for the commit.
    let still_leased = move || queue.heartbeat(&l).is_ok();
    let t = Instant::now();
    // Frozen first, so nothing in the sandbox writes during the merge; it
    // stays frozen until its removal.
    let committed = match e.sandboxes.pause(sb).await {
        Ok(()) => e.workspaces.commit_layer(workspace, sb, epoch, &lease.task, still_leased).await,
        Err(err) => Err(err),
    };
    svc.metrics.phase("commit", t);
    match committed {
        Ok(true) => Outcome::Succeeded,
        Ok(false) => Outcome::Retry {
            reason: "the workspace lease was taken by a newer writer; the attempt's writes were dropped".into(),
            exit_code: None,
        },
        Err(err) => Outcome::Retry { reason: format!("committing the workspace failed: {err}"), exit_code: None },
    }
}

/// Whether an earlier attempt of `task` committed into `workspace`.
pub(super) async fn committed_before(e: &Arc<Tasks>, workspace: &str, task: &str) -> bool {
    match e.workspaces.layer_committed(workspace, task).await {
        Ok(done) => done,
        Err(err) => {
            tracing::warn!(task = %task, workspace = %workspace, error = %err, "reading commit records failed");
            false
        }
    }
}

/// Drops the commit record once the queue accepted the success.
pub(super) async fn recorded(e: &Arc<Tasks>, workspace: &str, task: &str, accepted: bool) {
    if accepted {
        e.workspaces.forget_layer_commit(workspace, task).await;
    }
}
