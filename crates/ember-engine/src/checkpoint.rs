//! gVisor checkpoint to disk and restore (docs/gvisor-checkpoint.md).
//!
//! `checkpoint` saves a Running runsc sandbox's processes and memory to an
//! image in its dir and stops them: the record becomes Paused with
//! `checkpointed` set and no pid. `resume` of such a sandbox restores it. Both
//! run inside the sandbox's monitor (`Control::Checkpoint` / `Restore`), which
//! owns the init's pidfd. The record is persisted after each step; the image
//! is dropped only once the restored init is recorded, so a crash in between
//! loses nothing (the next restore deletes a half-restored container first).
//! A checkpointed sandbox keeps its TTL running: it holds its disk image,
//! cgroups and rootfs until it expires or is removed. A sandbox with
//! workspaces is refused (400): what its leases do across a checkpoint is
//! not decided yet.
use crate::{Control, Engine, EngineError, Entry};
use ember_runtime::{Launched, RuntimeError};
use ember_types::SandboxState;
use std::sync::Arc;
use tokio::sync::oneshot;

impl Engine {
    /// Checkpoints a Running sandbox to disk (runsc only).
    pub async fn checkpoint(&self, id: &str) -> Result<(), EngineError> {
        let e = self.entry(id)?;
        let r = e.snapshot();
        if r.pooled {
            return Err(EngineError::NotFound(id.to_string()));
        }
        if !self.rt(&r.spec.runtime_class).can_checkpoint() {
            return Err(EngineError::CheckpointUnsupported(r.spec.runtime_class));
        }
        if r.state != SandboxState::Running {
            return Err(EngineError::NotRunning { id: r.id, state: r.state });
        }
        // Leases and the workspace slot across a checkpoint are not designed yet.
        if !r.workspaces.is_empty() {
            return Err(EngineError::invalid("workspaces", "a sandbox with workspaces cannot be checkpointed yet"));
        }
        let (done, wait) = oneshot::channel();
        self.ask(&e, Control::Checkpoint { done }, wait).await
    }

    /// Restores a checkpointed sandbox (`resume` of one).
    pub(crate) async fn restore_checkpoint(&self, e: &Arc<Entry>) -> Result<(), EngineError> {
        let (done, wait) = oneshot::channel();
        self.ask(e, Control::Restore { done }, wait).await
    }

    async fn ask(
        &self,
        e: &Entry,
        c: Control,
        wait: oneshot::Receiver<Result<(), EngineError>>,
    ) -> Result<(), EngineError> {
        let gone = || {
            let r = e.snapshot();
            EngineError::NotRunning { id: r.id, state: r.state }
        };
        e.ctl.send(c).await.map_err(|_| gone())?;
        wait.await.map_err(|_| gone())?
    }
}

fn runtime_err(rec: &crate::SandboxRecord) -> impl FnOnce(RuntimeError) -> EngineError + '_ {
    move |source| match source {
        RuntimeError::Busy { id, message } => EngineError::Busy { id, message },
        RuntimeError::Unsupported { .. } => EngineError::CheckpointUnsupported(rec.spec.runtime_class.clone()),
        source => EngineError::Runtime { id: rec.id.clone(), source },
    }
}

/// In the monitor: the checkpoint itself, then the record.
pub(crate) async fn checkpoint(engine: &Arc<Engine>, entry: &Entry, live: bool) -> Result<(), EngineError> {
    let rec = entry.snapshot();
    if rec.state != SandboxState::Running || !live {
        return Err(EngineError::NotRunning { id: rec.id, state: rec.state });
    }
    let (rt, id) = (engine.rt(&rec.spec.runtime_class), rec.id.clone());
    tokio::task::spawn_blocking(move || rt.checkpoint(&id))
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?
        .map_err(runtime_err(&rec))?;
    entry.update(|r| {
        r.checkpointed = true;
        r.pid = None;
        r.start_time = None;
        r.transition(SandboxState::Paused, None);
        r.event("checkpointed to disk".to_string());
    });
    engine.persist(entry);
    Ok(())
}

/// In the monitor: the restore, the record (new init), then the image goes.
pub(crate) async fn restore(engine: &Arc<Engine>, entry: &Entry, idle: bool) -> Result<Launched, EngineError> {
    let rec = entry.snapshot();
    if rec.state != SandboxState::Paused || !rec.checkpointed || !idle {
        return Err(EngineError::NotPaused { id: rec.id, state: rec.state });
    }
    let (rt, id, spec) = (engine.rt(&rec.spec.runtime_class), rec.id.clone(), rec.spec.clone());
    let launched = tokio::task::spawn_blocking(move || rt.restore(&id, &spec))
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?
        .map_err(runtime_err(&rec))?;
    entry.update(|r| {
        r.checkpointed = false;
        r.pid = Some(launched.pid);
        r.start_time = Some(launched.start_time);
        r.transition(SandboxState::Running, None);
        r.event(format!("restored from checkpoint in {} ms", launched.timing.total_us / 1000));
    });
    engine.persist(entry);
    let (rt, id) = (engine.rt(&rec.spec.runtime_class), rec.id.clone());
    if let Ok(Err(e)) = tokio::task::spawn_blocking(move || rt.drop_checkpoint(&id)).await {
        tracing::warn!(sandbox = %rec.id, error = %e, "removing a used checkpoint image failed");
    }
    Ok(launched)
}
