//! The engine's errors. Each variant says what failed and on which sandbox; the
//! API layer maps them to `{code, message}` and a status in one place.
use ember_types::{SandboxId, SandboxState};
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("sandbox {0} not found")]
    NotFound(String),
    /// No running or recently finished snapshot, restore or fork has this id.
    #[error("snapshot operation {0} not found (finished ones are kept for 10 minutes)")]
    OperationNotFound(String),
    #[error("sandbox {id} is {state}, not Running")]
    NotRunning { id: SandboxId, state: SandboxState },
    #[error("sandbox {id} is {state}, not Paused")]
    NotPaused { id: SandboxId, state: SandboxState },
    #[error("invalid {field}: {message}")]
    InvalidRequest { field: &'static str, message: String },
    #[error("unknown template {0:?} (see `ember template ls`; the built-in one is \"host\")")]
    UnknownTemplate(String),
    #[error("template {0:?} exists already")]
    TemplateExists(String),
    #[error(transparent)]
    Image(#[from] ember_image::ImageError),
    #[error("sandbox {0} has no expiration (manual cleanup); it cannot be renewed")]
    NoExpiration(SandboxId),
    #[error("sandbox {id}: {source}")]
    Runtime {
        id: SandboxId,
        #[source]
        source: ember_runtime::RuntimeError,
    },
    #[error("state file {path}")]
    Store {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("pool {0} not found")]
    PoolNotFound(String),
    #[error("pool {0} already exists")]
    PoolExists(String),
    /// A warm-only create found no idle member (a cluster's claim; never
    /// from the public API's create, which then starts cold).
    #[error("pool {0} has no idle sandbox")]
    PoolEmpty(String),
    #[error(transparent)]
    Workspace(ember_workspace::WorkspaceError),
    #[error(transparent)]
    Task(ember_queue::QueueError),
    #[error(transparent)]
    Snapshot(#[from] ember_snapshot::SnapshotError),
    #[error("network of sandbox {id}")]
    Network {
        id: String,
        #[source]
        source: ember_net::NetError,
    },
    #[error("sandbox snapshot {0} not found")]
    SandboxSnapshotNotFound(String),
    #[error("sandbox snapshot {id} is {state}, not Ready")]
    SnapshotNotReady { id: String, state: &'static str },
    /// A golden pool starts its members from it: deleting it would fail
    /// every refill (409 `SNAPSHOT::IN_USE`).
    #[error("sandbox snapshot {id} is the starting point of golden pool {}: remove the pool first", .pools.join(", "))]
    SnapshotInUse { id: String, pools: Vec<String> },
    #[error("sandbox {id} is {state}: only a Running sandbox can be snapshotted")]
    SnapshotSourceState { id: SandboxId, state: SandboxState },
    #[error("the {0} runtime class keeps the sandbox's writable layer out of the host's reach: sandbox snapshots need the native, crun or runc class")]
    SnapshotUnsupportedRuntime(String),
    #[error("the {0} runtime class cannot checkpoint a sandbox to disk: checkpoint needs the runsc (gVisor) class")]
    CheckpointUnsupported(String),
    /// The sandbox refused to be interrupted (an open exec stream or terminal).
    #[error("sandbox {id} is busy: {message}")]
    Busy { id: SandboxId, message: String },
    /// A cluster node the call needs cannot be reached, or is dead (its
    /// heartbeat lapsed): retrying later may succeed (503).
    #[error("node {node} is unavailable: {reason}")]
    NodeUnavailable { node: String, reason: String },
    /// A workspace checkpoint from a node that no longer holds the workspace
    /// at its epoch (another node took it over): the snapshot is not the
    /// workspace's checkpoint (409 `WORKSPACE::FENCED`).
    #[error("workspace {name} is fenced: {detail}")]
    WorkspaceFenced { name: String, detail: String },
    /// Another node's error answer whose variant cannot be rebuilt here
    /// exactly: its status, code and message are passed on unchanged, so a
    /// call through any node answers what the owner answered.
    #[error("{message}")]
    Remote { node: String, status: u16, code: String, message: String },
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<ember_types::limits::LimitError> for EngineError {
    fn from(e: ember_types::limits::LimitError) -> Self {
        EngineError::InvalidRequest { field: e.field, message: e.to_string() }
    }
}

impl EngineError {
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        EngineError::InvalidRequest { field, message: message.into() }
    }
}
