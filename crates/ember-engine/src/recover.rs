//! Convergence after a restart (including `kill -9` of the daemon): every record
//! is re-adopted or reaped, and every host resource without a record is reaped.
//! The same path runs on every start, so a restart converges instead of replaying.
use crate::record::SandboxRecord;
use crate::{Engine, EngineError};
use ember_types::lifecycle::{Action, Lifecycle};
use ember_types::{SandboxState, TerminationReason};
use std::sync::Arc;

pub(crate) async fn recover(engine: &Arc<Engine>) -> Result<(), EngineError> {
    for (name, spec) in engine.pool_store.recover_all() {
        match spec {
            Ok(spec) => {
                let pool = Arc::new(crate::pool::Pool::new(spec));
                engine.pools.lock().unwrap_or_else(|p| p.into_inner()).insert(name, pool);
            }
            Err(why) => tracing::warn!(pool = %name, why = %why, "unreadable pool record; ignoring it"),
        }
    }
    let mut known = Vec::new();
    for (stem, rec) in engine.store.recover_all() {
        match rec {
            Ok(rec) => {
                known.push(rec.id.to_string());
                recover_one(engine, rec).await;
            }
            Err(why) => {
                tracing::warn!(file = %stem, why = %why, "unreadable sandbox record; reaping its resources");
                let _ = engine.store.remove(&stem);
            }
        }
    }
    for rt in engine.runtimes.all().cloned().collect::<Vec<_>>() {
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
    crate::sandbox_snapshots::recover(engine).await?;
    engine.network.start().await?;
    let pools: Vec<_> = engine.pools.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
    for pool in pools {
        crate::pool::spawn_driver(engine, pool);
    }
    Ok(())
}

async fn recover_one(engine: &Arc<Engine>, mut rec: SandboxRecord) {
    rec.migrate();
    if rec.lifecycle == Lifecycle::Checkpointed {
        // No process to adopt: the image on disk is the sandbox until a resume.
        let socket = engine.rt(&rec.spec.runtime_class).agent_socket_path(&rec.id).unwrap_or_default();
        tracing::info!(sandbox = %rec.id, "kept checkpointed sandbox");
        crate::sandbox::publish(engine, rec, socket, None);
        return;
    }
    if matches!(rec.lifecycle, Lifecycle::Live { .. } | Lifecycle::Pooled) {
        if let Some(launched) = adopt(engine, &rec).await {
            tracing::info!(sandbox = %rec.id, pid = launched.pid, "re-adopted sandbox");
            engine.network.adopt(&rec).await;
            converge_freezer(engine, &mut rec).await;
            let pooled = rec.lifecycle == Lifecycle::Pooled;
            let (id, pool) = (rec.id.clone(), rec.pool.clone());
            let socket = launched.agent_socket.clone();
            crate::sandbox::publish(engine, rec, socket, Some(launched));
            // An idle pooled sandbox goes back to its pool: its record says it
            // was never handed out (a claim persists before it answers).
            if pooled {
                match pool.as_deref().and_then(|n| engine.pool(n).ok()) {
                    Some(pool) => pool.push_idle(id),
                    None => {
                        let _ = engine.remove_any(id.as_str()).await;
                    }
                }
            }
            return;
        }
    }
    // Not adoptable: whatever is left of it goes.
    let rt = engine.rt(&rec.spec.runtime_class);
    let id = rec.id.clone();
    let ooms = tokio::task::spawn_blocking(move || {
        let ooms = rt.oom_kills(&id).unwrap_or(0);
        let _ = rt.reap_leftover(id.as_str());
        ooms
    })
    .await
    .unwrap_or(0);
    if rec.lifecycle.is_hidden() {
        // Removed on purpose, or an idle pool member no caller ever saw.
        let _ = engine.store.remove(rec.id.as_str());
        return;
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
    let _ = engine.store.save(rec.id.as_str(), &rec);
    crate::sandbox::publish(engine, rec, Default::default(), None);
}

async fn adopt(engine: &Arc<Engine>, rec: &SandboxRecord) -> Option<ember_runtime::Launched> {
    let (pid, st) = (rec.pid?, rec.start_time?);
    let rt = engine.rt(&rec.spec.runtime_class);
    let id = rec.id.clone();
    tokio::task::spawn_blocking(move || rt.adopt(&id, pid, st)).await.ok()?.ok()
}

/// Snapshot holds died with the old daemon; the cgroup is set to what the
/// record says now (frozen only if its user paused it), whatever a crash
/// between a freeze and its record left.
async fn converge_freezer(engine: &Arc<Engine>, rec: &mut SandboxRecord) {
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
