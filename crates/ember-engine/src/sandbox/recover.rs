//! Convergence after a restart (including `kill -9` of the daemon): every record
//! is re-adopted or reaped, and every host resource without a record is reaped.
//! The same path runs on every start, so a restart converges instead of replaying.
use super::Sandboxes;
use crate::record::SandboxRecord;
use crate::EngineError;
use ember_types::lifecycle::{Action, Lifecycle};
use ember_types::{SandboxId, SandboxState, TerminationReason};
use std::sync::Arc;

/// An idle pool member re-adopted after a restart: its pool takes it back
/// (its record says it was never handed out: a claim persists before it
/// answers), or, with the pool gone, it is removed.
pub(crate) struct IdleMember {
    pub pool: Option<String>,
    pub id: SandboxId,
}

impl Sandboxes {
    /// Re-adopts or reaps every recorded sandbox, then reaps every host
    /// resource no record names. Returns the idle pool members re-adopted.
    pub async fn recover(self: &Arc<Self>) -> Result<Vec<IdleMember>, EngineError> {
        let (mut known, mut idle) = (Vec::new(), Vec::new());
        for (stem, rec) in self.store.recover_all() {
            match rec {
                Ok(rec) => {
                    known.push(rec.id.to_string());
                    idle.extend(self.recover_one(rec).await);
                }
                Err(why) => {
                    tracing::warn!(file = %stem, why = %why, "unreadable sandbox record; reaping its resources");
                    let _ = self.store.remove(&stem);
                }
            }
        }
        for rt in self.runtimes.all().cloned().collect::<Vec<_>>() {
            let lrt = rt.clone();
            let leftovers = tokio::task::spawn_blocking(move || lrt.leftovers())
                .await
                .map_err(|e| EngineError::Internal(e.to_string()))?
                .unwrap_or_default();
            for name in leftovers.into_iter().filter(|n| !known.contains(n)) {
                tracing::warn!(sandbox = %name, class = rt.class(), "reaping resources of a sandbox with no record");
                let rt = rt.clone();
                let _ = tokio::task::spawn_blocking(move || rt.reap_leftover(&name)).await;
            }
        }
        Ok(idle)
    }

    async fn recover_one(self: &Arc<Self>, mut rec: SandboxRecord) -> Option<IdleMember> {
        rec.migrate();
        if rec.lifecycle == Lifecycle::Checkpointed {
            // No process to adopt: the image on disk is the sandbox until a resume.
            let socket = self.rt(&rec.spec.runtime_class).agent_socket_path(&rec.id).unwrap_or_default();
            tracing::info!(sandbox = %rec.id, "kept checkpointed sandbox");
            self.publish(rec, socket, None);
            return None;
        }
        if matches!(rec.lifecycle, Lifecycle::Live { .. } | Lifecycle::Pooled) {
            if let Some(launched) = adopt(self, &rec).await {
                tracing::info!(sandbox = %rec.id, pid = launched.pid, "re-adopted sandbox");
                self.network.adopt(&rec).await;
                converge_freezer(self, &mut rec).await;
                let pooled = rec.lifecycle == Lifecycle::Pooled;
                let (id, pool) = (rec.id.clone(), rec.pool.clone());
                let socket = launched.agent_socket.clone();
                self.publish(rec, socket, Some(launched));
                return pooled.then_some(IdleMember { pool, id });
            }
        }
        // Not adoptable: whatever is left of it goes.
        let rt = self.rt(&rec.spec.runtime_class);
        let id = rec.id.clone();
        let ooms = tokio::task::spawn_blocking(move || {
            let ooms = rt.oom_kills(&id).unwrap_or(0);
            let _ = rt.reap_leftover(id.as_str());
            ooms
        })
        .await
        .unwrap_or(0);
        // An idle golden member's workspace copies go with it.
        self.workspaces.remove_pool_copies(rec.id.as_str(), &rec.workspaces).await;
        if rec.lifecycle.is_hidden() {
            // Removed on purpose, or an idle pool member no caller ever saw.
            let _ = self.store.remove(rec.id.as_str());
            return None;
        }
        if !rec.lifecycle.is_ended() {
            let reason = match rec.lifecycle {
                Lifecycle::Pending => {
                    TerminationReason::RuntimeError("daemon restarted while the sandbox was being created".into())
                }
                _ if ooms > 0 => TerminationReason::OOMKilled,
                _ => TerminationReason::Killed,
            };
            tracing::info!(sandbox = %rec.id, reason = %reason, "sandbox did not survive the restart");
            let failed = reason.terminal_state() == SandboxState::Failed;
            let stopped = match rec.lifecycle {
                Lifecycle::Pending | Lifecycle::Stopping { .. } => Ok(None),
                _ => rec.apply(Action::Stop, None),
            };
            if let Err(e) = stopped.and_then(|_| rec.apply(Action::Ended { failed }, Some(reason))) {
                tracing::error!(sandbox = %rec.id, error = %e, "recording a lost sandbox's end");
            }
        }
        let _ = self.store.save(rec.id.as_str(), &rec);
        self.publish(rec, Default::default(), None);
        None
    }
}

async fn adopt(engine: &Sandboxes, rec: &SandboxRecord) -> Option<ember_runtime::Launched> {
    let (pid, st) = (rec.pid?, rec.start_time?);
    let rt = engine.rt(&rec.spec.runtime_class);
    let id = rec.id.clone();
    tokio::task::spawn_blocking(move || rt.adopt(&id, pid, st)).await.ok()?.ok()
}

/// Snapshot holds died with the old daemon; the cgroup is set to what the
/// record says now (frozen only if its user paused it), whatever a crash
/// between a freeze and its record left.
async fn converge_freezer(engine: &Sandboxes, rec: &mut SandboxRecord) {
    let before = rec.lifecycle;
    let effect = match rec.apply(Action::Restarted, None) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(sandbox = %rec.id, error = %e, "restart step refused");
            None
        }
    };
    let frozen = rec.lifecycle.frozen();
    if effect.is_some() || frozen {
        let (rt, id) = (engine.rt(&rec.spec.runtime_class), rec.id.clone());
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || rt.freeze(&id, frozen)).await {
            tracing::warn!(sandbox = %rec.id, error = %e, frozen, "setting the freezer after a restart failed");
        }
    }
    if rec.lifecycle != before {
        engine.persist(rec);
    }
}
