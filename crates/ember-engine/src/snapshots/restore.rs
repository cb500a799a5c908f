//! Restoring a sandbox snapshot: `POST /v1/sandboxes {snapshotId}`. A cold
//! start whose writable layer is filled from the layer snapshot (every chunk
//! verified, overlay marks recreated) before the init starts; then each
//! workspace snapshot is restored into a new workspace mounted at its old path.
use super::sandbox::{SandboxSnapshotRecord, SandboxSnapshotState};
use super::Snapshots;
use crate::{CreateSandbox, EngineError, MountedWorkspace, SandboxRecord, WorkspaceRequest};
use ember_types::SandboxSpec;
use std::sync::Arc;

impl Snapshots {
    /// Create from a snapshot (`snapshotId`): the snapshot's spec, with the
    /// request's timeout, metadata, resources, env (merged) and entrypoint.
    pub(crate) async fn create_from_snapshot(
        self: &Arc<Self>,
        sid: &str,
        req: CreateSandbox,
    ) -> Result<SandboxRecord, EngineError> {
        let t0 = std::time::Instant::now();
        let snap = self.sandbox_snapshot(sid)?;
        if snap.state != SandboxSnapshotState::Ready {
            return Err(EngineError::SnapshotNotReady { id: snap.id, state: snap.state.as_str() });
        }
        let spec = self.restored_spec(&snap, &req)?;
        let seed = crate::create::Seed {
            snapshot_id: snap.id.clone(),
            layer: snap.layer_snapshot.clone(),
            golden_image: None,
        };
        let rec = self.sandboxes.launch_seeded(spec, snap.image_uri.clone(), t0, seed).await?;
        match self.restore_workspaces(&rec, &snap).await {
            Ok(mounted) if mounted.is_empty() => Ok(rec),
            Ok(mounted) => {
                let entry = self.sandboxes.entry(rec.id.as_str())?;
                let edit = crate::sandbox::Edit::Workspaces { mounted, launch_micros: None };
                match entry.ask(crate::sandbox::Command::Edit(edit)).await {
                    Ok(rec) => Ok(rec),
                    Err(e) => {
                        let _ = self.sandboxes.remove(rec.id.as_str()).await;
                        Err(e)
                    }
                }
            }
            Err(e) => {
                let _ = self.sandboxes.remove(rec.id.as_str()).await;
                Err(e)
            }
        }
    }

    pub(crate) fn restored_spec(
        &self,
        snap: &SandboxSnapshotRecord,
        req: &CreateSandbox,
    ) -> Result<SandboxSpec, EngineError> {
        let mut spec = snap.spec.clone();
        let args = crate::create::ResourceArgs {
            memory: req.memory.clone(),
            cpu: req.cpu.clone(),
            pids: req.pids,
            disk: req.disk.clone(),
        };
        spec.resources = crate::create::apply_resources(spec.resources, &args)?;
        crate::create::check_env(req.env.keys())?;
        spec.env.extend(req.env.clone());
        spec.metadata = req.metadata.clone();
        if !req.entrypoint.is_empty() {
            spec.entrypoint = req.entrypoint.clone();
        }
        spec.ttl_secs = self.catalog.ttl(req.ttl_secs)?;
        // The snapshot's own secrets were never in it: only this request's.
        req.secrets.validate().map_err(|e| EngineError::invalid("secrets", e.to_string()))?;
        spec.secret_names = req.secrets.names();
        spec.auto_pause_secs = crate::autopause::check(req.auto_pause_secs)?;
        spec.auto_pause_checkpoint = req.auto_pause_checkpoint;
        if let Some(l) = spec.lower_dirs.iter().find(|l| !l.is_dir()) {
            return Err(EngineError::invalid(
                "snapshotId",
                format!("the snapshot's image layer {} is gone (image removed?)", l.display()),
            ));
        }
        if let Some(why) = self.runtimes.why_unavailable(&spec.runtime_class) {
            return Err(EngineError::invalid("snapshotId", why));
        }
        Ok(spec)
    }

    /// Restores each workspace snapshot into a new workspace `<name>-<sandbox>`
    /// and mounts it (and each read-only workspace) at its old path; the
    /// mounts come back in the snapshot's order. On failure the new
    /// workspaces are removed again.
    pub(crate) async fn restore_workspaces(
        self: &Arc<Self>,
        rec: &SandboxRecord,
        snap: &SandboxSnapshotRecord,
    ) -> Result<Vec<MountedWorkspace>, EngineError> {
        let (mut reqs, mut made) = (Vec::new(), Vec::new());
        let mut res = Ok(());
        for w in &snap.workspaces {
            let name = match &w.snapshot_id {
                Some(sid) => {
                    let base: String = w.name.chars().take(50).collect();
                    let name = format!("{base}-{}", &rec.id.as_str()[..8]);
                    if let Err(e) = self.restore_workspace(sid, &name, (w.size_bytes > 0).then_some(w.size_bytes)).await
                    {
                        res = Err(e);
                        break;
                    }
                    made.push(name.clone());
                    name
                }
                None => w.name.clone(),
            };
            reqs.push(WorkspaceRequest {
                name,
                path: w.path.clone(),
                read_only: w.read_only,
                steal: false,
                create_size: None,
                layered: false,
            });
        }
        let res = match res {
            Ok(()) => self.workspaces.attach_workspaces(rec, &reqs).await,
            Err(e) => Err(e),
        };
        if res.is_err() {
            // The new workspaces are this restore's: nobody else knows them yet.
            for n in made {
                let _ = self.workspaces.remove_workspace(&n).await;
            }
        }
        res
    }
}
