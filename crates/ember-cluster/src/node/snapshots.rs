//! Sandbox snapshot records (OpenSandbox `/v1/snapshots`) across nodes. A
//! record lives on the node of the sandbox it was taken from, and no
//! registry names it: a lookup asks this node, then every other live node
//! at once, and takes the one that has it. A restore (a create with a
//! `snapshotId`) runs on that node, where the record is.
use super::plane::ClusterPlane;
use super::registry::NodeInfo;
use ember_engine::{EngineError, NodeCall, SandboxSnapshotRecord, SnapshotFilter};

/// Where a sandbox snapshot's record is.
pub(crate) enum Holder {
    Here,
    Node(NodeInfo),
}

impl ClusterPlane {
    /// The node holding snapshot `id`'s record, and the record.
    pub(crate) async fn find_snapshot(&self, id: &str) -> Result<(Holder, SandboxSnapshotRecord), EngineError> {
        if !self.api_only() {
            match self.local().sandbox_snapshot(id).await {
                Ok(r) => return Ok((Holder::Here, r)),
                Err(EngineError::SandboxSnapshotNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let call = NodeCall::SandboxSnapshot { id: id.into() };
        let asks = self.other_nodes().into_iter().map(|n| {
            let call = &call;
            async move { (self.forward::<SandboxSnapshotRecord>(&n, call).await, n) }
        });
        let mut found = None;
        for (answer, n) in futures_util::future::join_all(asks).await {
            match answer {
                Ok(r) => found = Some((Holder::Node(n), r)),
                Err(EngineError::SandboxSnapshotNotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        found.ok_or_else(|| EngineError::SandboxSnapshotNotFound(id.to_string()))
    }

    pub(crate) async fn delete_snapshot_anywhere(&self, id: &str) -> Result<(), EngineError> {
        match self.find_snapshot(id).await?.0 {
            Holder::Here => self.local().delete_sandbox_snapshot(id).await,
            Holder::Node(n) => self.forward(&n, &NodeCall::DeleteSandboxSnapshot { id: id.into() }).await,
        }
    }

    /// Every live node's records matching `f`, oldest first (then by id).
    pub(crate) async fn all_snapshots(&self, f: &SnapshotFilter) -> Result<Vec<SandboxSnapshotRecord>, EngineError> {
        let call = NodeCall::list_snapshots(f);
        let remote = self.other_nodes().into_iter().map(|n| {
            let call = &call;
            async move { self.forward::<Vec<SandboxSnapshotRecord>>(&n, call).await }
        });
        let mine = async {
            match self.api_only() {
                true => Ok(Vec::new()),
                false => self.local().list_sandbox_snapshots(f).await,
            }
        };
        let (mine, theirs) = tokio::join!(mine, futures_util::future::try_join_all(remote));
        let mut all = mine?;
        all.extend(theirs?.into_iter().flatten());
        all.sort_by(|a, b| (a.created_at_ms, a.id.as_str()).cmp(&(b.created_at_ms, b.id.as_str())));
        Ok(all)
    }
}
