//! ember's service core. It owns the sandboxes: creates them through a
//! [`Runtime`], supervises each with a monitor task (exit, OOM, expiry), persists
//! their records, re-adopts or reaps them after a restart, and counts what it
//! does. It knows no HTTP: the API layer parses requests into the calls below and
//! maps [`EngineError`] to status codes.
//!
//! Layout: `create.rs` (request → spec → launch), `sandbox/` (one owner per
//! sandbox: its monitor task, the only writer of its record, and the commands
//! it takes), `checkpoint.rs` (gVisor checkpoint to disk / restore), `recover.rs` (restart convergence), `sandbox_snapshots.rs` (a
//! sandbox's writable layer + workspaces), `sandbox_restore.rs` (restored as a new sandbox), `ops.rs` (get, list, delete,
//! pause, renew, metadata), `store.rs` (records on disk), `snapshot_gc.rs` (snapshot storage reclaimed:
//! scheduled and requested mark-and-sweep, kept apart from snapshot writes).
#![forbid(unsafe_code)]

mod checkpoint;
mod create;
mod error;
mod images;
mod metrics;
mod network;
mod ops;
pub mod pool;
pub mod record;
mod recover;
mod sandbox;
mod sandbox_restore;
mod sandbox_snapshots;
mod seam;
mod snapshot_gc;
mod snapshot_ops;
mod snapshots;
mod stats;
mod store;
pub mod tasks;
pub mod templates;
mod workspaces;

pub use sandbox_snapshots::{SandboxSnapshotRecord, SandboxSnapshotState, SnapshotFilter, SnapshotWorkspace};
pub use seam::{AgentRoute, ControlPlane, CreateWire, NetworkWire, NodeCall, WorkspaceStatusWire};
pub use snapshot_ops::{OpKind, SnapshotOp};
pub use snapshots::SnapshotStoreConfig;

pub use workspaces::{MountedWorkspace, WorkspaceRequest, WorkspaceStatus};

pub use create::{CreateSandbox, HostVolumeRequest};
/// Every daemon → agent connection pins the socket first (the API's proxy too).
pub use ember_agent_client::connect_agent;
pub use ember_runtime::RuntimeError;
pub use error::EngineError;
pub use metrics::Metrics;
pub use network::{enforcement, NetworkStatus};
pub use ops::ListFilter;
pub use record::{LaunchRecord, SandboxRecord};

use ember_runtime::{Runtime, Runtimes};
use ember_types::SandboxId;
use sandbox::Entry;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// Engine configuration, validated by the binary and fixed at start.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub data_dir: PathBuf,
    /// How long ended sandboxes stay visible before their record is dropped.
    pub retention: Duration,
    /// Upper bound on a sandbox's TTL, if any.
    pub max_ttl: Option<Duration>,
    /// Where workspace snapshots go.
    pub snapshot_store: SnapshotStoreConfig,
    /// The file holding the key that signs and verifies snapshot manifests
    /// (`None`: `<data_dir>/snapshot.key`, created on first start). A cluster
    /// sharing a store shares this file.
    pub snapshot_key_file: Option<PathBuf>,
    /// Accept manifests without a MAC (written before manifests were
    /// authenticated): a migration aid, off by default.
    pub snapshot_accept_unsigned: bool,
    /// How often the snapshot store's unreferenced chunks are swept (also
    /// soon after a delete); `None`: only on request.
    pub snapshot_gc_interval: Option<Duration>,
    /// Host directories (and everything under them) that `host` volumes may
    /// bind into sandboxes. Empty: no host volumes.
    pub allowed_host_paths: Vec<PathBuf>,
}

pub struct Engine {
    cfg: EngineConfig,
    runtimes: Runtimes,
    store: store::Store<SandboxRecord>,
    /// A std Mutex: map lookups and inserts only, never held across an await.
    sandboxes: Mutex<HashMap<SandboxId, Arc<Entry>>>,
    /// A std Mutex: lookups and inserts only, never held across an await.
    pools: Mutex<HashMap<String, Arc<pool::Pool>>>,
    pool_store: store::Store<pool::PoolSpec>,
    workspaces: ember_workspace::WorkspaceStore,
    snapshot_store: Arc<dyn ember_snapshot::ObjectStore>,
    /// Progress of running (and recently finished) snapshots, restores, forks.
    snapshot_ops: snapshot_ops::SnapshotOps,
    /// Snapshot writes (shared) against a gc sweep (exclusive): a tokio lock,
    /// as both sides hold it across the await of their blocking work.
    snapshot_gate: tokio::sync::RwLock<()>,
    /// Wakes the scheduled sweep after a delete.
    snapshot_gc_kick: Arc<Notify>,
    /// Serialises lease read-modify-writes (short, never across an await).
    lease_lock: Mutex<()>,
    metrics: Metrics,
    images: Arc<ember_image::ImageStore>,
    templates: templates::TemplateStore,
    /// Set once by [`Engine::start_tasks`].
    tasks: std::sync::OnceLock<Arc<tasks::TaskService>>,
    /// Egress networking; `None` when the daemon runs without it.
    network: Option<Arc<ember_net::Network>>,
}

impl Engine {
    /// Opens the state dir, re-adopts or reaps what an earlier process left, and
    /// starts the background tasks. Must run inside a tokio runtime.
    pub async fn start(
        cfg: EngineConfig,
        runtimes: Runtimes,
        images: Arc<ember_image::ImageStore>,
    ) -> Result<Arc<Engine>, EngineError> {
        Self::start_networked(cfg, runtimes, images, None).await
    }

    /// [`Engine::start`] with egress networking: sandboxes asking for it get a
    /// slot of `network`.
    pub async fn start_networked(
        cfg: EngineConfig,
        runtimes: Runtimes,
        images: Arc<ember_image::ImageStore>,
        network: Option<Arc<ember_net::Network>>,
    ) -> Result<Arc<Engine>, EngineError> {
        let store = store::Store::open(cfg.data_dir.join("state/sandboxes"))?;
        let templates = templates::TemplateStore::open(cfg.data_dir.join("state/templates"))?;
        let pool_store = store::Store::open(cfg.data_dir.join("state/pools"))?;
        // Workspaces belong to the sandbox user (uid 1000 inside).
        let owner =
            runtimes.default_runtime().host_ids(ember_types::UserSpec::SANDBOX.uid, ember_types::UserSpec::SANDBOX.gid);
        let workspaces = ember_workspace::WorkspaceStore::open(cfg.data_dir.join("workspaces"), owner)?;
        let snapshot_store = snapshots::open_store(&cfg)?;
        let engine = Arc::new(Engine {
            cfg,
            runtimes,
            store,
            sandboxes: Mutex::new(HashMap::new()),
            pools: Mutex::new(HashMap::new()),
            pool_store,
            workspaces,
            snapshot_store,
            snapshot_ops: Default::default(),
            snapshot_gate: tokio::sync::RwLock::new(()),
            snapshot_gc_kick: Arc::new(Notify::new()),
            lease_lock: Mutex::new(()),
            metrics: Metrics::new(),
            images,
            templates,
            tasks: std::sync::OnceLock::new(),
            network,
        });
        recover::recover(&engine).await?;
        tokio::spawn(ops::gc_loop(Arc::downgrade(&engine)));
        if let Some(every) = engine.cfg.snapshot_gc_interval {
            tokio::spawn(snapshot_gc::gc_loop(Arc::downgrade(&engine), every));
        }
        Ok(engine)
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The default runtime class.
    pub fn runtime_class(&self) -> &'static str {
        self.runtimes.default_runtime().class()
    }

    /// Every runtime class ember knows, and whether it can run here.
    pub fn runtime_classes(&self) -> Vec<ember_types::api::RuntimeClassInfo> {
        self.runtimes.infos().to_vec()
    }

    /// The runtime that serves sandboxes of `class`.
    pub(crate) fn rt(&self, class: &str) -> Arc<dyn Runtime> {
        self.runtimes.for_class(class)
    }

    fn entry(&self, id: &str) -> Result<Arc<Entry>, EngineError> {
        let id = SandboxId::try_from(id.to_string()).map_err(|_| EngineError::NotFound(id.to_string()))?;
        self.sandboxes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
            .ok_or_else(|| EngineError::NotFound(id.to_string()))
    }

    /// A sandbox a caller may see: idle pool members and sandboxes on their
    /// way out of the store are not found.
    fn visible(&self, id: &str) -> Result<Arc<Entry>, EngineError> {
        let e = self.entry(id)?;
        if e.snapshot().lifecycle.is_hidden() {
            return Err(EngineError::NotFound(id.to_string()));
        }
        Ok(e)
    }

    /// Persists a change nobody waits for (the monitor's, a teardown's): a
    /// failure can only be logged.
    fn persist(&self, r: &SandboxRecord) {
        if let Err(err) = self.store.save(r.id.as_str(), r) {
            tracing::error!(sandbox = %r.id, error = %err, "persisting sandbox record failed");
        }
    }
}
