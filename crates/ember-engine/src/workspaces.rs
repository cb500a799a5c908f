//! Workspaces in the engine: management, leases, and attaching them to a
//! sandbox at create or claim time (into the running sandbox, no restart).
//!
//! Attach, in steps: 1. take the lease (read-write mounts) with the sandbox as
//! holder, persisted with its new epoch; 2. make sure the volume is mounted on
//! the host; 3. mount it into the sandbox (`open_tree` + `move_mount`); 4. record
//! it, with its epoch, in the sandbox's record. A sandbox that ends releases its
//! leases; a lease whose holder is gone is taken over by the next writer.
//!
//! A task attempt's read-write mount is `layered`: the sandbox gets an overlay
//! of its own over the workspace (`ember_workspace` `layer.rs`), committed by
//! `commit_layer` after a success and dropped when the sandbox ends otherwise.
use crate::record::SandboxRecord;
use crate::EngineError;
use ember_runtime::Runtimes;
use ember_types::SandboxState;
use ember_workspace::{RoomHold, WorkspaceError, WorkspaceMeta, WorkspaceStore};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The size spare volumes are made in until a create asks for another (the
/// API's default for a volume without one).
const SPARE_DEFAULT_SIZE: u64 = 1 << 30;

/// A workspace a create or claim asks for.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkspaceRequest {
    pub name: String,
    /// Absolute path inside the sandbox (default `/workspace`).
    pub path: String,
    pub read_only: bool,
    /// Take the lease from a live holder, fencing it.
    pub steal: bool,
    /// Create the workspace with this size (bytes) if it does not exist
    /// (OpenSandbox `pvc` volumes with `createIfNotExists`).
    pub create_size: Option<u64>,
    /// Writes go to a layer of this sandbox's own, applied to the workspace
    /// only by [`Workspaces::commit_layer`] (task attempts; read-write only).
    pub layered: bool,
}

/// A workspace mounted in a sandbox, as its record keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountedWorkspace {
    pub name: String,
    pub path: String,
    pub read_only: bool,
    /// The lease epoch (read-write mounts only).
    pub epoch: Option<u64>,
    /// Mounted through an attempt layer (see [`WorkspaceRequest::layered`]).
    #[serde(default)]
    pub layered: bool,
    /// An idle golden pool member's own copy of its snapshot's workspace,
    /// made at its refill: removed with the member while nobody claimed it
    /// (no caller knows it), the caller's once claimed (the claim clears it),
    /// as a restore's copy is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pool_copy: bool,
}

/// What `ember workspace inspect` shows.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkspaceStatus {
    pub meta: WorkspaceMeta,
    pub used_bytes: u64,
    pub mounted: bool,
}

/// Who may hold a workspace lease: a sandbox that still holds resources.
/// The sandbox registry answers; a narrow trait, so this service does not
/// depend on the sandboxes (which release their leases through it).
pub(crate) trait Holders: Send + Sync {
    fn is_alive(&self, id: &str) -> bool;
}

/// Workspaces of this node: the volume store and its leases. Owns the lease
/// lock; sandboxes hold leases, recorded in their records.
pub(crate) struct Workspaces {
    store: WorkspaceStore,
    /// Serialises lease read-modify-writes (short, never across an await).
    lease_lock: Mutex<()>,
    runtimes: Runtimes,
    holders: Arc<dyn Holders>,
}

impl Workspaces {
    pub fn new(store: WorkspaceStore, runtimes: Runtimes, holders: Arc<dyn Holders>) -> Workspaces {
        Workspaces { store, lease_lock: Mutex::new(()), runtimes, holders }
    }

    fn is_alive(&self, id: &str) -> bool {
        self.holders.is_alive(id)
    }

    /// A workspace's record (its size, its lease). Blocking.
    pub fn meta(&self, name: &str) -> Result<WorkspaceMeta, WorkspaceError> {
        self.store.meta(name)
    }

    /// The host path of a workspace, mounted if it was not. Blocking.
    pub fn ensure_mounted(&self, name: &str) -> Result<std::path::PathBuf, WorkspaceError> {
        self.store.ensure_mounted(name)
    }

    /// A new workspace (a restore's target) in room `hold` admitted. Blocking.
    pub fn create_within(&self, name: &str, size_bytes: u64, hold: &RoomHold<'_>) -> Result<(), WorkspaceError> {
        self.store.create_within(name, size_bytes, hold).map(drop)
    }

    /// Admits `count` new volumes of `size` bytes holding `data` bytes each
    /// if the store's disk has room for them, its reserve and the writes in
    /// flight; their room is held until the hold is dropped. Blocking.
    pub fn reserve_room(&self, size: u64, count: u64, data: u64) -> Result<RoomHold<'_>, WorkspaceError> {
        self.store.reserve_room(size, count, data)
    }

    /// Removes a workspace this node just made and nobody holds. Blocking.
    pub fn discard(&self, name: &str) -> Result<(), WorkspaceError> {
        self.store.remove(name, |_| false)
    }

    async fn ws<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Workspaces) -> Result<T, WorkspaceError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || f(&me))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(EngineError::from)
    }

    pub async fn create_workspace(
        self: &Arc<Self>,
        name: String,
        size_bytes: u64,
    ) -> Result<WorkspaceStatus, EngineError> {
        let n = name.clone();
        self.ws(move |e| e.store.create(&n, size_bytes)).await?;
        self.workspace(&name).await
    }

    pub async fn workspace(self: &Arc<Self>, name: &str) -> Result<WorkspaceStatus, EngineError> {
        let n = name.to_string();
        self.ws(move |e| {
            let meta = e.store.meta(&n)?;
            let (used_bytes, _) = e.store.usage(&n)?;
            Ok(WorkspaceStatus { meta, used_bytes, mounted: e.store.is_mounted(&n) })
        })
        .await
    }

    pub async fn list_workspaces(self: &Arc<Self>) -> Result<Vec<WorkspaceStatus>, EngineError> {
        let names: Vec<String> = self.store.list().into_iter().map(|m| m.name).collect();
        let mut out = Vec::new();
        for n in names {
            match self.workspace(&n).await {
                Ok(w) => out.push(w),
                // Removed since the directory was read: not in the list.
                Err(EngineError::Workspace(WorkspaceError::NotFound(_))) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    pub async fn remove_workspace(self: &Arc<Self>, name: &str) -> Result<(), EngineError> {
        let n = name.to_string();
        self.ws(move |e| {
            let _g = e.lease_lock.lock().unwrap_or_else(|p| p.into_inner());
            e.store.remove(&n, |h| e.is_alive(h))
        })
        .await
    }

    /// Creates the workspaces `reqs` may create and that do not exist yet. A
    /// concurrent create of the same name winning the race is fine.
    pub(crate) async fn create_missing_workspaces(
        self: &Arc<Self>,
        reqs: &[WorkspaceRequest],
    ) -> Result<(), EngineError> {
        for r in reqs {
            let Some(size) = r.create_size else { continue };
            let n = r.name.clone();
            self.ws(move |e| match e.store.meta(&n) {
                Err(WorkspaceError::NotFound(_)) => match e.store.create(&n, size) {
                    Ok(_) | Err(WorkspaceError::Exists(_)) => Ok(()),
                    Err(err) => Err(err),
                },
                other => other.map(|_| ()),
            })
            .await?;
        }
        Ok(())
    }

    /// Fails fast, before a cold start, when a read-write mount would be refused.
    pub(crate) fn check_workspaces(&self, reqs: &[WorkspaceRequest]) -> Result<(), EngineError> {
        for r in reqs.iter().filter(|r| !r.read_only && !r.steal) {
            let meta = self.store.meta(&r.name)?;
            if let Some(l) = meta.leases.lease.filter(|l| self.is_alive(&l.holder)) {
                return Err(ember_workspace::LeaseError::Held {
                    name: r.name.clone(),
                    holder: l.holder,
                    epoch: l.epoch,
                }
                .into());
            }
        }
        Ok(())
    }

    /// Leases and mounts `reqs` into the running sandbox `rec`. On failure every
    /// lease taken here is released again.
    pub(crate) async fn attach_workspaces(
        self: &Arc<Self>,
        rec: &SandboxRecord,
        reqs: &[WorkspaceRequest],
    ) -> Result<Vec<MountedWorkspace>, EngineError> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let pid = rec
            .pid
            .filter(|_| rec.state == SandboxState::Running)
            .ok_or_else(|| EngineError::NotRunning { id: rec.id.clone(), state: rec.state })?;
        let (id, reqs, class) = (rec.id.clone(), reqs.to_vec(), rec.spec.runtime_class.clone());
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut done: Vec<MountedWorkspace> = Vec::new();
            for r in &reqs {
                match me.attach_one(&id, pid, &class, r) {
                    Ok(m) => done.push(m),
                    Err(e) => {
                        me.release_leases(id.as_str(), &done);
                        return Err(e);
                    }
                }
            }
            Ok(done)
        })
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?
    }

    fn attach_one(
        &self,
        id: &ember_types::SandboxId,
        pid: i32,
        class: &str,
        r: &WorkspaceRequest,
    ) -> Result<MountedWorkspace, EngineError> {
        let t0 = std::time::Instant::now();
        let epoch = if r.read_only {
            None
        } else {
            let _g = self.lease_lock.lock().unwrap_or_else(|p| p.into_inner());
            let mut meta = self.store.meta(&r.name)?;
            let epoch = meta.leases.acquire(&r.name, id.as_str(), r.steal, |h| self.is_alive(h))?;
            self.store.save(&meta)?;
            Some(epoch)
        };
        let layered = r.layered && !r.read_only;
        let mounted = MountedWorkspace {
            name: r.name.clone(),
            path: r.path.clone(),
            read_only: r.read_only,
            epoch,
            layered,
            pool_copy: false,
        };
        let leased = t0.elapsed();
        let res = self.workspace_source(&r.name, id, class, layered).and_then(|src| {
            tracing::debug!(workspace = %r.name, sandbox = %id, ?leased, source = ?t0.elapsed() - leased, "attaching");
            self.runtimes
                .for_class(class)
                .inject_mount(id, pid, &src, &r.path, r.read_only)
                .map_err(|source| EngineError::Runtime { id: id.clone(), source })
        });
        match res {
            Ok(()) => {
                tracing::debug!(workspace = %r.name, sandbox = %id, took = ?t0.elapsed(), "attached");
                Ok(mounted)
            }
            Err(e) => {
                self.release_leases(id.as_str(), std::slice::from_ref(&mounted));
                Err(e)
            }
        }
    }

    /// The host path to mount: the workspace, or a fresh layer over it for
    /// `holder` (after dropping the layers of holders that are gone), over
    /// layers shifted onto the holder's id range if it has one of its own
    /// (an overlay cannot be idmapped once mounted).
    fn workspace_source(
        &self,
        name: &str,
        holder: &ember_types::SandboxId,
        class: &str,
        layered: bool,
    ) -> Result<std::path::PathBuf, EngineError> {
        if !layered {
            return Ok(self.store.ensure_mounted(name)?);
        }
        self.store.sweep_layers(name, |h| self.is_alive(h))?;
        let range = self.runtimes.for_class(class).id_range(holder).filter(|(to, r)| *to != r.storage_base());
        let shift = range.map(|(to, ranges)| {
            move |src: &std::path::Path, dst: &std::path::Path| ember_runtime::attach_shifted(&ranges, to, src, dst)
        });
        let idmap = shift.as_ref().map(|f| f as ember_workspace::Idmap);
        Ok(self.store.open_layer_mapped(name, holder.as_str(), idmap)?)
    }

    /// Releases the leases `holder` still holds (a fenced holder's release is
    /// a no-op) and drops its layers (finishing a commit already decided).
    pub(crate) fn release_leases(&self, holder: &str, mounts: &[MountedWorkspace]) {
        let _g = self.lease_lock.lock().unwrap_or_else(|p| p.into_inner());
        for m in mounts.iter().filter(|m| m.layered) {
            if let Err(e) = self.store.discard_layer(&m.name, holder) {
                tracing::warn!(workspace = %m.name, sandbox = %holder, error = %e, "dropping an attempt layer failed");
            }
        }
        for m in mounts {
            let Some(epoch) = m.epoch else { continue };
            if let Ok(mut meta) = self.store.meta(&m.name) {
                if meta.leases.release(holder, epoch) {
                    let _ = self.store.save(&meta);
                }
            }
        }
    }
}

impl Workspaces {
    /// Removes the workspace copies an idle golden pool member still holds
    /// for its pool (`pool_copy`), once it ended: nobody else knows them.
    pub(crate) async fn remove_pool_copies(self: &Arc<Self>, holder: &str, mounts: &[MountedWorkspace]) {
        for m in mounts.iter().filter(|m| m.pool_copy) {
            if let Err(e) = self.remove_workspace(&m.name).await {
                tracing::warn!(workspace = %m.name, sandbox = %holder, error = %e, "removing an idle member's copy failed");
            }
        }
    }

    /// Commits `holder`'s layer of `workspace` if `holder` still holds its
    /// lease at `epoch` and `still_leased()` (the task's lease) agrees, else
    /// drops it; `key` names the commit (the task). The caller freezes the
    /// sandbox first, so nothing in it writes during the merge, and keeps it
    /// frozen until its removal. Returns whether the layer was committed.
    pub(crate) async fn commit_layer(
        self: &Arc<Self>,
        workspace: &str,
        holder: &str,
        epoch: Option<u64>,
        key: &str,
        still_leased: impl FnOnce() -> bool + Send + 'static,
    ) -> Result<bool, EngineError> {
        let (w, h, k) = (workspace.to_string(), holder.to_string(), key.to_string());
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            // The lease lock keeps a stealer from taking a newer epoch
            // between the check and the merge.
            let _g = me.lease_lock.lock().unwrap_or_else(|p| p.into_inner());
            let current = || {
                let Some(epoch) = epoch else { return false };
                me.store.meta(&w).is_ok_and(|m| m.leases.check(&w, &h, epoch).is_ok())
            };
            me.store.commit_layer(&w, &h, &k, || current() && still_leased())
        })
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?
        .map_err(EngineError::from)
    }

    /// Whether an attempt of task `key` already committed into `workspace`.
    pub(crate) async fn layer_committed(self: &Arc<Self>, workspace: &str, key: &str) -> Result<bool, EngineError> {
        let (w, k) = (workspace.to_string(), key.to_string());
        self.ws(move |e| e.store.committed(&w, &k)).await
    }

    /// Forgets task `key`'s commit record once its success is recorded.
    pub(crate) async fn forget_layer_commit(self: &Arc<Self>, workspace: &str, key: &str) {
        let (w, k) = (workspace.to_string(), key.to_string());
        if let Err(e) = self.ws(move |e| e.store.forget_committed(&w, &k)).await {
            tracing::warn!(workspace = %workspace, task = %key, error = %e, "forgetting a commit record failed");
        }
    }
}

impl From<WorkspaceError> for EngineError {
    fn from(e: WorkspaceError) -> Self {
        EngineError::Workspace(e)
    }
}

impl From<ember_workspace::LeaseError> for EngineError {
    fn from(e: ember_workspace::LeaseError) -> Self {
        EngineError::Workspace(WorkspaceError::Lease(e))
    }
}

/// Keeps `want` spare volumes ready of each size asked for lately
/// (`ember_workspace`'s `spares.rs`): looks every second, and after a failure
/// (a full disk, say) waits a minute, creates then making their images.
/// Copies the store's figures into `metrics` as it goes.
pub(crate) async fn spare_loop(workspaces: Weak<Workspaces>, want: usize, metrics: Arc<crate::Metrics>) {
    let mut taken = 0;
    loop {
        let Some(me) = workspaces.upgrade() else { return };
        let res = tokio::task::spawn_blocking(move || {
            let made = me.store.refill_spares(want, SPARE_DEFAULT_SIZE);
            let ready: usize = me.store.spares_ready().values().sum();
            (made, ready, me.store.spares_taken())
        })
        .await;
        let pause = match res {
            Ok((made, ready, now_taken)) => {
                metrics.workspace_spares_ready.set(ready as i64);
                metrics.workspace_spares_taken.inc_by(now_taken.saturating_sub(taken));
                taken = now_taken;
                match made {
                    Ok(0) => Duration::from_secs(1),
                    Ok(made) => {
                        tracing::debug!(made, ready, "spare workspace volumes made");
                        Duration::from_secs(1)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "making spare workspace volumes failed; retrying in a minute");
                        Duration::from_secs(60)
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "the spare volume refill panicked; retrying in a minute");
                Duration::from_secs(60)
            }
        };
        tokio::time::sleep(pause).await;
    }
}
