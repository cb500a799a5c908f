//! The seam between the HTTP API and whatever serves it: [`ControlPlane`] is
//! every call `ember-api` makes, and the only way it reaches the engine.
//!
//! Today one implementation exists: this node's [`Engine`](crate::Engine)
//! (`seam/local.rs`, on `Arc<Engine>` because the engine's spawning calls
//! take `self: &Arc<Self>`). A cluster implementation sits in the same place
//! and routes a call about a sandbox (or a pool, a workspace, a task) to the
//! node that holds it; each method says what such an implementation must
//! guarantee. Every call that may have to cross the network is `async` and
//! can fail (a list too: a cluster must not pass off a partial list as the
//! whole); the few sync ones are answers about this node alone.
//!
//! The values that cross the seam are the engine's plain data types (records,
//! filters, [`EngineError`]): a remote implementation carries them as they are
//! and maps a transport failure onto an `EngineError` the API already renders.
use crate::pool::plan::Target;
use crate::pool::{CreatePool, PoolStatus};
use crate::tasks::TaskFilter;
use crate::templates::Template;
use crate::{
    CreateSandbox, EngineError, ListFilter, NetworkStatus, SandboxRecord, SandboxSnapshotRecord, SnapshotFilter,
    SnapshotOp, WorkspaceStatus,
};
use ember_image::{ImageRecord, LayerMeta, PruneReport, PullProgress};
use ember_snapshot::{GcReport, SnapshotSummary};
use ember_types::api::{NetworkPolicy, NetworkRule, RuntimeClassInfo};
use ember_types::image::{RegistryAuth, TemplateRequest};
use ember_types::task::{SubmitTaskRequest, TaskRecord};
use ember_types::{BoundaryReport, DeniedFlow, EgressPolicy};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

mod local;
mod wire;

pub use wire::{Liveness, NodeCall, TaskLogWire};

/// Where the agent proxy sends a sandbox's traffic. One enum so the proxy has
/// one `match` to extend: the cluster adds a variant for a sandbox on another
/// node (forward the request to that node's API) beside this one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentRoute {
    /// The agent listens on this host. The path is one the sandbox can write
    /// (root inside may swap it for a symlink): connect only through
    /// [`connect_agent`](crate::connect_agent), which pins it `O_PATH | O_NOFOLLOW`.
    Local { socket: PathBuf },
    /// The sandbox runs on another node of the cluster: forward the request
    /// to that node's own proxy route (`{base_url}/v1/sandboxes/{id}/proxy/...`)
    /// with the cluster's API key, which every node of a cluster shares.
    Remote { node: String, base_url: String, api_key: Option<String> },
}

/// Everything the API asks of the control plane. Object safe (`Arc<dyn
/// ControlPlane>` is the API's state), `Send + Sync`, errors are
/// [`EngineError`]s so `ember-api/src/error.rs` stays the one place they
/// become HTTP.
///
/// Sandbox ids are cluster-unique; "the sandbox's node" below is the node
/// whose engine holds its record. Idle pool members are invisible to every
/// sandbox call (`NotFound`), as on one node.
/// One cluster node as this node sees it: what its last heartbeat said and
/// whether it is live by this node's judgement.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub name: String,
    /// `http://host:port` of its API.
    pub advertise: String,
    /// Runs no sandboxes.
    pub api_only: bool,
    pub alive: bool,
    /// How long it had been silent at this node's last beat, ms.
    pub silent_ms: u64,
    /// The host's available memory, bytes: its capacity for new sandboxes.
    pub free_memory_bytes: u64,
    /// Sandboxes it holds, as its heartbeat says.
    pub sandboxes: u64,
    /// Idle pool members among them.
    pub idle_members: u64,
}

#[async_trait::async_trait]
pub trait ControlPlane: Send + Sync {
    // ---- Sandbox lifecycle -------------------------------------------------
    // Every call with an id runs on the sandbox's node; an id no node holds is
    // `NotFound`, exactly as an unknown id on one node.

    /// Creates a sandbox (cold, warm from a pool, or from a sandbox snapshot).
    /// Cluster: picks the node (placement) and creates it there; the record
    /// returned is that node's, and later calls with its id reach that node.
    async fn create(&self, req: CreateSandbox) -> Result<SandboxRecord, EngineError>;

    /// One sandbox's record. Cluster: the holding node's current record.
    async fn get(&self, id: &str) -> Result<SandboxRecord, EngineError>;

    /// Sandboxes matching `f` (idle pool members never), oldest first
    /// (creation time, then id). Cluster: the whole cluster, merged in that
    /// order (the API pages the result).
    async fn list(&self, f: &ListFilter) -> Result<Vec<SandboxRecord>, EngineError>;

    /// This node's own plane, when `self` routes between nodes (a cluster's):
    /// a call forwarded from another node runs there, so it is never
    /// forwarded again. `None` (the default) when `self` is already that.
    fn node_local(&self) -> Option<std::sync::Arc<dyn ControlPlane>> {
        None
    }

    /// How long ago this node's heartbeat last got through to the cluster's
    /// registry, in ms: another node asks before it rebinds this one's
    /// sandboxes (`NodeCall::Liveness`). `None` (the default) off a cluster,
    /// or before the first heartbeat got through.
    fn renewed_ms_ago(&self) -> Option<u64> {
        None
    }

    /// The audit records of every other live node of the cluster (each node
    /// appends the calls it received to its own log), of `tenant` (all
    /// without one) from `since_ms` on. Empty (the default) off a cluster.
    async fn audit_elsewhere(
        &self,
        _tenant: Option<&str>,
        _since_ms: i64,
    ) -> Result<Vec<ember_types::tenant::AuditRecord>, EngineError> {
        Ok(Vec::new())
    }

    /// Every node this node has heard a heartbeat from, live or not, by name
    /// (the dashboard's node list). Empty (the default) off a cluster.
    fn cluster_nodes(&self) -> Vec<NodeView> {
        Vec::new()
    }

    /// Launches a standby for rebind sandbox `req.id` on this node: its
    /// launch done ahead, idle and seen by no caller, which a create of that
    /// id (its rebind) claims rather than starting cold (`pool/standby.rs`).
    /// Node-local: a cluster's plane has none of its own (the default).
    async fn launch_standby(&self, req: CreateSandbox) -> Result<(), EngineError> {
        let id = req.id.map(|i| i.to_string()).unwrap_or_default();
        Err(EngineError::invalid("standby", format!("{id}: standbys are a node's own")))
    }

    /// The ids of this node's idle standbys (none by default).
    async fn standbys(&self) -> Vec<String> {
        Vec::new()
    }

    /// Removes idle standby `id` (`NotFound`: none here, the default).
    async fn remove_standby(&self, id: &str) -> Result<(), EngineError> {
        Err(EngineError::NotFound(id.to_string()))
    }

    /// Stops and removes a sandbox. Cluster: on its node; `NotFound` if none.
    async fn remove(&self, id: &str) -> Result<(), EngineError>;

    /// Freezes a running sandbox. Cluster: on its node.
    async fn pause(&self, id: &str) -> Result<(), EngineError>;

    /// Thaws a paused sandbox or restores a checkpointed one. Cluster: on the
    /// node that holds the checkpoint (a checkpoint does not move).
    async fn resume(&self, id: &str) -> Result<(), EngineError>;

    /// gVisor checkpoint to the sandbox's node's disk. Cluster: on its node.
    async fn checkpoint(&self, id: &str) -> Result<(), EngineError>;

    /// Sets the expiry (ms since the epoch). Cluster: on its node, whose
    /// monitor enforces it; returns that node's updated record.
    async fn renew(&self, id: &str, expires_at_ms: i64) -> Result<SandboxRecord, EngineError>;

    /// Sets (`Some`) or deletes (`None`) metadata keys, persisted before the
    /// answer. Cluster: on its node.
    async fn patch_metadata(
        &self,
        id: &str,
        patch: BTreeMap<String, Option<String>>,
    ) -> Result<SandboxRecord, EngineError>;

    /// What isolates the sandbox, read from its live processes. Cluster: on
    /// its node (only that kernel can answer).
    async fn boundary(&self, id: &str) -> Result<BoundaryReport, EngineError>;

    /// A live sandbox's cgroup figures (cpu, memory, pids, io) with their
    /// limits. Cluster: read on its node (only its kernel has them).
    async fn stats(&self, id: &str) -> Result<ember_types::SandboxStats, EngineError>;

    /// The tail of the agent's log, at most `max` bytes, and whether it was
    /// cut. Cluster: read on its node; the bound holds across the wire.
    async fn agent_log(&self, id: &str, max: u64) -> Result<(String, bool), EngineError>;

    /// Where to reach a running sandbox's agent (`NotRunning` otherwise).
    /// Cluster: `Local` only on the sandbox's own node, a remote route on any
    /// other; never a path of another host.
    async fn agent_route(&self, id: &str) -> Result<AgentRoute, EngineError>;

    // ---- Egress policy (the sandbox's port 18080) --------------------------
    // Answered by the daemon from the record, never by the sandbox. Cluster:
    // on the sandbox's node, which owns its nftables chains.

    async fn egress_policy(&self, id: &str) -> Result<NetworkPolicy, EngineError>;
    async fn patch_egress(&self, id: &str, rules: Vec<NetworkRule>) -> Result<NetworkPolicy, EngineError>;
    async fn delete_egress(&self, id: &str, targets: Vec<String>) -> Result<NetworkPolicy, EngineError>;
    /// Whether the policy is enforced (the sandbox has egress networking).
    async fn egress_enforced(&self, id: &str) -> Result<bool, EngineError>;

    // ---- Network ------------------------------------------------------------

    /// Mode, policy and address of one sandbox. Cluster: on its node.
    async fn network_status(&self, id: &str) -> Result<NetworkStatus, EngineError>;
    /// Replaces the policy; enforced before the answer. Cluster: on its node.
    async fn set_network_policy(&self, id: &str, policy: EgressPolicy) -> Result<NetworkStatus, EngineError>;
    /// Denied flows recorded for the sandbox. Cluster: its node's flow log.
    async fn network_events(&self, id: &str) -> Result<Vec<DeniedFlow>, EngineError>;
    /// This node's slot range (CIDR); `None` without egress networking. Node
    /// local by nature: each node has its own range.
    fn network_range(&self) -> Option<String>;
    /// This node's slot pool figures; `None` without egress networking.
    fn network_stats(&self) -> Option<ember_net::NetStats>;

    // ---- Warm pools ---------------------------------------------------------
    // Cluster: a pool is named cluster-wide; its members live on nodes the
    // implementation chooses, and the status is the sum over them.

    async fn create_pool(&self, req: CreatePool) -> Result<PoolStatus, EngineError>;
    /// Every pool, sorted by name. Cluster: every pool of the cluster, once.
    async fn list_pools(&self) -> Result<Vec<PoolStatus>, EngineError>;
    async fn pool_status(&self, name: &str) -> Result<PoolStatus, EngineError>;
    async fn resize_pool(
        &self,
        name: &str,
        min: Option<u32>,
        max: Option<u32>,
        target: Option<Target>,
    ) -> Result<PoolStatus, EngineError>;
    async fn remove_pool(&self, name: &str) -> Result<(), EngineError>;

    // ---- Workspaces ---------------------------------------------------------
    // A workspace is a loop-mounted image on one node. Cluster: names are
    // cluster-unique; each call runs on the workspace's node; a workspace's
    // single-writer lease and epoch stay the holding node's.

    async fn create_workspace(&self, name: String, size_bytes: u64) -> Result<WorkspaceStatus, EngineError>;
    /// Cluster: every node's workspaces, once each.
    async fn list_workspaces(&self) -> Result<Vec<WorkspaceStatus>, EngineError>;
    async fn workspace(&self, name: &str) -> Result<WorkspaceStatus, EngineError>;
    async fn remove_workspace(&self, name: &str) -> Result<(), EngineError>;

    // ---- Workspace snapshots and their operations --------------------------
    // Snapshots live in the snapshot store, shared by a cluster's nodes;
    // snapshot runs on the workspace's node, restore and fork on the node that
    // will hold the new workspaces. `op` names the operation for progress polls.

    /// Snapshots workspace `name`; with `fence` (holder, epoch) only while that
    /// lease is current.
    async fn snapshot_workspace_op(
        &self,
        name: &str,
        fence: Option<(String, u64)>,
        op: Option<String>,
    ) -> Result<SnapshotSummary, EngineError>;
    /// A checkpoint of workspace `name`: a synchronous, incremental snapshot
    /// to the store, fenced by the workspace's lease; once it answers, every
    /// byte written before the call is in the store. Cluster: on the node
    /// holding the workspace, and committed as the workspace's last
    /// checkpoint only while that node still holds it at its epoch (else
    /// `WorkspaceFenced`).
    async fn checkpoint_workspace(&self, name: &str) -> Result<crate::WorkspaceCheckpoint, EngineError>;
    /// Snapshots in the store, of one workspace or all. Cluster: the shared
    /// store's list, the same from every node.
    async fn list_snapshots(&self, workspace: Option<String>) -> Result<Vec<SnapshotSummary>, EngineError>;
    async fn inspect_snapshot(&self, id: &str) -> Result<SnapshotSummary, EngineError>;
    /// Cluster: a delete must not race another node's gc sweep of the store.
    async fn delete_snapshot(&self, id: &str) -> Result<(), EngineError>;
    async fn restore_workspace_op(
        &self,
        id: &str,
        name: &str,
        size: Option<u64>,
        op: Option<String>,
    ) -> Result<WorkspaceStatus, EngineError>;
    async fn fork_snapshot_op(
        &self,
        id: &str,
        count: u32,
        prefix: &str,
        op: Option<String>,
    ) -> Result<Vec<WorkspaceStatus>, EngineError>;
    /// Running and recently finished operations, oldest first. Cluster: every
    /// node's, so a poll finds an operation wherever it runs.
    async fn snapshot_ops(&self) -> Result<Vec<SnapshotOp>, EngineError>;
    /// One operation (`OperationNotFound` otherwise). Cluster: on whichever
    /// node runs it.
    async fn snapshot_op(&self, id: &str) -> Result<SnapshotOp, EngineError>;
    /// One mark-and-sweep of the store. Cluster: must see every node's live
    /// snapshot writes (the store's marker objects), not just this node's.
    async fn gc_snapshots(&self, min_age: Option<Duration>) -> Result<GcReport, EngineError>;

    // ---- Sandbox snapshots (OpenSandbox `/v1/snapshots`) --------------------
    // The record lives with the sandbox's node; the data in the shared store.

    /// Snapshots a sandbox's writable layer and workspaces. Cluster: on the
    /// sandbox's node.
    async fn snapshot_sandbox(&self, id: &str, name: Option<String>) -> Result<SandboxSnapshotRecord, EngineError>;
    /// Cluster: found wherever its record is.
    async fn sandbox_snapshot(&self, id: &str) -> Result<SandboxSnapshotRecord, EngineError>;
    async fn delete_sandbox_snapshot(&self, id: &str) -> Result<(), EngineError>;
    /// Records matching `f`, oldest first (creation time, then id). Cluster:
    /// every node's, merged in that order.
    async fn list_sandbox_snapshots(&self, f: &SnapshotFilter) -> Result<Vec<SandboxSnapshotRecord>, EngineError>;

    // ---- Images and templates ------------------------------------------------
    // Images are unpacked per node: these calls answer for the node serving
    // the request (a cluster may pull on every node; it says so in its docs).
    // Templates name an image and must resolve on every node a sandbox of
    // theirs may be placed on.

    async fn list_images(&self) -> Result<Vec<ImageRecord>, EngineError>;
    /// Layers on disk with how many images use each.
    async fn image_layers(&self) -> Result<Vec<(LayerMeta, usize)>, EngineError>;
    /// The stored image named `reference` (any spelling) or with that digest.
    async fn image(&self, reference: &str) -> Result<ImageRecord, EngineError>;
    async fn remove_image(&self, reference: &str) -> Result<ImageRecord, EngineError>;
    async fn pull_image(&self, reference: &str, auth: Option<RegistryAuth>) -> Result<ImageRecord, EngineError>;
    /// Pulls under way, with per-layer progress.
    async fn image_pulls(&self) -> Result<Vec<PullProgress>, EngineError>;
    /// A fresh path on this node for an upload about to go to
    /// [`import_image`](Self::import_image); the caller removes it after.
    fn image_upload_path(&self) -> PathBuf;
    /// Imports the tar at `tar` (from [`image_upload_path`](Self::image_upload_path)) as `name`.
    async fn import_image(&self, name: &str, tar: PathBuf) -> Result<ImageRecord, EngineError>;
    /// Drops layers no image and no live sandbox uses.
    async fn prune_images(&self) -> Result<PruneReport, EngineError>;
    /// Cluster: a template exists cluster-wide once created.
    async fn create_template(&self, req: TemplateRequest) -> Result<Template, EngineError>;
    async fn templates(&self) -> Result<Vec<Template>, EngineError>;
    async fn template(&self, name: &str) -> Result<Template, EngineError>;
    async fn delete_template(&self, name: &str) -> Result<(), EngineError>;

    // ---- Tasks ---------------------------------------------------------------
    // Cluster: one queue for the cluster (the JetStream backend), so these
    // see every task whichever node's worker holds it.

    /// Submits a task; `true` when new, `false` when its idempotency key was known.
    async fn submit_task(&self, req: SubmitTaskRequest) -> Result<(TaskRecord, bool), EngineError>;
    async fn list_tasks(&self, f: &TaskFilter) -> Result<Vec<TaskRecord>, EngineError>;
    async fn task(&self, id: &str) -> Result<TaskRecord, EngineError>;
    /// Cancels a task; a running attempt's sandbox is destroyed (on its node).
    async fn cancel_task(&self, id: &str) -> Result<TaskRecord, EngineError>;
    /// An attempt's log (default the latest) from `offset`, at most one
    /// `LOG_READ_CHUNK`, whether that attempt had ended, and its number.
    /// Cluster: read on the node that ran the attempt.
    async fn task_log(&self, id: &str, attempt: Option<u32>, offset: u64) -> Result<(Vec<u8>, bool, u32), EngineError>;

    // ---- This node ------------------------------------------------------------

    /// Every runtime class and whether it can run on this node.
    fn runtime_classes(&self) -> Vec<RuntimeClassInfo>;
    /// This node's OpenMetrics exposition (sandbox and task registries, one
    /// `# EOF`). Node local: Prometheus scrapes each node.
    fn metrics_text(&self) -> String;
    /// Records one execd command's time through the API (`ember_exec_seconds`).
    fn observe_exec(&self, took: Duration);
}
