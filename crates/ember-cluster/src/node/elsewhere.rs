//! Things a node holds that no registry names: sandbox snapshot records
//! (OpenSandbox `/v1/snapshots`, on the node of the sandbox they were taken
//! from) and workspaces (a loop-mounted image on one node). A lookup asks
//! this node, then every other live node at once, and takes the one that has
//! it; a list merges every live node's. A restore (a create with a
//! `snapshotId`) runs where the record is, a create with workspaces where
//! the first existing one is.
use super::plane::ClusterPlane;
use super::registry::NodeInfo;
use ember_engine::{CreateSandbox, EngineError, NodeCall, SandboxSnapshotRecord, SnapshotFilter, WorkspaceStatus};
use serde::de::DeserializeOwned;

/// Where a snapshot record or a workspace is.
pub(crate) enum Holder {
    Here,
    Node(NodeInfo),
}

fn snapshot_missing(e: &EngineError) -> bool {
    matches!(e, EngineError::SandboxSnapshotNotFound(_))
}

fn workspace_missing(e: &EngineError) -> bool {
    matches!(e, EngineError::Workspace(ember_workspace::WorkspaceError::NotFound(_)))
}

impl ClusterPlane {
    /// The first other live node that answers `call` (one that answers
    /// `missing` has none); an error of any other kind fails the lookup.
    async fn ask_others<T: DeserializeOwned>(
        &self,
        call: &NodeCall,
        missing: fn(&EngineError) -> bool,
    ) -> Result<Option<(NodeInfo, T)>, EngineError> {
        let asks = self.other_nodes().into_iter().map(|n| async move { (self.forward::<T>(&n, call).await, n) });
        let mut found = None;
        for (answer, n) in futures_util::future::join_all(asks).await {
            match answer {
                Ok(v) => found = Some((n, v)),
                Err(e) if missing(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(found)
    }

    /// Every other live node's answer to `call` (a list), flattened.
    async fn gather<T: DeserializeOwned>(&self, call: &NodeCall) -> Result<Vec<T>, EngineError> {
        let asks = self.other_nodes().into_iter().map(|n| async move { self.forward::<Vec<T>>(&n, call).await });
        Ok(futures_util::future::try_join_all(asks).await?.into_iter().flatten().collect())
    }

    /// Every other live node's audit records, API-only nodes included (each
    /// node logs the calls it received); a live node that does not answer
    /// fails the query (503, retried), rather than leave its records out.
    pub(crate) async fn audits(
        &self,
        tenant: Option<&str>,
        since_ms: i64,
    ) -> Result<Vec<ember_types::tenant::AuditRecord>, EngineError> {
        let call = NodeCall::Audit { tenant: tenant.map(String::from), since_ms };
        let others = self.nodes().live().into_iter().filter(|n| n.name != self.name());
        let asks = others.map(|n| {
            let call = &call;
            async move { self.forward::<Vec<ember_types::tenant::AuditRecord>>(&n, call).await }
        });
        Ok(futures_util::future::try_join_all(asks).await?.into_iter().flatten().collect())
    }

    /// The node holding snapshot `id`'s record, and the record.
    pub(crate) async fn find_snapshot(&self, id: &str) -> Result<(Holder, SandboxSnapshotRecord), EngineError> {
        if !self.api_only() {
            match self.local().sandbox_snapshot(id).await {
                Ok(r) => return Ok((Holder::Here, r)),
                Err(e) if snapshot_missing(&e) => {}
                Err(e) => return Err(e),
            }
        }
        match self.ask_others(&NodeCall::SandboxSnapshot { id: id.into() }, snapshot_missing).await? {
            Some((n, r)) => Ok((Holder::Node(n), r)),
            None => Err(EngineError::SandboxSnapshotNotFound(id.to_string())),
        }
    }

    pub(crate) async fn delete_snapshot_anywhere(&self, id: &str) -> Result<(), EngineError> {
        match self.find_snapshot(id).await?.0 {
            Holder::Here => self.local().delete_sandbox_snapshot(id).await,
            Holder::Node(n) => self.forward(&n, &NodeCall::DeleteSandboxSnapshot { id: id.into() }).await,
        }
    }

    /// Every live node's records matching `f`, oldest first (then by id).
    pub(crate) async fn all_snapshots(&self, f: &SnapshotFilter) -> Result<Vec<SandboxSnapshotRecord>, EngineError> {
        let mut all = match self.api_only() {
            true => Vec::new(),
            false => self.local().list_sandbox_snapshots(f).await?,
        };
        all.extend(self.gather::<SandboxSnapshotRecord>(&NodeCall::list_snapshots(f)).await?);
        all.sort_by(|a, b| (a.created_at_ms, a.id.as_str()).cmp(&(b.created_at_ms, b.id.as_str())));
        Ok(all)
    }

    /// The node holding workspace `name`, and its status.
    pub(crate) async fn find_workspace(&self, name: &str) -> Result<(Holder, WorkspaceStatus), EngineError> {
        if !self.api_only() {
            match self.local().workspace(name).await {
                Ok(w) => return Ok((Holder::Here, w)),
                Err(e) if workspace_missing(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let call = NodeCall::Workspace { name: name.into() };
        match self.ask_others::<WorkspaceStatus>(&call, workspace_missing).await? {
            Some((n, w)) => Ok((Holder::Node(n), w)),
            None => Err(EngineError::Workspace(ember_workspace::WorkspaceError::NotFound(name.to_string()))),
        }
    }

    pub(crate) async fn remove_workspace_anywhere(&self, name: &str) -> Result<(), EngineError> {
        match self.find_workspace(name).await?.0 {
            Holder::Here => self.local().remove_workspace(name).await,
            Holder::Node(n) => self.forward(&n, &NodeCall::RemoveWorkspace { name: name.into() }).await,
        }
    }

    /// Every live node's workspaces, by name.
    pub(crate) async fn all_workspaces(&self) -> Result<Vec<WorkspaceStatus>, EngineError> {
        let mut all = match self.api_only() {
            true => Vec::new(),
            false => self.local().list_workspaces().await?,
        };
        let theirs = self.gather::<WorkspaceStatus>(&NodeCall::ListWorkspaces).await?;
        all.extend(theirs);
        all.sort_by(|a, b| a.meta.name.cmp(&b.meta.name));
        Ok(all)
    }

    /// Where a create must run because of what it names: the node holding
    /// its snapshot's record, or its first existing workspace. `None`: no
    /// such constraint (or it is here).
    pub(crate) async fn pinned(&self, req: &CreateSandbox) -> Result<Option<NodeInfo>, EngineError> {
        if let Some(snapshot) = &req.snapshot_id {
            return Ok(match self.find_snapshot(snapshot).await?.0 {
                Holder::Node(n) => Some(n),
                Holder::Here => None,
            });
        }
        for w in &req.workspaces {
            match self.find_workspace(&w.name).await {
                Ok((Holder::Node(n), _)) => return Ok(Some(n)),
                Ok((Holder::Here, _)) => return Ok(None),
                Err(e) if workspace_missing(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }
}
