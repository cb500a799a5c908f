//! Convergence after a restart (including `kill -9` of the daemon): every record
//! is re-adopted or reaped, and every host resource without a record is reaped.
//! The same path runs on every start, so a restart converges instead of replaying.
use crate::record::SandboxRecord;
use crate::{Engine, EngineError, Entry};
use ember_types::{SandboxState, TerminationReason};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Notify};

pub(crate) async fn recover(engine: &Arc<Engine>) -> Result<(), EngineError> {
    for (name, spec) in engine.pool_store.load_all() {
        match spec {
            Ok(spec) => {
                let pool = Arc::new(crate::pool::Pool::new(spec));
                engine.pools.lock().unwrap_or_else(|p| p.into_inner()).insert(name, pool);
            }
            Err(why) => tracing::warn!(pool = %name, why = %why, "unreadable pool record; ignoring it"),
        }
    }
    let mut known = Vec::new();
    for (stem, rec) in engine.store.load_all() {
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
    engine.start_network().await?;
    let pools: Vec<_> = engine.pools.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
    for pool in pools {
        crate::pool::spawn_driver(engine, pool);
    }
    Ok(())
}

async fn recover_one(engine: &Arc<Engine>, mut rec: SandboxRecord) {
    if rec.checkpointed && rec.state == SandboxState::Paused && !rec.deleting {
        // No process to adopt: the image on disk is the sandbox until a resume.
        let socket = engine.rt(&rec.spec.runtime_class).agent_socket_path(&rec.id).unwrap_or_default();
        let (tx, rx) = mpsc::channel(4);
        let entry =
            Arc::new(Entry { record: Mutex::new(rec.clone()), agent_socket: socket, ctl: tx, wake: Notify::new() });
        engine.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).insert(rec.id.clone(), entry.clone());
        tracing::info!(sandbox = %rec.id, "kept checkpointed sandbox");
        crate::monitor::spawn_checkpointed(engine.clone(), entry, rx);
        return;
    }
    let live = matches!(rec.state, SandboxState::Running | SandboxState::Paused);
    if live && !rec.deleting {
        if let (Some(pid), Some(st)) = (rec.pid, rec.start_time) {
            let rt = engine.rt(&rec.spec.runtime_class);
            let id = rec.id.clone();
            let adopted = tokio::task::spawn_blocking(move || rt.adopt(&id, pid, st)).await;
            if let Ok(Ok(launched)) = adopted {
                tracing::info!(sandbox = %rec.id, pid, "re-adopted sandbox");
                engine.adopt_network(&rec).await;
                let (tx, rx) = mpsc::channel(4);
                let entry = Arc::new(Entry {
                    record: Mutex::new(rec.clone()),
                    agent_socket: launched.agent_socket.clone(),
                    ctl: tx,
                    wake: Notify::new(),
                });
                engine.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).insert(rec.id.clone(), entry.clone());
                crate::monitor::spawn(engine.clone(), entry.clone(), launched, rx);
                // Frozen for a snapshot the crash interrupted: give the writer back.
                if rec.snapshot_freeze {
                    let _ = engine.resume(rec.id.as_str()).await;
                    entry.update(|r| r.snapshot_freeze = false);
                    engine.persist(&entry);
                }
                // An idle pooled sandbox goes back to its pool: its record says it
                // was never handed out (a claim persists before it answers).
                if rec.pooled {
                    match rec.pool.as_deref().and_then(|n| engine.pool(n).ok()) {
                        Some(pool) => pool.push_idle(rec.id.clone()),
                        None => {
                            let _ = engine.remove(rec.id.as_str()).await;
                        }
                    }
                }
                return;
            }
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
    if rec.deleting || rec.pooled {
        // Removed on purpose, or an idle pool member no caller ever saw.
        let _ = engine.store.remove(rec.id.as_str());
        return;
    }
    if !rec.state.is_terminal() {
        let reason = match rec.state {
            SandboxState::Pending => {
                TerminationReason::RuntimeError("daemon restarted while the sandbox was being created".into())
            }
            _ if ooms > 0 => TerminationReason::OOMKilled,
            _ => TerminationReason::Killed,
        };
        tracing::info!(sandbox = %rec.id, reason = %reason, "sandbox did not survive the restart");
        rec.transition(reason.terminal_state(), Some(reason));
    }
    let _ = engine.store.save(rec.id.as_str(), &rec);
    let (tx, _rx) = mpsc::channel(1);
    let entry = Arc::new(Entry {
        record: Mutex::new(rec.clone()),
        agent_socket: Default::default(),
        ctl: tx,
        wake: Notify::new(),
    });
    engine.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).insert(rec.id, entry);
}
