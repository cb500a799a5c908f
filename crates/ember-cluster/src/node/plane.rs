//! [`ClusterPlane`]: the [`ControlPlane`] of a cluster node.
//!
//! A call naming a sandbox runs here if this node's engine holds it, else on
//! the node the sandbox registry names, if that node is live (its API's
//! `/v1/cluster/call`, see `forward.rs`). The local engine is asked first, so
//! a node always answers for its own sandboxes even when the registry lags,
//! and two nodes never forward one call to each other: the registry names one
//! node, which either holds the sandbox or answers `NotFound`. `list` merges
//! every live node's own list; `create` places on this node, or (API-only)
//! on a live node picked by best-of-two on free memory (a restore on the node
//! holding its snapshot's record, a sandbox with workspaces where they are;
//! sandbox snapshot records and workspaces are found by asking the nodes,
//! `elsewhere.rs`); a create naming a pool is a warm claim over NATS from a
//! node with an idle member, else placed cold (`claims.rs`). Pools and
//! templates are the cluster's desired state (`pools.rs`). Everything else
//! (workspace snapshots, images, tasks) is this node's own for now
//! (docs/cluster.md says what is not routed yet).
use super::fence::Fence;
use super::forward::Forwarder;
use super::owner::Owner;
use super::pools::Desired;
use super::registry::{NodeInfo, Nodes};
use super::{Buckets, NodeConfig};
use async_nats::jetstream::kv;
use ember_engine::pool::plan::Target;
use ember_engine::pool::{CreatePool, PoolStatus};
use ember_engine::tasks::TaskFilter;
use ember_engine::templates::Template;
use ember_engine::{
    AgentRoute, ControlPlane, CreateSandbox, EngineError, LaunchMode, ListFilter, NetworkStatus, NodeCall,
    SandboxRecord, SandboxSnapshotRecord, SnapshotFilter, SnapshotOp, WorkspaceCheckpoint, WorkspaceStatus,
};
use ember_image::{ImageRecord, LayerMeta, PruneReport, PullProgress};
use ember_snapshot::{GcReport, SnapshotSummary};
use ember_types::api::{NetworkPolicy, NetworkRule, RuntimeClassInfo};
use ember_types::image::{RegistryAuth, TemplateRequest};
use ember_types::task::{SubmitTaskRequest, TaskRecord};
use ember_types::{BoundaryReport, DeniedFlow, EgressPolicy};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct ClusterPlane {
    pub(super) cfg: NodeConfig,
    pub(super) local: Arc<dyn ControlPlane>,
    pub(super) sandboxes: kv::Store,
    /// `<prefix>_workspaces` (`workspaces.rs`).
    pub(super) workspaces: kv::Store,
    /// `<prefix>_rebind` (`rebind.rs`).
    pub(super) rebind: kv::Store,
    /// `rebind` as this node's watch keeps it (the sweep reads it).
    pub(super) rebind_seen: Arc<super::mirror::Mirror>,
    pub(super) fence: Fence,
    pub(super) nodes: Arc<Nodes>,
    pub(super) fwd: Forwarder,
    /// What this node last wrote to the sandbox registry: id → state.
    pub(super) published: Mutex<HashMap<String, String>>,
    /// Sandboxes this node holds, as its last reconcile counted.
    pub(super) held: std::sync::atomic::AtomicU64,
    /// Templates and pools as the cluster's desired state (`pools.rs`).
    pub(super) desired: Desired,
    /// Core NATS: warm claims (`claims.rs`).
    pub(super) nats: async_nats::Client,
    /// Orders this node's workspace checkpoints (`workspaces.rs`).
    pub(super) checkpoints: super::workspaces::CheckpointClock,
    /// The standbys kept for other nodes' rebind sandboxes (`standby.rs`).
    pub(super) standbys: super::standby::Standbys,
}

/// Runs a sandbox call where the sandbox is: `$local` here, `$call` forwarded.
macro_rules! routed {
    ($self:ident, $id:expr, $local:expr, $call:expr) => {
        match $self.owner($id).await? {
            Owner::Here => $local.await,
            Owner::Node(n) => $self.fwd.call(&n.name, &n.advertise, &$call).await,
        }
    };
}

impl ClusterPlane {
    pub(super) fn new(
        cfg: NodeConfig,
        local: Arc<dyn ControlPlane>,
        buckets: Buckets,
        nats: async_nats::Client,
    ) -> ClusterPlane {
        let nodes = Arc::new(Nodes::new(cfg.name.clone()));
        let fwd = Forwarder::new(cfg.api_key.clone(), nodes.clone());
        let Buckets { sandboxes, workspaces, rebind, pools, templates } = buckets;
        let desired = Desired::new(pools, templates);
        let fence = Fence::new(cfg.rebinds_at_once, cfg.recovery.clone());
        let cfg_standbys = cfg.rebind_standbys;
        ClusterPlane {
            cfg,
            local,
            sandboxes,
            workspaces,
            rebind_seen: super::mirror::Mirror::spawn(rebind.clone()),
            rebind,
            fence,
            nodes,
            fwd,
            published: Mutex::default(),
            held: Default::default(),
            desired,
            nats,
            checkpoints: super::workspaces::CheckpointClock::new(),
            standbys: super::standby::Standbys::new(cfg_standbys),
        }
    }

    pub(super) fn nodes(&self) -> Arc<Nodes> {
        self.nodes.clone()
    }

    /// The live nodes of the cluster, this one included once it has beaten.
    pub fn live_nodes(&self) -> Vec<NodeInfo> {
        self.nodes.live()
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    pub(super) fn checkpoint_every(&self) -> Duration {
        self.cfg.checkpoint_every
    }

    pub(super) fn api_only(&self) -> bool {
        self.cfg.api_only
    }

    pub(super) fn local(&self) -> &Arc<dyn ControlPlane> {
        &self.local
    }

    /// The live nodes that run sandboxes, this one left out.
    pub(super) fn other_nodes(&self) -> Vec<NodeInfo> {
        self.nodes.live().into_iter().filter(|n| !n.api_only && n.name != self.cfg.name).collect()
    }

    /// Runs `call` on node `n`.
    pub(super) async fn forward<T: serde::de::DeserializeOwned>(
        &self,
        n: &NodeInfo,
        call: &NodeCall,
    ) -> Result<T, EngineError> {
        self.fwd.call(&n.name, &n.advertise, call).await
    }

    /// Every live node's own list (this one's from its engine), merged in
    /// creation order. A live node that cannot answer fails the list: a
    /// partial list is never passed off as the whole.
    async fn merged(&self, f: &ListFilter) -> Result<Vec<SandboxRecord>, EngineError> {
        let call = NodeCall::list(f);
        let remote = self.other_nodes().into_iter().map(|n| {
            let call = &call;
            async move { self.forward::<Vec<SandboxRecord>>(&n, call).await }
        });
        let mine = async {
            match self.cfg.api_only {
                true => Ok(Vec::new()),
                false => self.local.list(f).await,
            }
        };
        let (mine, theirs) = tokio::join!(mine, futures_util::future::try_join_all(remote));
        let mut all = mine?;
        all.extend(theirs?.into_iter().flatten());
        all.sort_by(|a, b| (a.created_at_ms, a.id.as_str()).cmp(&(b.created_at_ms, b.id.as_str())));
        Ok(all)
    }
}

impl ClusterPlane {
    /// A create on this node's engine, recorded in the sandbox registry.
    /// A rebind sandbox's request is kept for its rebind (`rebind.rs`); the
    /// new workspaces it names are claimed cluster-wide first.
    async fn create_here(&self, req: CreateSandbox) -> Result<SandboxRecord, EngineError> {
        let claimed = self.claim_new_workspaces(&req).await?;
        let rebind = req.rebind.then(|| req.clone());
        let rec = match self.local.create(req).await {
            Ok(rec) => rec,
            Err(e) => {
                for name in claimed {
                    self.unclaim_workspace(&name).await;
                }
                return Err(e);
            }
        };
        if let Some(req) = rebind {
            // Without its entry no node could rebind it: the create fails.
            if let Err(e) = self.record_rebind(rec.id.as_str(), &req).await {
                let _ = self.local.remove(rec.id.as_str()).await;
                return Err(e);
            }
        }
        // The sandbox exists: a registry that takes no write now (an
        // election) gets it from the next reconcile, not the client an error.
        if let Err(e) = self.publish(rec.id.as_str(), rec.state.to_string()).await {
            tracing::warn!(error = %e, "sandbox registry after a create; the reconciler retries");
        }
        Ok(rec)
    }
}

impl ClusterPlane {
    /// Secrets never cross the wire (`CreateSandbox::secrets` is not
    /// serialized), so a create carrying them runs here or is refused, never
    /// forwarded and started without them.
    async fn create_with_secrets(&self, req: CreateSandbox) -> Result<SandboxRecord, EngineError> {
        if self.cfg.api_only || self.pinned(&req).await?.is_some() {
            return Err(EngineError::invalid(
                "secrets",
                "a create with secrets runs on the node that receives it: send it to a node that runs sandboxes \
                 (and holds the request's workspaces or snapshot)",
            ));
        }
        self.create_here(req).await
    }
}

pub(super) fn registry_error(op: &str, id: &str, e: &dyn std::fmt::Display) -> EngineError {
    EngineError::Internal(format!("sandbox registry: {op} {id}: {e}"))
}

#[async_trait::async_trait]
impl ControlPlane for ClusterPlane {
    async fn create(&self, req: CreateSandbox) -> Result<SandboxRecord, EngineError> {
        if !req.secrets.is_empty() {
            return self.create_with_secrets(req).await;
        }
        // A restore runs where the snapshot's record is, a sandbox with
        // workspaces where they are.
        if let Some(n) = self.pinned(&req).await? {
            return self.forward(&n, &NodeCall::Create { req: Box::new(req) }).await;
        }
        // A pool named: a warm claim from whichever node has an idle
        // member, else a cold create placed on the cluster (`claims.rs`).
        // With workspaces the claim stays where they are (`pinned`, above:
        // that node's own pool).
        let free = req.workspaces.is_empty() && req.snapshot_id.is_none();
        if let (Some(pool), LaunchMode::Any, true) = (req.pool.clone(), req.launch, free) {
            // A pool this node's watch has seen exists: no read on the claim's
            // path (a read of the bucket was a sixth of a cluster claim's
            // time). One it has not seen may have just been created through
            // another node: read the bucket (a 404 if it has no such pool).
            if !self.desired.knows_pool(&pool) {
                let check = self.cluster_pool_status(&pool);
                tracing::Instrument::instrument(check, tracing::info_span!("pool_check", pool = %pool)).await?;
            }
            if let Some(rec) = self.claim_anywhere(&pool, &req).await? {
                return Ok(rec);
            }
            let req = CreateSandbox { launch: LaunchMode::Cold, ..req };
            let n = self.place()?;
            if n.name != self.cfg.name {
                return self.forward(&n, &NodeCall::Create { req: Box::new(req) }).await;
            }
            return self.create_here(req).await;
        }
        if self.cfg.api_only {
            let n = self.place()?;
            return self.fwd.call(&n.name, &n.advertise, &NodeCall::Create { req: Box::new(req) }).await;
        }
        self.create_here(req).await
    }
    async fn get(&self, id: &str) -> Result<SandboxRecord, EngineError> {
        routed!(self, id, self.local.get(id), NodeCall::Get { id: id.into() })
    }
    async fn list(&self, f: &ListFilter) -> Result<Vec<SandboxRecord>, EngineError> {
        self.merged(f).await
    }
    fn renewed_ms_ago(&self) -> Option<u64> {
        self.fence.renewed_ago().map(|d| d.as_millis() as u64)
    }

    fn node_local(&self) -> Option<Arc<dyn ControlPlane>> {
        Some(self.local.clone())
    }
    async fn remove(&self, id: &str) -> Result<(), EngineError> {
        match self.owner(id).await? {
            Owner::Here => {
                self.local.remove(id).await?;
                self.forget_rebind(id).await;
                // As after a create: the reconciler deletes what this missed.
                if let Err(e) = self.unpublish(id).await {
                    tracing::warn!(error = %e, "sandbox registry after a remove; the reconciler retries");
                }
                Ok(())
            }
            Owner::Node(n) => self.fwd.call(&n.name, &n.advertise, &NodeCall::Remove { id: id.into() }).await,
        }
    }
    async fn pause(&self, id: &str) -> Result<(), EngineError> {
        routed!(self, id, self.local.pause(id), NodeCall::Pause { id: id.into() })
    }
    async fn resume(&self, id: &str) -> Result<(), EngineError> {
        routed!(self, id, self.local.resume(id), NodeCall::Resume { id: id.into() })
    }
    async fn checkpoint(&self, id: &str) -> Result<(), EngineError> {
        routed!(self, id, self.local.checkpoint(id), NodeCall::Checkpoint { id: id.into() })
    }
    async fn renew(&self, id: &str, expires_at_ms: i64) -> Result<SandboxRecord, EngineError> {
        routed!(self, id, self.local.renew(id, expires_at_ms), NodeCall::Renew { id: id.into(), expires_at_ms })
    }
    async fn patch_metadata(
        &self,
        id: &str,
        patch: BTreeMap<String, Option<String>>,
    ) -> Result<SandboxRecord, EngineError> {
        let call = NodeCall::PatchMetadata { id: id.into(), patch: patch.clone() };
        routed!(self, id, self.local.patch_metadata(id, patch), call)
    }
    async fn boundary(&self, id: &str) -> Result<BoundaryReport, EngineError> {
        routed!(self, id, self.local.boundary(id), NodeCall::Boundary { id: id.into() })
    }
    async fn stats(&self, id: &str) -> Result<ember_types::SandboxStats, EngineError> {
        routed!(self, id, self.local.stats(id), NodeCall::Stats { id: id.into() })
    }
    async fn agent_log(&self, id: &str, max: u64) -> Result<(String, bool), EngineError> {
        routed!(self, id, self.local.agent_log(id, max), NodeCall::AgentLog { id: id.into(), max })
    }
    async fn agent_route(&self, id: &str) -> Result<AgentRoute, EngineError> {
        match self.owner(id).await? {
            // Frozen because this node cannot renew: the sandbox may come
            // back here (renewed) or elsewhere (rebound), so the client is
            // told to retry, not that the sandbox is paused.
            Owner::Here if self.fence.is_frozen(id) => Err(EngineError::NodeUnavailable {
                node: self.cfg.name.clone(),
                reason: format!("sandbox {id} is frozen: this node cannot renew its place in the cluster"),
            }),
            Owner::Here => self.local.agent_route(id).await,
            Owner::Node(n) => {
                Ok(AgentRoute::Remote { node: n.name, base_url: n.advertise, api_key: self.fwd.api_key() })
            }
        }
    }

    async fn egress_policy(&self, id: &str) -> Result<NetworkPolicy, EngineError> {
        routed!(self, id, self.local.egress_policy(id), NodeCall::EgressPolicy { id: id.into() })
    }
    async fn patch_egress(&self, id: &str, rules: Vec<NetworkRule>) -> Result<NetworkPolicy, EngineError> {
        let call = NodeCall::PatchEgress { id: id.into(), rules: rules.clone() };
        routed!(self, id, self.local.patch_egress(id, rules), call)
    }
    async fn delete_egress(&self, id: &str, targets: Vec<String>) -> Result<NetworkPolicy, EngineError> {
        let call = NodeCall::DeleteEgress { id: id.into(), targets: targets.clone() };
        routed!(self, id, self.local.delete_egress(id, targets), call)
    }
    async fn egress_enforced(&self, id: &str) -> Result<bool, EngineError> {
        routed!(self, id, self.local.egress_enforced(id), NodeCall::EgressEnforced { id: id.into() })
    }

    async fn network_status(&self, id: &str) -> Result<NetworkStatus, EngineError> {
        let call = NodeCall::NetworkStatus { id: id.into() };
        routed!(self, id, self.local.network_status(id), call)
    }
    async fn set_network_policy(&self, id: &str, policy: EgressPolicy) -> Result<NetworkStatus, EngineError> {
        let call = NodeCall::SetNetworkPolicy { id: id.into(), policy: policy.clone() };
        routed!(self, id, self.local.set_network_policy(id, policy), call)
    }
    async fn network_events(&self, id: &str) -> Result<Vec<DeniedFlow>, EngineError> {
        routed!(self, id, self.local.network_events(id), NodeCall::NetworkEvents { id: id.into() })
    }
    fn network_range(&self) -> Option<String> {
        self.local.network_range()
    }
    fn network_stats(&self) -> Option<ember_net::NetStats> {
        self.local.network_stats()
    }

    // Pools and templates: the cluster's desired state (`pools.rs`).
    async fn create_pool(&self, req: CreatePool) -> Result<PoolStatus, EngineError> {
        self.create_cluster_pool(req).await
    }
    async fn list_pools(&self) -> Result<Vec<PoolStatus>, EngineError> {
        self.cluster_pools().await
    }
    async fn pool_status(&self, name: &str) -> Result<PoolStatus, EngineError> {
        self.cluster_pool_status(name).await
    }
    async fn resize_pool(
        &self,
        name: &str,
        min: Option<u32>,
        max: Option<u32>,
        target: Option<Target>,
    ) -> Result<PoolStatus, EngineError> {
        self.resize_cluster_pool(name, min, max, target).await
    }
    async fn remove_pool(&self, name: &str) -> Result<(), EngineError> {
        self.remove_cluster_pool(name).await
    }
    async fn create_workspace(&self, name: String, size_bytes: u64) -> Result<WorkspaceStatus, EngineError> {
        // Names are cluster-unique: one on another node is this name taken.
        if self.find_workspace(&name).await.is_ok() {
            return Err(EngineError::Workspace(ember_workspace::WorkspaceError::Exists(name)));
        }
        let n = match self.cfg.api_only {
            true => Some(self.place()?),
            false => None,
        };
        // One winner cluster-wide: two nodes creating one name at once both
        // pass the check above.
        self.claim_workspace(&name, size_bytes, n.as_ref().map_or(self.name(), |n| n.name.as_str())).await?;
        let made = match &n {
            Some(n) => self.forward(n, &NodeCall::CreateWorkspace { name: name.clone(), size_bytes }).await,
            None => self.local.create_workspace(name.clone(), size_bytes).await,
        };
        if made.is_err() {
            self.unclaim_workspace(&name).await;
        }
        made
    }
    async fn list_workspaces(&self) -> Result<Vec<WorkspaceStatus>, EngineError> {
        self.all_workspaces().await
    }
    async fn workspace(&self, name: &str) -> Result<WorkspaceStatus, EngineError> {
        Ok(self.find_workspace(name).await?.1)
    }
    async fn remove_workspace(&self, name: &str) -> Result<(), EngineError> {
        self.remove_workspace_anywhere(name).await?;
        self.unclaim_workspace(name).await;
        Ok(())
    }
    async fn checkpoint_workspace(&self, name: &str) -> Result<WorkspaceCheckpoint, EngineError> {
        self.checkpoint_held(name).await
    }
    async fn snapshot_workspace_op(
        &self,
        name: &str,
        fence: Option<(String, u64)>,
        op: Option<String>,
    ) -> Result<SnapshotSummary, EngineError> {
        self.local.snapshot_workspace_op(name, fence, op).await
    }
    async fn list_snapshots(&self, workspace: Option<String>) -> Result<Vec<SnapshotSummary>, EngineError> {
        self.local.list_snapshots(workspace).await
    }
    async fn inspect_snapshot(&self, id: &str) -> Result<SnapshotSummary, EngineError> {
        self.local.inspect_snapshot(id).await
    }
    async fn delete_snapshot(&self, id: &str) -> Result<(), EngineError> {
        self.local.delete_snapshot(id).await
    }
    async fn restore_workspace_op(
        &self,
        id: &str,
        name: &str,
        size: Option<u64>,
        op: Option<String>,
    ) -> Result<WorkspaceStatus, EngineError> {
        self.local.restore_workspace_op(id, name, size, op).await
    }
    async fn fork_snapshot_op(
        &self,
        id: &str,
        count: u32,
        prefix: &str,
        op: Option<String>,
    ) -> Result<Vec<WorkspaceStatus>, EngineError> {
        self.local.fork_snapshot_op(id, count, prefix, op).await
    }
    async fn snapshot_ops(&self) -> Result<Vec<SnapshotOp>, EngineError> {
        self.local.snapshot_ops().await
    }
    async fn snapshot_op(&self, id: &str) -> Result<SnapshotOp, EngineError> {
        self.local.snapshot_op(id).await
    }
    async fn gc_snapshots(&self, min_age: Option<Duration>) -> Result<GcReport, EngineError> {
        self.local.gc_snapshots(min_age).await
    }
    async fn snapshot_sandbox(&self, id: &str, name: Option<String>) -> Result<SandboxSnapshotRecord, EngineError> {
        let call = NodeCall::SnapshotSandbox { id: id.into(), name: name.clone() };
        routed!(self, id, self.local.snapshot_sandbox(id, name), call)
    }
    async fn sandbox_snapshot(&self, id: &str) -> Result<SandboxSnapshotRecord, EngineError> {
        Ok(self.find_snapshot(id).await?.1)
    }
    async fn delete_sandbox_snapshot(&self, id: &str) -> Result<(), EngineError> {
        self.delete_snapshot_anywhere(id).await
    }
    async fn list_sandbox_snapshots(&self, f: &SnapshotFilter) -> Result<Vec<SandboxSnapshotRecord>, EngineError> {
        self.all_snapshots(f).await
    }
    async fn list_images(&self) -> Result<Vec<ImageRecord>, EngineError> {
        self.local.list_images().await
    }
    async fn image_layers(&self) -> Result<Vec<(LayerMeta, usize)>, EngineError> {
        self.local.image_layers().await
    }
    async fn image(&self, reference: &str) -> Result<ImageRecord, EngineError> {
        self.local.image(reference).await
    }
    async fn remove_image(&self, reference: &str) -> Result<ImageRecord, EngineError> {
        self.local.remove_image(reference).await
    }
    async fn pull_image(&self, reference: &str, auth: Option<RegistryAuth>) -> Result<ImageRecord, EngineError> {
        self.local.pull_image(reference, auth).await
    }
    async fn image_pulls(&self) -> Result<Vec<PullProgress>, EngineError> {
        self.local.image_pulls().await
    }
    fn image_upload_path(&self) -> PathBuf {
        self.local.image_upload_path()
    }
    async fn import_image(&self, name: &str, tar: PathBuf) -> Result<ImageRecord, EngineError> {
        self.local.import_image(name, tar).await
    }
    async fn prune_images(&self) -> Result<PruneReport, EngineError> {
        self.local.prune_images().await
    }
    async fn create_template(&self, req: TemplateRequest) -> Result<Template, EngineError> {
        self.create_cluster_template(req).await
    }
    async fn templates(&self) -> Result<Vec<Template>, EngineError> {
        self.local.templates().await
    }
    async fn template(&self, name: &str) -> Result<Template, EngineError> {
        self.local.template(name).await
    }
    async fn delete_template(&self, name: &str) -> Result<(), EngineError> {
        self.delete_cluster_template(name).await
    }
    async fn submit_task(&self, req: SubmitTaskRequest) -> Result<(TaskRecord, bool), EngineError> {
        self.local.submit_task(req).await
    }
    async fn list_tasks(&self, f: &TaskFilter) -> Result<Vec<TaskRecord>, EngineError> {
        self.local.list_tasks(f).await
    }
    async fn task(&self, id: &str) -> Result<TaskRecord, EngineError> {
        self.local.task(id).await
    }
    async fn cancel_task(&self, id: &str) -> Result<TaskRecord, EngineError> {
        self.local.cancel_task(id).await
    }
    async fn task_log(&self, id: &str, attempt: Option<u32>, offset: u64) -> Result<(Vec<u8>, bool, u32), EngineError> {
        self.routed_task_log(id, attempt, offset).await
    }
    fn runtime_classes(&self) -> Vec<RuntimeClassInfo> {
        self.local.runtime_classes()
    }
    async fn audit_elsewhere(
        &self,
        tenant: Option<&str>,
        since_ms: i64,
    ) -> Result<Vec<ember_types::tenant::AuditRecord>, EngineError> {
        self.audits(tenant, since_ms).await
    }
    fn cluster_nodes(&self) -> Vec<ember_engine::NodeView> {
        let view = |(n, alive, silent): (NodeInfo, bool, std::time::Duration)| ember_engine::NodeView {
            idle_members: n.pools.values().map(|p| u64::from(p.idle)).sum(),
            name: n.name,
            advertise: n.advertise,
            api_only: n.api_only,
            alive,
            silent_ms: silent.as_millis() as u64,
            free_memory_bytes: n.free_memory_bytes,
            sandboxes: n.sandboxes,
        };
        self.nodes.all().into_iter().map(view).collect()
    }
    fn metrics_text(&self) -> String {
        let fence = &self.fence;
        super::metrics::with_nodes(
            self.local.metrics_text(),
            &self.live_nodes(),
            fence.rebinds_run(),
            fence.renewed_ago(),
            self.standbys.held.load(std::sync::atomic::Ordering::Relaxed),
        )
    }
    fn observe_exec(&self, took: std::time::Duration) {
        self.local.observe_exec(took)
    }
}
