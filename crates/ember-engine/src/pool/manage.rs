//! Pool management: create, list, inspect, resize, remove; persisted under
//! `<data>/state/pools`.
use super::plan::Target;
use super::Pools;
use super::{driver, Pool, PoolSpec, PoolStatus};
use crate::{CreateSandbox, EngineError};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How long a pool's removal waits for its refills under way (each one
/// sandbox's create: milliseconds, seconds under load). Past it the removal
/// answers; a late member is still removed when its refill ends.
const REFILLS_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A request to create a pool. Resources default to the template's.
#[derive(Clone, Debug, Default)]
pub struct CreatePool {
    pub name: Option<String>,
    pub template: String,
    pub min: u32,
    pub max: u32,
    pub target: Option<Target>,
    pub memory: Option<String>,
    pub cpu: Option<String>,
    pub pids: Option<u64>,
    pub disk: Option<String>,
    pub runtime_class: Option<String>,
    pub network: Option<ember_types::NetworkMode>,
    pub egress: Option<ember_types::EgressPolicy>,
    /// A golden pool restoring this sandbox snapshot (its template, class and
    /// network are the snapshot's; `template` may be empty).
    pub from_snapshot: Option<String>,
    /// A golden pool from a gVisor checkpoint of this Running runsc sandbox
    /// (`checkpointed.rs`); the sandbox is left checkpointed.
    pub from_checkpoint: Option<String>,
    /// Idle auto-pause for the sandboxes claimed from it.
    pub auto_pause_secs: Option<u64>,
}

/// The most idle sandboxes one pool may hold.
pub const MAX_POOL: u32 = 10_000;

/// Bounds every pool's min, max and fixed target must keep.
pub fn check_bounds(min: u32, max: u32, target: Target) -> Result<(), EngineError> {
    if min > max || max > MAX_POOL {
        return Err(EngineError::invalid("max", format!("need min <= max <= {MAX_POOL} (min {min}, max {max})")));
    }
    if let Target::Fixed(n) = target {
        if n > MAX_POOL {
            return Err(EngineError::invalid("target", format!("at most {MAX_POOL}")));
        }
    }
    Ok(())
}

impl Pools {
    pub async fn create_pool(self: &Arc<Self>, req: CreatePool) -> Result<PoolStatus, EngineError> {
        let golden = req.from_snapshot.is_some() || req.from_checkpoint.is_some();
        let name = match (&req.name, golden) {
            (Some(n), _) => n.clone(),
            (None, false) => req.template.clone(),
            (None, true) => return Err(EngineError::invalid("name", "a golden pool needs a name")),
        };
        ember_types::SandboxId::try_from(name.clone())
            .map_err(|_| EngineError::invalid("name", format!("{name:?}: 1-63 of [a-z0-9-]")))?;
        let target = req.target.unwrap_or(Target::Auto);
        check_bounds(req.min, req.max, target)?;
        let auto_pause_secs = crate::autopause::check(req.auto_pause_secs)?;
        let spec = match (&req.from_snapshot, &req.from_checkpoint) {
            (Some(_), Some(_)) => {
                return Err(EngineError::invalid("fromCheckpoint", "give fromSnapshot or fromCheckpoint"))
            }
            (None, Some(src)) => self.checkpoint_spec(src, &name, &req).await?,
            (Some(sid), None) => self.golden_spec(sid, &name, &req)?,
            (None, None) => self.template_spec(&name, req.clone())?,
        };
        let spec = PoolSpec { target, auto_pause_secs, ..spec };
        let pool = {
            let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            let fresh = !pools.contains_key(&name);
            let pool = Arc::new(Pool::new(spec.clone()));
            if fresh {
                pools.insert(name.clone(), pool.clone());
            }
            fresh.then_some(pool)
        };
        let Some(pool) = pool else {
            // Another create of that name won while this one primed its start.
            self.drop_checkpoint_start(&spec).await;
            return Err(EngineError::PoolExists(name));
        };
        // Its snapshot cannot be deleted under it from now on (`pins.rs`).
        let pinned = match &spec.from_snapshot {
            Some(sid) => self.snapshots.pin(sid, &name),
            None => Ok(()),
        };
        if let Err(e) = pinned.and_then(|()| self.pool_store.save(&name, &spec)) {
            self.pools.lock().unwrap_or_else(|p| p.into_inner()).remove(&name);
            if let Some(sid) = &spec.from_snapshot {
                self.snapshots.unpin(sid, &name);
            }
            self.drop_checkpoint_start(&spec).await;
            return Err(e);
        }
        driver::spawn(self, pool);
        self.pool_status(&name).await
    }

    /// The spec of a pool of `req.template`, its resources the template's
    /// with the request's over them.
    fn template_spec(&self, name: &str, req: CreatePool) -> Result<PoolSpec, EngineError> {
        let sandbox = self.catalog.resolve(&CreateSandbox {
            template: Some(req.template),
            memory: req.memory,
            cpu: req.cpu,
            pids: req.pids,
            disk: req.disk,
            runtime_class: req.runtime_class,
            network: req.network,
            egress: req.egress,
            ..Default::default()
        })?;
        Ok(PoolSpec {
            name: name.to_string(),
            template: sandbox.template,
            min: req.min,
            max: req.max,
            target: req.target.unwrap_or(Target::Auto),
            resources: sandbox.resources,
            runtime_class: sandbox.runtime_class,
            network: sandbox.network,
            egress: sandbox.egress,
            from_snapshot: None,
            from_checkpoint: None,
            auto_pause_secs: None,
        })
    }

    pub fn pool_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.pools.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect();
        v.sort();
        v
    }

    /// Copies every pool's figures into `m` (at scrape time: the claim path
    /// takes no lock for metrics). `recs` are the sandboxes' records, for the
    /// claimed count: live sandboxes a pool started that a caller holds.
    pub fn refresh_metrics(&self, m: &crate::metrics::PoolGauges, recs: &[crate::record::SandboxRecord]) {
        let pools: Vec<(String, Arc<Pool>)> =
            self.pools.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for f in [&m.idle, &m.starting, &m.target, &m.claimed] {
            f.clear();
        }
        for (name, pool) in pools {
            let l = crate::metrics::PoolLabels { pool: name };
            let claimed = recs
                .iter()
                .filter(|r| r.pool.as_deref() == Some(l.pool.as_str()) && !r.state.is_terminal())
                .filter(|r| r.lifecycle != ember_types::lifecycle::Lifecycle::Pooled)
                .count();
            m.idle.get_or_create(&l).set(pool.idle_len() as i64);
            m.starting.get_or_create(&l).set(pool.starting.load(Ordering::Relaxed) as i64);
            m.target.get_or_create(&l).set(pool.sizing().target as i64);
            m.claimed.get_or_create(&l).set(claimed as i64);
            for (c, total) in [(&m.claims, &pool.claims_total), (&m.misses, &pool.misses_total)] {
                let c = c.get_or_create(&l);
                c.inc_by(total.load(Ordering::Relaxed).saturating_sub(c.get()));
            }
        }
    }

    pub async fn pool_status(&self, name: &str) -> Result<PoolStatus, EngineError> {
        let pool = self.pool(name)?;
        let idle_ids: Vec<_> = pool.idle.lock().unwrap_or_else(|p| p.into_inner()).iter().cloned().collect();
        let rts = self.runtimes.clone();
        let idle_memory_bytes = tokio::task::spawn_blocking(move || {
            idle_ids.iter().filter_map(|id| rts.all().find_map(|rt| rt.memory_usage(id).ok())).sum::<u64>()
        })
        .await
        .unwrap_or(0);
        let now = crate::record::now_ms();
        Ok(PoolStatus {
            spec: pool.spec(),
            sizing: pool.sizing(),
            idle: pool.idle_len(),
            starting: pool.starting.load(Ordering::Relaxed),
            claims_total: pool.claims_total.load(Ordering::Relaxed),
            misses_total: pool.misses_total.load(Ordering::Relaxed),
            misses_window: super::window_count(&pool.misses, now) as u32,
            create_failures: pool.create_failures.load(Ordering::Relaxed),
            idle_memory_bytes,
            nodes: Vec::new(),
        })
    }

    /// Changes the bounds or the target; the reconciler converges to it.
    pub async fn resize_pool(
        &self,
        name: &str,
        min: Option<u32>,
        max: Option<u32>,
        target: Option<Target>,
    ) -> Result<PoolStatus, EngineError> {
        let pool = self.pool(name)?;
        let mut spec = pool.spec();
        spec.min = min.unwrap_or(spec.min);
        spec.max = max.unwrap_or(spec.max);
        spec.target = target.unwrap_or(spec.target);
        check_bounds(spec.min, spec.max, spec.target)?;
        self.pool_store.save(name, &spec)?;
        *pool.spec.lock().unwrap_or_else(|p| p.into_inner()) = spec;
        pool.wake.notify_one();
        self.pool_status(name).await
    }

    /// Removes the pool and destroys its idle sandboxes (claimed ones are the
    /// callers' and stay).
    pub async fn remove_pool(&self, name: &str) -> Result<(), EngineError> {
        let pool = self.pool(name)?;
        pool.removed.store(true, Ordering::Relaxed);
        pool.wake.notify_one();
        self.pools.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        self.pool_store.remove(name)?;
        while let Some(id) = pool.pop_idle() {
            let _ = self.sandboxes.remove_any(id.as_str()).await;
        }
        // A refill under way ends by removing its member (the pool is marked
        // removed), a golden one's workspace copies with it: waited for, so
        // nothing of the pool outlives the answer (a hidden member and its
        // copy once did, `golden_pools.rs`).
        let deadline = tokio::time::Instant::now() + REFILLS_WAIT;
        while pool.starting.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // After its members: a refill still under way fails once the
        // snapshot is gone, and its member is removed.
        let spec = pool.spec();
        if let Some(sid) = &spec.from_snapshot {
            self.snapshots.unpin(sid, name);
        }
        self.drop_checkpoint_start(&spec).await;
        Ok(())
    }
}
