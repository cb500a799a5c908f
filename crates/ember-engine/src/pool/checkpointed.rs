//! Golden pools from a gVisor checkpoint (`fromCheckpoint`,
//! docs/warm-pools.md): members start with a primed sandbox's processes and
//! memory, not only its files.
//!
//! At create, the Running runsc source is snapshotted (a sandbox snapshot
//! named `pool-<name>`, the pool's own: every member's writable layer is
//! seeded from it, as a golden pool's from a snapshot), then checkpointed,
//! and its checkpoint image copied by the runtime as the pool's golden image
//! (keyed by the snapshot's id). A refill seeds the layer and restores the
//! image into the new member (`Runtime::launch_from_golden`). The source is
//! left checkpointed (Paused; `resume` brings it back). The pool's snapshot
//! and image go with the pool.
use super::{CreatePool, PoolSpec, Pools};
use crate::EngineError;

impl Pools {
    /// Primes a pool from sandbox `src` and returns its spec: a golden
    /// pool of the new snapshot, with the image beside it.
    pub(super) async fn checkpoint_spec(
        &self,
        src: &str,
        name: &str,
        req: &CreatePool,
    ) -> Result<PoolSpec, EngineError> {
        // Before the source is touched: the checkpoint is not undone.
        if self.pool(name).is_ok() {
            return Err(EngineError::PoolExists(name.to_string()));
        }
        let rec = self.sandboxes.visible(src)?.snapshot();
        let rt = self.sandboxes.rt(&rec.spec.runtime_class);
        if !rt.can_checkpoint() {
            return Err(EngineError::CheckpointUnsupported(rec.spec.runtime_class));
        }
        // A claimed member's agent took its claim and refuses a second one,
        // which every restored copy of it would be asked for.
        if let Some(p) = &rec.pool {
            let why = format!("sandbox {src} was claimed from pool {p}: create the source cold");
            return Err(EngineError::invalid("fromCheckpoint", why));
        }
        let snap = self.snapshots.snapshot_sandbox(src, Some(format!("pool-{name}"))).await?;
        let primed = async {
            self.sandboxes.checkpoint(src).await?;
            let (id, spec, key) = (rec.id.clone(), rec.spec.clone(), snap.id.clone());
            let runtime = |source| EngineError::Runtime { id: rec.id.clone(), source };
            tokio::task::spawn_blocking(move || rt.save_golden_image(&id, &spec, &key))
                .await
                .map_err(|e| EngineError::Internal(e.to_string()))?
                .map_err(runtime)?;
            self.golden_spec(&snap.id, name, req)
        };
        match primed.await {
            Ok(spec) => Ok(PoolSpec { from_checkpoint: Some(rec.id.to_string()), ..spec }),
            Err(e) => {
                let spec = PoolSpec {
                    name: name.to_string(),
                    runtime_class: rec.spec.runtime_class.clone(),
                    from_snapshot: Some(snap.id),
                    from_checkpoint: Some(src.to_string()),
                    ..empty()
                };
                self.drop_checkpoint_start(&spec).await;
                Err(e)
            }
        }
    }

    /// Removes what a pool from a checkpoint started from (its golden image
    /// and its own snapshot), once the pool has let go of it (unpinned).
    /// Nothing for other pools.
    pub(super) async fn drop_checkpoint_start(&self, spec: &PoolSpec) {
        let (Some(_), Some(sid)) = (&spec.from_checkpoint, &spec.from_snapshot) else { return };
        let (rt, key) = (self.sandboxes.rt(&spec.runtime_class), sid.clone());
        let dropped = tokio::task::spawn_blocking(move || rt.drop_golden_image(&key)).await;
        if let Ok(Err(e)) = dropped {
            tracing::warn!(pool = %spec.name, error = %e, "removing a pool's golden image");
        }
        if let Err(e) = self.snapshots.delete_sandbox_snapshot(sid).await {
            tracing::warn!(pool = %spec.name, error = %e, "removing a pool's own snapshot");
        }
    }
}

pub(super) fn empty() -> PoolSpec {
    PoolSpec {
        name: String::new(),
        template: String::new(),
        min: 0,
        max: 0,
        target: super::Target::Auto,
        resources: Default::default(),
        runtime_class: String::new(),
        network: Default::default(),
        egress: Default::default(),
        from_snapshot: None,
        from_checkpoint: None,
        auto_pause_secs: None,
    }
}
