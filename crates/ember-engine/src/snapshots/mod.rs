//! Workspace snapshots: consistent (the writer is frozen), fenced (a commit is
//! accepted only while the lease epoch it started under is current),
//! content-addressed and incremental in the configured object store.
mod checkpoint;
mod gc;
mod ops;
mod pins;
mod restore;
mod sandbox;

pub use checkpoint::WorkspaceCheckpoint;
pub use ops::{OpKind, SnapshotOp};
pub use sandbox::{SandboxSnapshotRecord, SandboxSnapshotState, SnapshotFilter, SnapshotWorkspace};

pub(crate) use gc::gc_loop;

use crate::catalog::Catalog;
use crate::sandbox::{Command, Sandboxes};
use crate::workspaces::WorkspaceStatus;
use crate::workspaces::Workspaces;
use crate::EngineError;
use ember_runtime::Runtimes;
use ember_snapshot::{ObjectStore, Phase, Progress, RestoreOptions, SnapshotOptions, SnapshotSummary};
use ops::SnapshotOps;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::Notify;

/// Where snapshots are written.
#[derive(Clone, Debug)]
pub enum SnapshotStoreConfig {
    Local(std::path::PathBuf),
    S3(ember_snapshot::S3Config),
    /// A store the engine cannot build itself (the cluster's JetStream
    /// object store, in `ember-cluster`, which depends on the engine).
    Opener(StoreOpener),
}

/// Makes a store given the manifest key the engine loaded (the key stays
/// the engine's to find: its file, or `<data>/snapshot.key`).
#[derive(Clone)]
pub struct StoreOpener {
    /// What the store is, for logs (`nats bucket ember_snapshots`).
    pub name: String,
    #[allow(clippy::type_complexity, reason = "one boxed constructor")]
    pub open: Arc<
        dyn Fn(ember_snapshot::ManifestKey) -> Result<Arc<dyn ObjectStore>, ember_snapshot::StoreError> + Send + Sync,
    >,
}

impl std::fmt::Debug for StoreOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreOpener").field("name", &self.name).finish_non_exhaustive()
    }
}

/// Opens the configured store with the manifest key: the given key file
/// (which must exist: a cluster's nodes must not each invent their own), or
/// this node's `<data>/snapshot.key`, made on first start.
pub(crate) fn open_store(cfg: &crate::EngineConfig) -> Result<Arc<dyn ObjectStore>, EngineError> {
    let key = match &cfg.snapshot_key_file {
        Some(file) => ember_snapshot::ManifestKey::load(file)?,
        None => ember_snapshot::ManifestKey::load_or_create(&cfg.data_dir.join("snapshot.key"))?,
    };
    let key = key.accept_unsigned(cfg.snapshot_accept_unsigned);
    let err = |e: ember_snapshot::StoreError| EngineError::Snapshot(ember_snapshot::SnapshotError::from(e));
    Ok(match &cfg.snapshot_store {
        SnapshotStoreConfig::Local(dir) => Arc::new(ember_snapshot::LocalStore::open(dir.clone(), key).map_err(err)?),
        SnapshotStoreConfig::S3(c) => Arc::new(ember_snapshot::S3Store::open(c.clone(), key).map_err(err)?),
        SnapshotStoreConfig::Opener(o) => (o.open)(key).map_err(err)?,
    })
}

fn now_ms() -> i64 {
    crate::record::now_ms()
}

/// Snapshots of this node: the object store and what keeps its writes
/// apart (the gate against a sweep, the sweep's kick), the progress of
/// operations, the sandbox snapshots' records. Workspace snapshots freeze
/// their writer and sandbox snapshots their sandbox through the sandbox
/// service's commands.
pub(crate) struct Snapshots {
    snapshot_store: Arc<dyn ObjectStore>,
    /// Progress of running (and recently finished) snapshots, restores, forks.
    snapshot_ops: SnapshotOps,
    /// Snapshot writes (shared) against a gc sweep (exclusive): a tokio lock,
    /// as both sides hold it across the await of their blocking work.
    snapshot_gate: tokio::sync::RwLock<()>,
    /// Wakes the scheduled sweep after a delete.
    snapshot_gc_kick: Arc<Notify>,
    /// Where the sandbox snapshots' records live.
    records_dir: PathBuf,
    workspaces: Arc<Workspaces>,
    sandboxes: Arc<Sandboxes>,
    catalog: Arc<Catalog>,
    runtimes: Runtimes,
    /// The golden pools that start from each sandbox snapshot (`pins.rs`).
    pins: pins::Pins,
    /// Names new snapshots' chunks (`--snapshot-hash`).
    chunk_hash: ember_snapshot::ChunkHash,
}

/// Runs an operation in a task of its own and waits for it: once begun it
/// runs to its end whoever waits. Awaited in the caller's own future, a
/// caller that went away (a client's disconnect; in a cluster a forwarded
/// call's deadline, or its node judged dead mid-call) dropped a snapshot
/// between its writer's freeze and the thaw: the sandbox stayed frozen for
/// good, every later call into it hanging (six sessions of the 300-session
/// drill, runs CD and CQ), and the operation stayed running.
async fn detached<T: Send + 'static>(
    op: impl std::future::Future<Output = Result<T, EngineError>> + Send + 'static,
) -> Result<T, EngineError> {
    tokio::spawn(op).await.map_err(|e| EngineError::Internal(format!("snapshot operation: {e}")))?
}

impl Snapshots {
    pub fn new(
        cfg: &crate::EngineConfig,
        store: Arc<dyn ObjectStore>,
        workspaces: Arc<Workspaces>,
        sandboxes: Arc<Sandboxes>,
        catalog: Arc<Catalog>,
        runtimes: Runtimes,
    ) -> Snapshots {
        Snapshots {
            snapshot_store: store,
            snapshot_ops: SnapshotOps::default(),
            snapshot_gate: tokio::sync::RwLock::new(()),
            snapshot_gc_kick: Arc::new(Notify::new()),
            records_dir: cfg.data_dir.join("state/sandbox-snapshots"),
            workspaces,
            sandboxes,
            catalog,
            runtimes,
            pins: Default::default(),
            chunk_hash: cfg.snapshot_hash,
        }
    }

    /// Options for snapshot `id` of this node: its chunk hash.
    fn options<'a>(&self, id: String) -> SnapshotOptions<'a> {
        let mut opts = SnapshotOptions::new(id);
        opts.chunking.hash = self.chunk_hash;
        opts
    }

    async fn snap<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Snapshots, &dyn ObjectStore) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || f(&me, me.snapshot_store.as_ref()))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
    }

    /// Snapshots a workspace. `fence`: commit only while this holder still has
    /// the lease at this epoch (a writer's own checkpoint). Without it the
    /// snapshot is refused if the lease changes hands while it runs. Its
    /// progress is operation `op` (or a generated id) in
    /// [`snapshot_ops`](Self::snapshot_ops).
    pub async fn snapshot_workspace_op(
        self: &Arc<Self>,
        name: &str,
        fence: Option<(String, u64)>,
        op: Option<String>,
    ) -> Result<SnapshotSummary, EngineError> {
        let op = self.snapshot_ops.begin(op, OpKind::Snapshot, name, 0)?;
        let (me, name) = (self.clone(), name.to_string());
        detached(async move {
            let res = me.snapshot_workspace_inner(&name, fence, &op).await;
            me.snapshot_ops.finish(&op, &res, |s| vec![s.id.clone()]);
            res
        })
        .await
    }

    async fn snapshot_workspace_inner(
        self: &Arc<Self>,
        name: &str,
        fence: Option<(String, u64)>,
        op: &str,
    ) -> Result<SnapshotSummary, EngineError> {
        let meta = self.workspaces.meta(name)?;
        let start = meta.leases.lease.clone();
        if let Some((holder, epoch)) = &fence {
            meta.leases.check(name, holder, *epoch)?;
        }
        // Before the writer is frozen: a sweep under way may take a while.
        let gate = self.snapshot_write_gate().await;
        // Consistency: the live writer, if any, is frozen while the tree is read.
        // A writer that is not live (checkpointed, ended) writes nothing.
        let writer = match start.as_ref().and_then(|l| self.sandboxes.entry(&l.holder).ok()) {
            Some(e) => e.ask(Command::SnapshotFreeze).await.ok().map(|_| e),
            None => None,
        };
        let (n, op) = (name.to_string(), op.to_string());
        let res = self
            .snap(move |e, store| {
                let mnt = e.workspaces.ensure_mounted(&n)?;
                let id = format!("{n}-{}", now_ms());
                let guard = || {
                    let now = e.workspaces.meta(&n).ok().and_then(|m| m.leases.lease);
                    match &fence {
                        Some((h, ep)) => now.is_some_and(|l| &l.holder == h && l.epoch == *ep),
                        None => now == start,
                    }
                };
                let progress = |p: Progress| e.snapshot_ops.update(&op, |o| o.progress = p);
                let mut opts = e.options(id).label("workspace", n.clone());
                opts.labels.insert("sizeBytes".into(), meta.size_bytes.to_string());
                if let Some(l) = &start {
                    opts.labels.insert("epoch".into(), l.epoch.to_string());
                }
                opts.commit_guard = &guard;
                opts.progress = &progress;
                Ok(ember_snapshot::snapshot(&mnt, store, opts).map(|i| i.summary)?)
            })
            .await;
        drop(gate);
        if let Some(e) = writer {
            // The sandbox stays frozen if its user paused it meanwhile.
            if let Err(err) = e.ask(Command::SnapshotThaw).await {
                tracing::warn!(sandbox = %e.snapshot().id, error = %err, "giving back a snapshot's freeze failed");
            }
        }
        res
    }

    /// One operation's progress (running, or finished in the last minutes).
    pub fn snapshot_op(&self, id: &str) -> Result<SnapshotOp, EngineError> {
        self.snapshot_ops.get(id).ok_or_else(|| EngineError::OperationNotFound(id.to_string()))
    }

    /// Every operation running or finished in the last minutes, oldest first.
    pub fn snapshot_ops(&self) -> Vec<SnapshotOp> {
        self.snapshot_ops.list()
    }

    pub async fn list_snapshots(
        self: &Arc<Self>,
        workspace: Option<String>,
    ) -> Result<Vec<SnapshotSummary>, EngineError> {
        self.snap(move |_, store| {
            let all = ember_snapshot::list(store)?;
            Ok(all
                .into_iter()
                .filter(|s| workspace.as_ref().is_none_or(|w| s.labels.get("workspace") == Some(w)))
                // A sandbox snapshot's rootfs layer is not a workspace snapshot
                // (it is listed, and removed, through /v1/snapshots).
                .filter(|s| !s.labels.contains_key(ember_snapshot::LAYER_LABEL))
                .collect())
        })
        .await
    }

    pub async fn inspect_snapshot(self: &Arc<Self>, id: &str) -> Result<SnapshotSummary, EngineError> {
        let id = id.to_string();
        self.snap(move |_, store| Ok(ember_snapshot::inspect(store, &id)?)).await
    }

    pub async fn delete_snapshot(self: &Arc<Self>, id: &str) -> Result<(), EngineError> {
        let id = id.to_string();
        self.snap(move |_, store| Ok(ember_snapshot::delete(store, &id)?)).await?;
        self.snapshot_deleted();
        Ok(())
    }

    /// A new workspace holding the snapshot's tree, every chunk verified.
    pub async fn restore_workspace(
        self: &Arc<Self>,
        id: &str,
        name: &str,
        size: Option<u64>,
    ) -> Result<WorkspaceStatus, EngineError> {
        self.restore_workspace_op(id, name, size, None).await
    }

    /// [`restore_workspace`](Self::restore_workspace) with its progress under operation `op`.
    pub async fn restore_workspace_op(
        self: &Arc<Self>,
        id: &str,
        name: &str,
        size: Option<u64>,
        op: Option<String>,
    ) -> Result<WorkspaceStatus, EngineError> {
        let op = self.snapshot_ops.begin(op, OpKind::Restore, id, 1)?;
        let (me, id, name) = (self.clone(), id.to_string(), name.to_string());
        detached(async move {
            let res = match me.make_workspaces(&id, std::slice::from_ref(&name), size, &op).await {
                Ok(_) => me.workspaces.workspace(&name).await,
                Err(e) => Err(e),
            };
            me.snapshot_ops.finish(&op, &res, |w| vec![w.meta.name.clone()]);
            res
        })
        .await
    }

    /// `count` new workspaces `<prefix>-<i>` from one snapshot, with its
    /// progress under operation `op`.
    pub async fn fork_snapshot_op(
        self: &Arc<Self>,
        id: &str,
        count: u32,
        prefix: &str,
        op: Option<String>,
    ) -> Result<Vec<WorkspaceStatus>, EngineError> {
        ember_types::limits::check("count", count.into(), 1, ember_types::limits::MAX_FORK_COUNT.into(), "")?;
        let names: Vec<String> = (1..=count).map(|i| format!("{prefix}-{i}")).collect();
        let op = self.snapshot_ops.begin(op, OpKind::Fork, id, count)?;
        let (me, id) = (self.clone(), id.to_string());
        detached(async move {
            let res = match me.make_workspaces(&id, &names, None, &op).await {
                Ok(()) => me.workspaces_named(&names).await,
                Err(e) => Err(e),
            };
            me.snapshot_ops.finish(&op, &res, |ws| ws.iter().map(|w| w.meta.name.clone()).collect());
            res
        })
        .await
    }

    async fn workspaces_named(&self, names: &[String]) -> Result<Vec<WorkspaceStatus>, EngineError> {
        let mut out = Vec::new();
        for n in names {
            out.push(self.workspaces.workspace(n).await?);
        }
        Ok(out)
    }

    /// New workspaces `names` holding snapshot `id`: the first restored (every
    /// chunk fetched and verified), the others copied from it by the kernel,
    /// which is several times cheaper than decompressing and hashing again.
    /// All or nothing: on failure every workspace made here is removed.
    async fn make_workspaces(
        self: &Arc<Self>,
        id: &str,
        names: &[String],
        size: Option<u64>,
        op: &str,
    ) -> Result<(), EngineError> {
        // Read once: the size check below and the restore share it.
        let owned = id.to_string();
        let snap = self.snap(move |_, store| Ok(ember_snapshot::load_snapshot(store, &owned)?)).await?;
        let summary = snap.summary();
        let data = restored_data(&summary);
        let size = restored_size(&summary, size);
        if data > size {
            return Err(ember_snapshot::SnapshotError::TooLarge { id: id.to_string(), bytes: data, limit: size }.into());
        }
        self.snapshot_ops.update(op, |o| o.progress.bytes_total = data.saturating_mul(names.len() as u64));
        let (names, op) = (names.to_vec(), op.to_string());
        self.snap(move |e, store| {
            // All of them up front: a fork the disk cannot hold is refused
            // before its first volume, not after filling the disk; their
            // room held until they are written (or removed again).
            let room = e.workspaces.reserve_room(size, names.len() as u64, data)?;
            let (mut made, t0) = (Vec::new(), std::time::Instant::now());
            let res = make_volumes(e, &names, size, &room, &mut made)
                .and_then(|mounts| fill_workspaces(e, store, &snap, &mounts, size, &op, t0));
            if res.is_err() {
                for n in &made {
                    let _ = e.workspaces.discard(n);
                }
            }
            res
        })
        .await
    }
}

/// Where a restore builds the tree inside a new workspace before its entries
/// move up into the workspace's root.
const STAGING: &str = ".ember-restore";

/// `make_workspaces`' empty volumes, in the room it admitted, mounted;
/// `made` collects what to remove on failure.
fn make_volumes(
    e: &Snapshots,
    names: &[String],
    size: u64,
    room: &ember_workspace::RoomHold<'_>,
    made: &mut Vec<String>,
) -> Result<Vec<std::path::PathBuf>, EngineError> {
    let mut mounts = Vec::new();
    for n in names {
        e.workspaces.create_within(n, size, room)?;
        made.push(n.clone());
        mounts.push(e.workspaces.ensure_mounted(n)?);
    }
    Ok(mounts)
}

/// The blocking half of `make_workspaces`: the snapshot restored into the
/// first of `mounts` and copied into the others (`t0`: when their volumes
/// began).
fn fill_workspaces(
    e: &Snapshots,
    store: &dyn ObjectStore,
    snap: &ember_snapshot::LoadedSnapshot,
    mounts: &[std::path::PathBuf],
    size: u64,
    op: &str,
    t0: std::time::Instant,
) -> Result<(), EngineError> {
    let made_in = t0.elapsed();
    let Some((first, rest)) = mounts.split_first() else { return Ok(()) };
    let first_tmp = first.join(STAGING);
    // The op's total covers every workspace; a step reports only its own bytes.
    let progress =
        |p: Progress| e.snapshot_ops.update(op, |o| o.progress = Progress { bytes_total: o.progress.bytes_total, ..p });
    let opts = RestoreOptions { progress: &progress, max_bytes: Some(size), ..Default::default() };
    let info = ember_snapshot::restore_loaded(store, snap, &first_tmp, opts)?;
    tracing::debug!(snapshot = %snap.id(), ?made_in, restored_in = ?t0.elapsed() - made_in, bytes = info.bytes, "restored");
    let item_done = || {
        e.snapshot_ops.update(op, |o| {
            o.items_done += 1;
            o.bytes_before += info.bytes;
            o.progress = Progress { bytes_total: o.progress.bytes_total, phase: Phase::Copying, ..Progress::default() };
        })
    };
    item_done();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 4).min(rest.len().max(1));
    std::thread::scope(|scope| -> Result<(), EngineError> {
        let handles: Vec<_> = rest
            .chunks(rest.len().div_ceil(threads).max(1))
            .map(|part| {
                let (first_tmp, item_done) = (&first_tmp, &item_done);
                scope.spawn(move || -> Result<(), EngineError> {
                    for mnt in part {
                        let opts = RestoreOptions::default();
                        ember_snapshot::copy_loaded(store, snap, first_tmp, &mnt.join(STAGING), opts)?;
                        item_done();
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join().unwrap_or_else(|_| Err(EngineError::Internal("fork copy thread panicked".into())))
        })
    })?;
    mounts.iter().try_for_each(|m| move_up(m, &m.join(STAGING)))
}

/// Moves a restored tree's entries from `tmp` into the workspace root `mnt`.
fn move_up(mnt: &std::path::Path, tmp: &std::path::Path) -> Result<(), EngineError> {
    let internal = |what: String| EngineError::Internal(what);
    for entry in std::fs::read_dir(tmp).map_err(|err| internal(format!("{}: {err}", tmp.display())))? {
        let entry = entry.map_err(|err| internal(err.to_string()))?;
        std::fs::rename(entry.path(), mnt.join(entry.file_name()))
            .map_err(|err| internal(format!("moving {}: {err}", entry.path().display())))?;
    }
    std::fs::remove_dir(tmp).map_err(|err| internal(format!("{}: {err}", tmp.display())))
}

/// What a restore of `summary` writes: holes are recreated as holes, so a
/// 200 GiB sparse file in a 1 GiB workspace needs its data only.
fn restored_data(summary: &SnapshotSummary) -> u64 {
    summary.stats.logical_bytes.saturating_sub(summary.stats.hole_bytes)
}

/// The size of each workspace a restore or fork of `summary` makes: the
/// caller's (refused up front if the data cannot fit; the restore checks it
/// again, from the manifest's entries), else the snapshotted workspace's
/// (its `sizeBytes` label; 1 GiB without one), with room for the data.
/// What a tenant's `workspaceBytes` quota is charged for each.
pub fn restored_size(summary: &SnapshotSummary, asked: Option<u64>) -> u64 {
    asked.unwrap_or_else(|| {
        let labelled = summary.labels.get("sizeBytes").and_then(|s| s.parse().ok());
        labelled.unwrap_or(1u64 << 30).max(restored_data(summary).saturating_add(16 << 20))
    })
}
