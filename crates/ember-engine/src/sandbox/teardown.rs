//! The end of a sandbox, in its monitor: Stopping (written before the
//! teardown, so a crash in between finishes it on restart), destroy and reap,
//! the terminal state with its reason, leases and the network slot given
//! back. A sandbox whose removal was asked for, or an idle pool member no
//! caller knows, is then dropped: the monitor forgets it and exits.
use super::monitor::Monitor;
use crate::{EngineError, SandboxRecord};
use ember_types::lifecycle::{Action, Lifecycle};
use ember_types::{SandboxId, SandboxState, TerminationReason};
use std::os::fd::OwnedFd;
use std::time::Duration;

impl Monitor {
    /// Stopping → destroy → terminal state, persisted. Nothing to do for a
    /// sandbox that already ended.
    pub(super) async fn end(&mut self, reason: TerminationReason) {
        let mut rec = self.entry.snapshot();
        let was_pooled = rec.lifecycle == Lifecycle::Pooled;
        if !matches!(rec.lifecycle, Lifecycle::Stopping { .. }) && rec.apply(Action::Stop, None).is_err() {
            return;
        }
        self.entry.write(rec.clone());
        // Only for a daemon crash mid-teardown: the terminal record below is the durable one.
        if let Err(e) = self.engine.store.save_volatile(rec.id.as_str(), &rec) {
            tracing::error!(sandbox = %rec.id, error = %e, "persisting sandbox record failed");
        }
        let rt = self.engine.rt(&rec.spec.runtime_class);
        let (rid, pidfd) = (rec.id.clone(), self.live.take().map(|l| l.pidfd.into_inner()));
        let res = tokio::task::spawn_blocking(move || destroy_and_reap(rt.as_ref(), &rid, pidfd)).await;
        let reason = match res {
            Ok(Ok(())) => reason,
            Ok(Err(e)) => TerminationReason::RuntimeError(format!("teardown: {e}")),
            Err(e) => TerminationReason::RuntimeError(format!("teardown task: {e}")),
        };
        tracing::info!(sandbox = %rec.id, reason = %reason, "sandbox ended");
        let code = crate::metrics::ReasonLabels { reason: reason.code() };
        self.engine.metrics.terminated.get_or_create(&code).inc();
        let failed = reason.terminal_state() == SandboxState::Failed;
        if let Err(e) = rec.apply(Action::Ended { failed }, Some(reason)) {
            tracing::error!(sandbox = %rec.id, error = %e, "sandbox end not recorded");
        }
        self.entry.write(rec.clone());
        self.engine.workspaces.release_leases(rec.id.as_str(), &rec.workspaces);
        // Still the pool's: it was never claimed, so no caller knows them.
        self.engine.workspaces.remove_pool_copies(rec.id.as_str(), &rec.workspaces).await;
        self.engine.network.release(&rec).await;
        if was_pooled {
            // An idle pool member died: its pool must not hand it out.
            if let Some(pool) = rec.pool.clone() {
                // The pools may be gone (the daemon is stopping): nothing to tell.
                let _ = self.engine.idle_ended.send(super::IdleEnded { pool, id: rec.id.clone() });
            }
        }
        if rec.lifecycle != Lifecycle::Removing {
            self.engine.persist(&rec);
        }
    }

    /// `Command::Stop`: ends a live sandbox; an ended one stays as it is.
    pub(super) async fn stop(&mut self, reason: TerminationReason) -> Result<SandboxRecord, EngineError> {
        self.end(reason).await;
        Ok(self.entry.snapshot())
    }

    /// `Command::Remove`: the removal is recorded first (a restart finishes
    /// it), then a live sandbox is ended; the monitor then forgets it.
    pub(super) async fn remove(&mut self) -> Result<SandboxRecord, EngineError> {
        let mut rec = self.entry.snapshot();
        let ended = rec.lifecycle.is_ended();
        rec.apply(Action::Remove, None).map_err(|_| EngineError::NotFound(rec.id.to_string()))?;
        // On a blocking thread: an fsync pair would hold a runtime worker
        // that claims and execs need.
        let (engine, saved) = (self.engine.clone(), rec.clone());
        tokio::task::spawn_blocking(move || engine.store.save(saved.id.as_str(), &saved))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))??;
        self.entry.write(rec);
        if !ended {
            self.end(TerminationReason::Killed).await;
        }
        Ok(self.entry.snapshot())
    }

    /// Drops the record: from the engine's map and from disk.
    pub(super) fn forget(&self) {
        let id = self.entry.snapshot().id;
        self.engine.registry.remove(&id);
        if let Err(e) = self.engine.store.remove(id.as_str()) {
            // Its lifecycle says Removing: a restart drops it.
            tracing::error!(sandbox = %id, error = %e, "removing a sandbox record failed");
        }
    }
}

/// Destroys a sandbox and reaps its init (our child, for the native class)
/// so it does not linger as a zombie. Blocking.
pub(crate) fn destroy_and_reap(
    rt: &dyn ember_runtime::Runtime,
    id: &SandboxId,
    pidfd: Option<OwnedFd>,
) -> Result<(), ember_runtime::RuntimeError> {
    let r = rt.destroy(id, pidfd.as_ref());
    for _ in 0..1000 {
        if pidfd.as_ref().is_none_or(ember_runtime::wait_done) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    r
}
