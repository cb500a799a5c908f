//! Wire types of ember's lifecycle API, which is OpenSandbox's lifecycle API
//! (`/v1/sandboxes`, server 1.1.1) plus ember's own optional fields. Shared by the
//! daemon's API layer and the clients, so both sides agree on one shape.
//!
//! Rules the OpenSandbox SDK enforces and these types keep: optional keys are
//! omitted, never `null`; `entrypoint` is always present on a sandbox.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::sandbox_snapshot::{
    CreateSnapshotRequest, SandboxSnapshotInfo, SandboxSnapshotList, SnapshotGcReport, SnapshotGcRequest,
    SnapshotStatus, SnapshotWorkspaceInfo,
};

/// `{code, message}`: every error the API returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSpec {
    pub uri: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<serde_json::Value>,
}

/// ember's resource fields (`resources`), besides OpenSandbox's `resourceLimits`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcesSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
}

/// `POST /v1/sandboxes`. Unknown OpenSandbox fields are accepted and ignored
/// where ember has no equivalent yet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateSandboxRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// Seconds until expiry; absent or `null` means manual cleanup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_limits: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, Option<String>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<BTreeMap<String, String>>,
    // ember's own optional fields.
    /// A template name (same as `templateId`, or `image.uri` naming a template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,
    /// Default identity of commands: `{"uid":1000,"gid":1000}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<crate::UserSpec>,
    /// OpenSandbox's egress policy: enforced (it implies `network: egress`)
    /// when the daemon has egress networking; otherwise recorded and reported
    /// on port 18080 with `enforcementMode: none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<Volume>>,
    /// Accepted only as `false`: ember has no ingress gateway to secure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_access: Option<bool>,
    /// Workspaces to mount (ember's durable volumes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspaces: Vec<WorkspaceMountSpec>,
    /// `"none"` (default: loopback only) or `"egress"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Allow-list targets, `CIDR|IP|DOMAIN|*.DOMAIN[:PORT]`; implies `egress`
    /// with everything else denied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// Files `/run/secrets/<name>` (mode 0400, the sandbox user's) on a tmpfs;
    /// never stored, never in the environment (`crate::secrets`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<crate::secrets::Secrets>,
    /// Idle auto-pause: frozen after `afterSeconds` without proxy traffic,
    /// thawed by the next proxy call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<AutoPause>,
}

/// `autoPause` of a create request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AutoPause {
    pub after_seconds: u64,
    /// ember: the first idle pause of a gVisor sandbox is a checkpoint (its
    /// memory released to disk) instead of the freezer's; later ones, and
    /// any the class or the sandbox cannot take, freeze (docs/auto-pause.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint: bool,
}

/// OpenSandbox's egress policy (`networkPolicy`, and the body of the egress
/// port's `/policy`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_action: Option<String>,
    #[serde(default)]
    pub egress: Vec<NetworkRule>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkRule {
    pub action: String,
    pub target: String,
}

/// `GET|PATCH|DELETE /policy` on port 18080.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatusResponse {
    pub status: String,
    pub mode: String,
    /// How the policy is enforced: `none` in ember today.
    pub enforcement_mode: String,
    pub reason: String,
    pub policy: NetworkPolicy,
}

/// A volume of the create request: exactly one backend.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    pub mount_path: String,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostVolume>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcVolume>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ossfs: Option<serde_json::Value>,
}

/// The `pvc` backend: a platform-managed named volume, in ember a workspace
/// named `claimName`. Nulls are accepted where the SDK sends them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PvcVolume {
    pub claim_name: String,
    /// Missing (the default): true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_if_not_exists: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_sandbox_termination: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<String>,
    /// The size of a workspace created here (`1Gi` when missing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_modes: Option<Vec<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostVolume {
    pub path: String,
}

/// `GET /v1/sandboxes/{id}/diagnostics/{logs,events}`, always inline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiagnosticContentResponse {
    pub sandbox_id: String,
    pub kind: String,
    pub scope: String,
    pub delivery: String,
    pub content_type: String,
    pub truncated: bool,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_at: Option<String>,
}

/// How the sandbox was launched and what it took, measured by the server.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchInfo {
    /// "cold" (built now) or "warm" (claimed from a pool).
    pub kind: String,
    /// Server-side time from request to ready agent, in microseconds.
    pub micros: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub phases: BTreeMap<String, u64>,
}

/// A sandbox as `GET /v1/sandboxes/{id}` and create return it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    pub id: String,
    pub status: SandboxStatus,
    pub entrypoint: Vec<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageSpec>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    // ember's own fields.
    pub template: String,
    pub runtime_class: String,
    pub resources: crate::Resources,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<LaunchInfo>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspaces: Vec<MountedWorkspaceInfo>,
    /// `"egress"` for sandboxes with egress networking (absent: loopback only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// The sandbox snapshot this sandbox was restored from (OpenSandbox's
    /// optional `snapshotId`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// Names of its secrets (the values are never returned).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
}

/// A workspace mounted in a sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountedWorkspaceInfo {
    pub name: String,
    pub mount_path: String,
    pub read_only: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pagination {
    pub page: u32,
    pub page_size: u32,
    pub total_items: u64,
    pub total_pages: u32,
    pub has_next_page: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SandboxList {
    pub items: Vec<SandboxInfo>,
    pub pagination: Pagination,
}

/// `GET /v1/sandboxes/{id}/endpoints/{port}`: `endpoint` has no scheme.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub endpoint: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenewRequest {
    pub expires_at: String,
}

/// `POST /v1/pools`: ember's warm pools (not OpenSandbox's Kubernetes pool CRD).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatePoolRequest {
    /// Defaults to the template's name (a golden pool needs one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Required, except for a golden pool (`fromSnapshot`), whose template is
    /// the snapshot's.
    #[serde(default)]
    pub template: String,
    #[serde(default)]
    pub min: u32,
    pub max: u32,
    /// `"auto"` (sized from demand) or an idle count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,
    /// Network of the pool's sandboxes (`"none"` or `"egress"`); a claim
    /// matches a pool only with the same network and policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// A golden pool: every member's writable layer and workspaces are
    /// restored from this sandbox snapshot, and a create with `snapshotId`
    /// claims one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
    /// A golden pool restored from a gVisor checkpoint of this Running runsc
    /// sandbox: its members start with its processes and memory. The source
    /// is left checkpointed (docs/warm-pools.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_checkpoint: Option<String>,
    /// Idle auto-pause of the sandboxes claimed from the pool (a claim's own
    /// `autoPause` wins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<AutoPause>,
}

/// `PUT /v1/pools/{name}`: new bounds or target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResizePoolRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<serde_json::Value>,
}

/// The capacity arithmetic behind a pool's idle target.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSizing {
    /// Claims per second over the window (misses included).
    pub arrival_per_sec: f64,
    /// Moving average of the time to start a replacement, seconds.
    pub refill_secs: f64,
    /// arrival × refill: claims expected while one refill runs (Little's law).
    pub in_flight_demand: f64,
    /// The smallest idle count a refill window's Poisson arrivals exceed at
    /// most 0.1 % of the time, minus the in-flight demand: burst headroom.
    pub headroom: f64,
    /// The idle count the pool converges to, within [min, max].
    pub target: u32,
    pub window_secs: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolInfo {
    pub name: String,
    pub template: String,
    pub min: u32,
    pub max: u32,
    /// `"auto"` or the fixed idle count.
    pub target: serde_json::Value,
    pub resources: crate::Resources,
    pub runtime_class: String,
    pub idle: u32,
    pub starting: u32,
    pub claims_total: u64,
    pub misses_total: u64,
    pub misses_in_window: u32,
    pub create_failures: u64,
    /// Memory charged to the idle sandboxes' cgroups.
    pub idle_memory_bytes: u64,
    pub sizing: PoolSizing,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// The sandbox snapshot a golden pool's members start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
    /// The sandbox a golden pool from a checkpoint was primed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_checkpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<AutoPause>,
    /// On a cluster: each node's share of the target and its idle and
    /// starting members (`idle`, `starting` above are their sums).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<PoolNodeInfo>,
}

/// One node's part of a cluster's pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolNodeInfo {
    pub node: String,
    pub target: u32,
    pub idle: u32,
    pub starting: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolList {
    pub items: Vec<PoolInfo>,
}

/// A workspace to mount at create (ember's field `workspaces`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceMountSpec {
    pub name: String,
    /// Default `/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_path: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// Take the read-write lease from a live holder, fencing it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub steal: bool,
}

/// `POST /v1/workspaces`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateWorkspaceRequest {
    pub name: String,
    /// e.g. "1Gi".
    pub size: String,
}

/// `POST /v1/workspaces/{name}/checkpoint`'s answer: the snapshot now
/// holding every byte written before the call, the epoch it was committed
/// at, and when (RFC 3339).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceCheckpointInfo {
    pub snapshot_id: String,
    pub epoch: u64,
    pub at: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceLease {
    pub holder: String,
    pub epoch: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceInfo {
    pub name: String,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub created_at: String,
    /// The last lease epoch granted.
    pub epoch: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<WorkspaceLease>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceList {
    pub items: Vec<WorkspaceInfo>,
}

/// A workspace snapshot (ember's `/v1/workspace-snapshots`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSnapshotInfo {
    pub id: String,
    pub workspace: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    pub logical_bytes: u64,
    pub files: u64,
    pub chunks: u64,
    pub unique_chunks: u64,
    pub chunks_uploaded: u64,
    pub bytes_uploaded: u64,
    pub stored_bytes_uploaded: u64,
    pub chunks_reused: u64,
    /// Logical bytes over uploaded bytes: 1 for a first snapshot, large for an incremental one.
    pub dedup_ratio: f64,
    /// What the snapshot's distinct chunks take in the store (compressed), reused
    /// ones included; 0 for snapshots made before ember recorded it.
    #[serde(default)]
    pub stored_bytes: u64,
    /// Uploaded bytes before over after compression (1 when nothing was uploaded).
    #[serde(default)]
    pub compression_ratio: f64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkspaceSnapshotList {
    pub items: Vec<WorkspaceSnapshotInfo>,
}

/// `POST /v1/workspaces/{name}/snapshots`: optional fencing by a writer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotWorkspaceRequest {
    /// Commit only while this sandbox holds the lease at `epoch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// Names the operation, so its progress can be polled while the request
    /// runs (`GET /v1/workspace-snapshots/operations/{id}`).
    #[serde(default, rename = "operationId", skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreSnapshotRequest {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<String>,
    #[serde(default, rename = "operationId", skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkSnapshotRequest {
    pub count: u32,
    pub prefix: String,
    #[serde(default, rename = "operationId", skip_serializing_if = "Option::is_none")]
    pub operation_id: Option<String>,
}

/// A snapshot, restore or fork as it runs, and for a while after it ended
/// (`GET /v1/workspace-snapshots/operations[/{id}]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotOperation {
    pub id: String,
    /// `snapshot`, `restore` or `fork`.
    pub kind: String,
    /// The workspace snapshotted, or the snapshot restored or forked.
    pub target: String,
    /// `scanning`, `transferring`, `syncing`, `committing`, `copying`, `done` or `failed`.
    pub phase: String,
    /// File bytes processed, of the total (for a fork: of all its workspaces).
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Chunks processed, and of those the ones the snapshot had to store.
    pub chunks_done: u64,
    pub chunks_new: u64,
    /// Workspaces finished, of those the operation makes (0/0 for a snapshot).
    pub items_done: u32,
    pub items_total: u32,
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Why it failed (the request itself answered with the structured error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The snapshot id made, or the workspaces made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub result: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotOperationList {
    pub items: Vec<SnapshotOperation>,
}

/// `GET /v1/runtimes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeClassList {
    pub items: Vec<RuntimeClassInfo>,
}

/// One runtime class as `GET /v1/runtimes` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeClassInfo {
    /// "native", "runsc", "crun", "runc", "firecracker".
    pub name: String,
    /// Whether sandboxes of this class can be created on this host.
    pub available: bool,
    /// What separates a sandbox of this class from the host kernel.
    pub kernel_boundary: String,
    /// The binary and version when available; why not, when not.
    pub detail: String,
}
