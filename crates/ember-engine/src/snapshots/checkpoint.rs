//! A workspace checkpoint (`POST /v1/workspaces/{name}/checkpoint`): a
//! synchronous, incremental snapshot to the store, fenced by the workspace's
//! lease as it stands when the call starts. On one node the epoch is the
//! lease's; a cluster node then commits the snapshot as the workspace's
//! checkpoint at its own epoch (`ember-cluster`'s `node/workspaces.rs`).
use super::Snapshots;
use crate::EngineError;
use std::sync::Arc;

/// What a checkpoint answers: the snapshot, the epoch it was taken under,
/// and when (ms since the epoch).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceCheckpoint {
    pub snapshot_id: String,
    pub epoch: u64,
    pub at_ms: i64,
}

impl Snapshots {
    /// Snapshots workspace `name` under its current lease: the commit is
    /// refused (`WORKSPACE::FENCED`) if the lease changes hands meanwhile.
    /// Its writer is frozen while the tree is read, so every byte written
    /// before the call is in the snapshot once it returns.
    pub async fn checkpoint_workspace(self: &Arc<Self>, name: &str) -> Result<WorkspaceCheckpoint, EngineError> {
        let leases = self.workspaces.meta(name)?.leases;
        let fence = leases.lease.as_ref().map(|l| (l.holder.clone(), l.epoch));
        let epoch = leases.lease.as_ref().map_or(leases.epoch, |l| l.epoch);
        let summary = self.snapshot_workspace_op(name, fence, None).await?;
        Ok(WorkspaceCheckpoint { snapshot_id: summary.id, epoch, at_ms: super::now_ms() })
    }
}
