//! ember's service core: services that own their state, each behind a
//! narrow interface, wired by the [`Engine`], which also implements the seam
//! the API calls ([`ControlPlane`]). It creates sandboxes through a
//! `Runtime`, supervises each with a monitor task (exit, OOM, expiry),
//! persists their records, re-adopts or reaps them after a restart, and
//! counts what it does. It knows no HTTP: the API layer parses requests into
//! the calls of the seam and maps [`EngineError`] to status codes.
//!
//! The services, each handed the ones it needs at construction (never the
//! engine): `Network` (`network.rs`), `Catalog` (`catalog/`: images,
//! templates, request → spec), `Workspaces` (`workspaces.rs`), `Sandboxes`
//! (`sandbox/`: one owner per sandbox, its monitor the only writer of its
//! record; launch, ops, checkpoint, stats, restart convergence), `Snapshots`
//! (`snapshots/`: workspace and sandbox snapshots, their progress, gc),
//! `Pools` (`pool/`), `Provisioner` (`create.rs`: the create path), `Tasks`
//! (`tasks/`). Where two would need each other a narrow trait or an event
//! stands between them: a lease holder's liveness is the registry's
//! `Holders`, an idle pool member's end is an `IdleEnded` the pools hear.
//! Records on disk: `store.rs`, `record.rs`.
#![forbid(unsafe_code)]

mod autopause;
mod catalog;
pub use catalog::templates;
mod create;
mod error;
mod flush;
mod metrics;
mod network;
pub mod pool;
mod process_metrics;
pub mod record;
mod sandbox;
mod seam;
mod secrets;
mod snapshots;
mod store;
pub mod tasks;
pub mod tenants;
mod workspaces;

pub use process_metrics::splice as splice_metrics;
pub use seam::{AgentRoute, ControlPlane, Liveness, NodeCall, NodeView, TaskLogWire};
pub use snapshots::{restored_size, OpKind, SnapshotOp, WorkspaceCheckpoint};
pub use snapshots::{SandboxSnapshotRecord, SandboxSnapshotState, SnapshotFilter, SnapshotWorkspace};
pub use snapshots::{SnapshotStoreConfig, StoreOpener};

pub use workspaces::{MountedWorkspace, WorkspaceRequest, WorkspaceStatus};

pub use create::{CreateSandbox, HostVolumeRequest, LaunchMode};
/// Every daemon → agent connection pins the socket first (the API's proxy too).
pub use ember_agent_client::connect_agent;
pub use ember_runtime::RuntimeError;
pub use error::EngineError;
pub use metrics::Metrics;
pub use network::{enforcement, NetworkStatus};
pub use record::{LaunchRecord, SandboxRecord};
pub use sandbox::ListFilter;
pub use tenants::{TenantError, Tenants};

use ember_runtime::Runtimes;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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
    /// The hash that names new snapshots' chunks (BLAKE3; sha256 keeps
    /// manifests the builds before BLAKE3 read, for a rolling upgrade).
    pub snapshot_hash: ember_snapshot::ChunkHash,
    /// How often the snapshot store's unreferenced chunks are swept (also
    /// soon after a delete); `None`: only on request.
    pub snapshot_gc_interval: Option<Duration>,
    /// Sweep about a minute after a delete too. Off on a cluster's nodes,
    /// whose store is shared: every node swept it each minute of a drill
    /// (each checkpoint deletes the one before), listing its ten thousand
    /// objects from the NATS servers in turn, and the heartbeats that waited
    /// behind took live nodes for dead. The interval's sweep remains.
    pub snapshot_gc_after_delete: bool,
    /// Host directories (and everything under them) that `host` volumes may
    /// bind into sandboxes. Empty: no host volumes.
    pub allowed_host_paths: Vec<PathBuf>,
    /// Spare workspace volumes kept made (formatted and mounted) for each
    /// size asked for lately: a create of that size, a rebind's restore above
    /// all, is then a rename. 0: none.
    pub workspace_spares: usize,
    /// The largest workspace accepted and the disk reserve new volumes never
    /// take (`ember_workspace::Limits`).
    pub workspace_limits: ember_workspace::Limits,
}

/// The composition root: it builds the services, wires them, runs restart
/// convergence in order, and implements [`ControlPlane`] by handing each
/// call to one service.
pub struct Engine {
    cfg: EngineConfig,
    runtimes: Runtimes,
    /// The sandboxes: registry, records, monitors.
    sandboxes: Arc<sandbox::Sandboxes>,
    /// Warm pools: specs, idle members, reconcilers.
    pools: Arc<pool::Pools>,
    workspaces: Arc<workspaces::Workspaces>,
    /// Workspace and sandbox snapshots, the store's gc.
    snapshots: Arc<snapshots::Snapshots>,
    metrics: Arc<Metrics>,
    /// Images, templates, and request → spec resolution.
    catalog: Arc<catalog::Catalog>,
    /// Set once by [`Engine::start_tasks`].
    tasks: std::sync::OnceLock<Arc<tasks::Tasks>>,
    /// The create path (catalog, workspaces, pools, sandboxes, snapshots).
    provision: Arc<create::Provisioner>,
    /// Egress networking; `None` when the daemon runs without it.
    network: Arc<network::Network>,
    /// Tenants, their keys, objects and quotas, the audit log.
    tenants: Arc<Tenants>,
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
        let (engine, idle_rx) = Self::wire(cfg, runtimes, images, network)?;
        let engine = Arc::new(engine);
        engine.recover().await?;
        tokio::spawn(pool::idle_ended_loop(Arc::downgrade(&engine.pools), idle_rx));
        tokio::spawn(sandbox::gc_loop(Arc::downgrade(&engine.sandboxes)));
        if engine.cfg.workspace_spares > 0 {
            let (ws, want) = (Arc::downgrade(&engine.workspaces), engine.cfg.workspace_spares);
            tokio::spawn(workspaces::spare_loop(ws, want, engine.metrics.clone()));
        }
        if let Some(every) = engine.cfg.snapshot_gc_interval {
            let after_delete = engine.cfg.snapshot_gc_after_delete;
            tokio::spawn(snapshots::gc_loop(Arc::downgrade(&engine.snapshots), every, after_delete));
        }
        Ok(engine)
    }

    /// Opens the task queue in the data dir and starts this node's workers
    /// and the task upkeep thread.
    pub fn start_tasks(&self, cfg: tasks::TaskConfig) -> Result<(), EngineError> {
        self.start_tasks_on(cfg, None)
    }

    /// Starts this node's workers on `queue` (a cluster's shared queue), or
    /// (`None`) on the embedded journal in the data dir.
    pub fn start_tasks_on(
        &self,
        cfg: tasks::TaskConfig,
        queue: Option<Arc<dyn ember_queue::TaskQueue>>,
    ) -> Result<(), EngineError> {
        if self.tasks.get().is_some() {
            return Err(EngineError::Internal("tasks already started".into()));
        }
        let services = (self.sandboxes.clone(), self.workspaces.clone(), self.provision.clone());
        let started = tasks::Tasks::start(&self.cfg, cfg, queue, services)?;
        self.tasks.set(started).map_err(|_| EngineError::Internal("tasks already started".into()))
    }

    fn tasks(&self) -> Result<&Arc<tasks::Tasks>, EngineError> {
        self.tasks.get().ok_or_else(|| EngineError::Internal("tasks are not started on this node".into()))
    }

    /// Builds the services, each handed the ones it needs: network and
    /// catalog, the sandbox registry and workspaces, sandboxes, snapshots,
    /// pools, then the create path over them. Also returns the receiver of
    /// idle pool members' ends, for the pools once recovery is done.
    fn wire(
        cfg: EngineConfig,
        runtimes: Runtimes,
        images: Arc<ember_image::ImageStore>,
        network: Option<Arc<ember_net::Network>>,
    ) -> Result<(Engine, tokio::sync::mpsc::UnboundedReceiver<sandbox::IdleEnded>), EngineError> {
        // Workspaces belong to the sandbox user (uid 1000 inside).
        let owner =
            runtimes.default_runtime().host_ids(ember_types::UserSpec::SANDBOX.uid, ember_types::UserSpec::SANDBOX.gid);
        let workspaces = ember_workspace::WorkspaceStore::open(cfg.data_dir.join("workspaces"), owner)?
            .with_limits(cfg.workspace_limits);
        // Spares an earlier process left (made again by this one if it keeps any).
        workspaces.clear_spares()?;
        let registry = Arc::new(sandbox::Registry::default());
        let workspaces = Arc::new(workspaces::Workspaces::new(workspaces, runtimes.clone(), registry.clone()));
        let snapshot_store = snapshots::open_store(&cfg)?;
        let metrics = Arc::new(Metrics::new());
        let network = Arc::new(network::Network::new(network, &metrics));
        let catalog = Arc::new(catalog::Catalog::new(&cfg, images, runtimes.clone(), network.clone())?);
        let (idle_tx, idle_rx) = tokio::sync::mpsc::unbounded_channel();
        let deps = sandbox::Deps {
            runtimes: runtimes.clone(),
            network: network.clone(),
            workspaces: workspaces.clone(),
            metrics: metrics.clone(),
            snapshots: snapshot_store.clone(),
        };
        let sandboxes = Arc::new(sandbox::Sandboxes::open(&cfg, registry, deps, idle_tx)?);
        let snapshots = Arc::new(snapshots::Snapshots::new(
            &cfg,
            snapshot_store,
            workspaces.clone(),
            sandboxes.clone(),
            catalog.clone(),
            runtimes.clone(),
        ));
        let pools = Arc::new(pool::Pools::open(
            &cfg,
            pool::PoolDeps {
                sandboxes: sandboxes.clone(),
                workspaces: workspaces.clone(),
                catalog: catalog.clone(),
                runtimes: runtimes.clone(),
                snapshots: snapshots.clone(),
            },
        )?);
        let (c, w, p, s, n) =
            (catalog.clone(), workspaces.clone(), pools.clone(), sandboxes.clone(), snapshots.clone());
        let tenants = Arc::new(Tenants::open(&cfg.data_dir).map_err(TenantError::into_engine)?);
        let provision = Arc::new(create::Provisioner::new(c, w, p, s, n, tenants.clone()));
        let engine = Engine {
            tenants,
            provision,
            cfg,
            runtimes,
            pools,
            workspaces,
            sandboxes,
            snapshots,
            tasks: std::sync::OnceLock::new(),
            network,
            catalog,
            metrics,
        };
        Ok((engine, idle_rx))
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The tenants service (the API's, and the create path's pool owners).
    pub fn tenants(&self) -> Arc<Tenants> {
        self.tenants.clone()
    }

    /// The default runtime class.
    pub fn runtime_class(&self) -> &'static str {
        self.runtimes.default_runtime().class()
    }

    /// Every runtime class ember knows, and whether it can run here.
    pub fn runtime_classes(&self) -> Vec<ember_types::api::RuntimeClassInfo> {
        self.runtimes.infos().to_vec()
    }

    /// Convergence after a restart (including `kill -9` of the daemon),
    /// the same path on every start: pools reloaded, every sandbox record
    /// re-adopted or reaped (idle pool members back to their pool), sandbox
    /// snapshots interrupted mid-way settled, networking started, the pools'
    /// reconcilers started.
    async fn recover(self: &Arc<Self>) -> Result<(), EngineError> {
        self.pools.load();
        let idle = self.sandboxes.recover().await?;
        self.pools.adopt_idle(idle).await;
        self.snapshots.recover().await?;
        self.network.start().await?;
        self.pools.start();
        Ok(())
    }
}
