//! gVisor checkpoint to disk and restore (docs/gvisor-checkpoint.md).
//!
//! `checkpoint` saves a Running runsc sandbox's processes and memory to an
//! image in its dir and stops them: the record becomes `Checkpointed` (shown
//! Paused) with no pid. `resume` of such a sandbox restores it. Both run
//! inside the sandbox's monitor (`Command::Checkpoint` / `Resume`), which
//! owns the init's pidfd. The record is persisted after each step; the image
//! is dropped only once the restored init is recorded, so a crash in between
//! loses nothing (the next restore deletes a half-restored container first).
//! A checkpointed sandbox keeps its TTL running: it holds its disk image,
//! cgroups and rootfs until it expires or is removed. A sandbox with
//! workspaces is refused (400): what its leases do across a checkpoint is
//! not decided yet; so is one with secrets (its image would hold them).
use super::{Command, Sandboxes};
use crate::{EngineError, SandboxRecord};
use ember_runtime::{Launched, RuntimeError};

impl Sandboxes {
    /// Checkpoints a Running sandbox to disk (runsc only).
    pub async fn checkpoint(&self, id: &str) -> Result<(), EngineError> {
        let e = self.visible(id)?;
        let r = e.snapshot();
        if !self.rt(&r.spec.runtime_class).can_checkpoint() {
            return Err(EngineError::CheckpointUnsupported(r.spec.runtime_class));
        }
        // Leases and the workspace slot across a checkpoint are not designed yet.
        if !r.workspaces.is_empty() {
            return Err(EngineError::invalid("workspaces", "a sandbox with workspaces cannot be checkpointed yet"));
        }
        // The image holds the sandbox's memory, its secrets' tmpfs included,
        // and secrets are never written to disk (docs/secrets.md).
        if !r.spec.secret_names.is_empty() {
            return Err(EngineError::invalid("secrets", "a sandbox with secrets cannot be checkpointed"));
        }
        e.ask(Command::Checkpoint).await.map(drop)
    }
}

fn runtime_err(rec: &SandboxRecord) -> impl FnOnce(RuntimeError) -> EngineError + '_ {
    move |source| match source {
        RuntimeError::Busy { id, message } => EngineError::Busy { id, message },
        RuntimeError::Unsupported { .. } => EngineError::CheckpointUnsupported(rec.spec.runtime_class.clone()),
        source => EngineError::Runtime { id: rec.id.clone(), source },
    }
}

/// In the monitor, after the lifecycle allowed it: the checkpoint itself.
pub(crate) async fn checkpoint(engine: &Sandboxes, rec: &SandboxRecord) -> Result<(), EngineError> {
    let (rt, id) = (engine.rt(&rec.spec.runtime_class), rec.id.clone());
    tokio::task::spawn_blocking(move || rt.checkpoint(&id))
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?
        .map_err(runtime_err(rec))
}

/// In the monitor: the restore; the caller records the new init.
pub(crate) async fn restore(engine: &Sandboxes, rec: &SandboxRecord) -> Result<Launched, EngineError> {
    let (rt, id, spec) = (engine.rt(&rec.spec.runtime_class), rec.id.clone(), rec.spec.clone());
    tokio::task::spawn_blocking(move || rt.restore(&id, &spec))
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?
        .map_err(runtime_err(rec))
}

/// The image of a restored sandbox, dropped once its new init is recorded.
pub(crate) async fn drop_image(engine: &Sandboxes, rec: &SandboxRecord) {
    let (rt, id) = (engine.rt(&rec.spec.runtime_class), rec.id.clone());
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || rt.drop_checkpoint(&id)).await {
        tracing::warn!(sandbox = %rec.id, error = %e, "removing a used checkpoint image failed");
    }
}
