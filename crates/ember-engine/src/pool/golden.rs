//! Golden pools: a pool whose members start from a sandbox snapshot (their
//! writable layer restored before their init starts, and each read-write
//! workspace restored into a copy of the member's own, as a restore does),
//! so a create restoring that snapshot is claimed in the usual milliseconds
//! instead of paying the restore. Only such a create claims one: a plain
//! create of the same template never gets the snapshot's files.
//!
//! A member's workspace copies are marked the pool's (`pool_copy`) while it
//! is idle: the end of an idle member (the pool shrinks or goes, the member
//! dies, a restart finds it gone) removes them, since no caller knows them;
//! a claim hands them to the caller, who keeps them as a restore's.
use super::{CreatePool, Pool, PoolSpec, Pools};
use crate::create::Seed;
use crate::sandbox::{Command, Edit};
use crate::snapshots::SandboxSnapshotState;
use crate::{CreateSandbox, EngineError, SandboxRecord};
use ember_types::SandboxSpec;
use std::sync::Arc;

impl Pools {
    /// The spec of a golden pool of snapshot `sid`: the snapshot's template,
    /// class, network and resources, with the request's resources over them.
    pub(super) fn golden_spec(&self, sid: &str, name: &str, req: &CreatePool) -> Result<PoolSpec, EngineError> {
        let snap = self.snapshots.sandbox_snapshot(sid)?;
        if snap.state != SandboxSnapshotState::Ready {
            return Err(EngineError::SnapshotNotReady { id: snap.id, state: snap.state.as_str() });
        }
        if !req.template.is_empty() && req.template != snap.spec.template {
            let why = format!("snapshot {sid} is of template {}, not {}", snap.spec.template, req.template);
            return Err(EngineError::invalid("template", why));
        }
        // Given (a cluster's node passes them on), they must be the snapshot's.
        let s = &snap.spec;
        if req.runtime_class.as_ref().is_some_and(|c| *c != s.runtime_class)
            || req.network.is_some_and(|n| n != s.network)
            || req.egress.as_ref().is_some_and(|e| *e != s.egress)
        {
            let why = "a golden pool's runtime class and network are its snapshot's";
            return Err(EngineError::invalid("fromSnapshot", why));
        }
        let restore = CreateSandbox {
            memory: req.memory.clone(),
            cpu: req.cpu.clone(),
            pids: req.pids,
            disk: req.disk.clone(),
            ..Default::default()
        };
        let spec = self.snapshots.restored_spec(&snap, &restore)?;
        Ok(PoolSpec {
            name: name.to_string(),
            template: spec.template,
            min: req.min,
            max: req.max,
            target: req.target.unwrap_or(super::Target::Auto),
            resources: spec.resources,
            runtime_class: spec.runtime_class,
            network: spec.network,
            egress: spec.egress,
            from_snapshot: Some(sid.to_string()),
            from_checkpoint: None,
            auto_pause_secs: None,
        })
    }

    /// What a golden pool's refill starts: the snapshot's spec with the
    /// pool's resources and no entrypoint (bound at claim), its image, and
    /// the layer to restore. A snapshot removed since fails the refill.
    pub(super) fn golden_member(
        &self,
        sid: &str,
        pool: &PoolSpec,
    ) -> Result<(SandboxSpec, Option<String>, Seed), EngineError> {
        let snap = self.snapshots.sandbox_snapshot(sid)?;
        if snap.state != SandboxSnapshotState::Ready {
            return Err(EngineError::SnapshotNotReady { id: snap.id, state: snap.state.as_str() });
        }
        let mut spec = self.snapshots.restored_spec(&snap, &CreateSandbox::default())?;
        spec.resources = pool.resources.clone();
        spec.entrypoint = Vec::new();
        // A pool from a checkpoint keys its golden image by its snapshot.
        let golden_image = pool.from_checkpoint.as_ref().map(|_| snap.id.clone());
        let seed = Seed { snapshot_id: snap.id.clone(), layer: snap.layer_snapshot.clone(), golden_image };
        Ok((spec, snap.image_uri.clone(), seed))
    }

    /// A new member's own copies of the snapshot's workspaces, restored and
    /// mounted as a restore's are and recorded as the pool's. A member that
    /// cannot get them is removed, with whatever copies were made.
    pub(super) async fn golden_workspaces(&self, sid: &str, rec: &SandboxRecord) -> Result<(), EngineError> {
        let snap = self.snapshots.sandbox_snapshot(sid)?;
        if snap.workspaces.is_empty() {
            return Ok(());
        }
        let mut mounted = match self.snapshots.restore_workspaces(rec, &snap).await {
            Ok(m) => m,
            Err(e) => {
                // The restore removed the copies it made.
                let _ = self.sandboxes.remove_any(rec.id.as_str()).await;
                return Err(e);
            }
        };
        // In the snapshot's order: a read-write one is a copy, a read-only one
        // the shared workspace itself.
        for (m, w) in mounted.iter_mut().zip(&snap.workspaces) {
            m.pool_copy = w.snapshot_id.is_some();
        }
        let copies: Vec<String> = mounted.iter().filter(|m| m.pool_copy).map(|m| m.name.clone()).collect();
        let edit = Command::Edit(Edit::Workspaces { mounted, launch_micros: None });
        let recorded = match self.sandboxes.entry(rec.id.as_str()) {
            Ok(entry) => entry.ask(edit).await.map(drop),
            Err(e) => Err(e),
        };
        if let Err(e) = recorded {
            // Not in its record: its end would not find them.
            let _ = self.sandboxes.remove_any(rec.id.as_str()).await;
            for name in copies {
                let _ = self.workspaces.remove_workspace(&name).await;
            }
            return Err(e);
        }
        Ok(())
    }

    /// The golden pool a create restoring `sid` (as `spec`, the restore's
    /// spec) may claim from: the one named (`poolRef`), else any of that
    /// snapshot with the same resources.
    pub(crate) fn golden_pool(
        &self,
        sid: &str,
        spec: &SandboxSpec,
        name: Option<&str>,
    ) -> Result<Option<Arc<Pool>>, EngineError> {
        if let Some(n) = name {
            let p = self.pool(n)?;
            if p.spec().from_snapshot.as_deref() != Some(sid) {
                return Err(EngineError::invalid("poolRef", format!("pool {n} does not start from snapshot {sid}")));
            }
            return Ok(Some(p));
        }
        Ok(self.find_pool(|ps| ps.from_snapshot.as_deref() == Some(sid) && ps.resources == spec.resources))
    }
}
