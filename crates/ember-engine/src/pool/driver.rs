//! The pool reconciler: compares the target idle count with what is idle and
//! starting, and starts or removes sandboxes to match. Level-triggered: it
//! re-reads everything each round, so a restart or a missed wake-up converges.
use super::plan::{plan, Action};
use super::Pool;
use super::Pools;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

pub(crate) fn spawn(engine: &Arc<Pools>, pool: Arc<Pool>) {
    tokio::spawn(run(Arc::downgrade(engine), pool));
}

async fn run(engine: Weak<Pools>, pool: Arc<Pool>) {
    let mut failures = 0u32;
    loop {
        if pool.removed.load(Ordering::Relaxed) {
            return;
        }
        let Some(engine) = engine.upgrade() else { return };
        // The target and the starts at once are both planned (plan::size):
        // a fixed two at a time saturates once λ·W nears 2.
        let sizing = pool.sizing();
        let idle = pool.idle_len();
        let starting = pool.starting.load(Ordering::Relaxed);
        match plan(sizing.target, idle, starting, sizing.refill_parallel) {
            Some(Action::Create(n)) => {
                for _ in 0..n {
                    pool.starting.fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(refill_one(engine.clone(), pool.clone()));
                }
            }
            Some(Action::Destroy(n)) => {
                for _ in 0..n {
                    // The newest go first: the oldest have waited longest and are
                    // as good as any.
                    let newest = pool.idle.lock().unwrap_or_else(|p| p.into_inner()).pop_back();
                    if let Some(id) = newest {
                        let _ = engine.sandboxes.remove_any(id.as_str()).await;
                    }
                }
            }
            None => {}
        }
        // Back off while creates keep failing, so a broken template does not spin.
        let f = pool.create_failures.load(Ordering::Relaxed) as u32;
        let backoff = if f > failures { Duration::from_millis(200 << (f - failures).min(6)) } else { Duration::ZERO };
        failures = f;
        drop(engine);
        tokio::select! {
            _ = pool.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(500).max(backoff)) => {}
        }
    }
}

async fn refill_one(engine: Arc<Pools>, pool: Arc<Pool>) {
    // Counted as starting while it waits, so the plan does not start more.
    let _turn = engine.gate.enter().await;
    let spec = pool.spec();
    let t0 = Instant::now();
    let member = match &spec.from_snapshot {
        Some(sid) => engine.golden_member(sid, &spec).map(|(s, image, seed)| (s, image, Some(seed))),
        None => engine.catalog.pooled_spec(&spec).map(|s| (s, None, None)),
    };
    let launched = match member {
        Ok((sandbox, image, seed)) => engine.sandboxes.launch(sandbox, image, Some(spec.name.clone()), t0, seed).await,
        Err(e) => Err(e),
    };
    // A golden member's workspaces: copies of the snapshot's, its own.
    let launched = match (launched, &spec.from_snapshot) {
        (Ok(rec), Some(sid)) => engine.golden_workspaces(sid, &rec).await.map(|()| rec),
        (res, _) => res,
    };
    match launched {
        Ok(rec) => {
            pool.record_refill(t0.elapsed().as_micros() as u64);
            let extra = match pool.removed.load(Ordering::Relaxed) {
                true => Some(rec.id),
                false => pool.push_refilled(rec.id).err(),
            };
            if let Some(id) = extra {
                let _ = engine.sandboxes.remove_any(id.as_str()).await;
            }
        }
        Err(e) => {
            pool.create_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(pool = %spec.name, error = %e, "pool refill failed");
        }
    }
    pool.starting.fetch_sub(1, Ordering::Relaxed);
    pool.wake.notify_one();
}
