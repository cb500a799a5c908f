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
use crate::{Engine, EngineError};
use ember_types::SandboxState;
use ember_workspace::{WorkspaceError, WorkspaceMeta};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// A workspace a create or claim asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// only by [`Engine::commit_layer`] (task attempts; read-write only).
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
}

/// What `ember workspace inspect` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceStatus {
    pub meta: WorkspaceMeta,
    pub used_bytes: u64,
    pub mounted: bool,
}

impl Engine {
    /// Whether a sandbox id is alive (holds resources).
    pub(crate) fn is_alive(&self, id: &str) -> bool {
        self.entry(id).is_ok_and(|e| !e.snapshot().state.is_terminal())
    }

    async fn ws<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Engine) -> Result<T, WorkspaceError> + Send + 'static,
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
        self.ws(move |e| e.workspaces.create(&n, size_bytes)).await?;
        self.workspace(&name).await
    }

    pub async fn workspace(self: &Arc<Self>, name: &str) -> Result<WorkspaceStatus, EngineError> {
        let n = name.to_string();
        self.ws(move |e| {
            let meta = e.workspaces.meta(&n)?;
            let (used_bytes, _) = e.workspaces.usage(&n)?;
            Ok(WorkspaceStatus { meta, used_bytes, mounted: e.workspaces.is_mounted(&n) })
        })
        .await
    }

    pub async fn list_workspaces(self: &Arc<Self>) -> Result<Vec<WorkspaceStatus>, EngineError> {
        let names: Vec<String> = self.workspaces.list().into_iter().map(|m| m.name).collect();
        let mut out = Vec::new();
        for n in names {
            out.push(self.workspace(&n).await?);
        }
        Ok(out)
    }

    pub async fn remove_workspace(self: &Arc<Self>, name: &str) -> Result<(), EngineError> {
        let n = name.to_string();
        self.ws(move |e| {
            let _g = e.lease_lock.lock().unwrap_or_else(|p| p.into_inner());
            e.workspaces.remove(&n, |h| e.is_alive(h))
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
            self.ws(move |e| match e.workspaces.meta(&n) {
                Err(WorkspaceError::NotFound(_)) => match e.workspaces.create(&n, size) {
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
            let meta = self.workspaces.meta(&r.name)?;
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
        let (id, reqs) = (rec.id.clone(), reqs.to_vec());
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut done: Vec<MountedWorkspace> = Vec::new();
            for r in &reqs {
                match me.attach_one(&id, pid, r) {
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
        r: &WorkspaceRequest,
    ) -> Result<MountedWorkspace, EngineError> {
        let epoch = if r.read_only {
            None
        } else {
            let _g = self.lease_lock.lock().unwrap_or_else(|p| p.into_inner());
            let mut meta = self.workspaces.meta(&r.name)?;
            let epoch = meta.leases.acquire(&r.name, id.as_str(), r.steal, |h| self.is_alive(h))?;
            self.workspaces.save(&meta)?;
            Some(epoch)
        };
        let layered = r.layered && !r.read_only;
        let mounted =
            MountedWorkspace { name: r.name.clone(), path: r.path.clone(), read_only: r.read_only, epoch, layered };
        let res = self.workspace_source(&r.name, id.as_str(), layered).and_then(|src| {
            let class = self.entry(id.as_str()).map(|e| e.snapshot().spec.runtime_class).unwrap_or_default();
            self.rt(&class)
                .inject_mount(id, pid, &src, &r.path, r.read_only)
                .map_err(|source| EngineError::Runtime { id: id.clone(), source })
        });
        match res {
            Ok(()) => Ok(mounted),
            Err(e) => {
                self.release_leases(id.as_str(), std::slice::from_ref(&mounted));
                Err(e)
            }
        }
    }

    /// The host path to mount: the workspace, or a fresh layer over it for
    /// `holder` (after dropping the layers of holders that are gone).
    fn workspace_source(&self, name: &str, holder: &str, layered: bool) -> Result<std::path::PathBuf, EngineError> {
        if !layered {
            return Ok(self.workspaces.ensure_mounted(name)?);
        }
        self.workspaces.sweep_layers(name, |h| self.is_alive(h))?;
        Ok(self.workspaces.open_layer(name, holder)?)
    }

    /// Releases the leases `holder` still holds (a fenced holder's release is
    /// a no-op) and drops its layers (finishing a commit already decided).
    pub(crate) fn release_leases(&self, holder: &str, mounts: &[MountedWorkspace]) {
        let _g = self.lease_lock.lock().unwrap_or_else(|p| p.into_inner());
        for m in mounts.iter().filter(|m| m.layered) {
            if let Err(e) = self.workspaces.discard_layer(&m.name, holder) {
                tracing::warn!(workspace = %m.name, sandbox = %holder, error = %e, "dropping an attempt layer failed");
            }
        }
        for m in mounts {
            let Some(epoch) = m.epoch else { continue };
            if let Ok(mut meta) = self.workspaces.meta(&m.name) {
                if meta.leases.release(holder, epoch) {
                    let _ = self.workspaces.save(&meta);
                }
            }
        }
    }
}

impl Engine {
    /// Commits `holder`'s layer of `workspace` if `holder` still holds its
    /// lease at `epoch` and `still_leased()` (the task's lease) agrees, else
    /// drops it; `key` names the commit (the task). The sandbox is frozen
    /// first, so nothing in it writes during the merge, and stays frozen
    /// until its removal. Returns whether the layer was committed.
    pub(crate) async fn commit_layer(
        self: &Arc<Self>,
        workspace: &str,
        holder: &str,
        epoch: Option<u64>,
        key: &str,
        still_leased: impl FnOnce() -> bool + Send + 'static,
    ) -> Result<bool, EngineError> {
        self.pause(holder).await?;
        let (w, h, k) = (workspace.to_string(), holder.to_string(), key.to_string());
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            // The lease lock keeps a stealer from taking a newer epoch
            // between the check and the merge.
            let _g = me.lease_lock.lock().unwrap_or_else(|p| p.into_inner());
            let current = || {
                let Some(epoch) = epoch else { return false };
                me.workspaces.meta(&w).is_ok_and(|m| m.leases.check(&w, &h, epoch).is_ok())
            };
            me.workspaces.commit_layer(&w, &h, &k, || current() && still_leased())
        })
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?
        .map_err(EngineError::from)
    }

    /// Whether an attempt of task `key` already committed into `workspace`.
    pub(crate) async fn layer_committed(self: &Arc<Self>, workspace: &str, key: &str) -> Result<bool, EngineError> {
        let (w, k) = (workspace.to_string(), key.to_string());
        self.ws(move |e| e.workspaces.committed(&w, &k)).await
    }

    /// Forgets task `key`'s commit record once its success is recorded.
    pub(crate) async fn forget_layer_commit(self: &Arc<Self>, workspace: &str, key: &str) {
        let (w, k) = (workspace.to_string(), key.to_string());
        if let Err(e) = self.ws(move |e| e.workspaces.forget_committed(&w, &k)).await {
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
