//! Warm pools: per template, sandboxes started ahead of demand and claimed in
//! about a millisecond. A level-triggered reconciler (`driver.rs`) keeps the
//! idle count at a target computed by `plan.rs`; claims (`claim.rs`) pop an
//! idle sandbox and bind the caller's env, user, TTL and entrypoint to it.
//!
//! Single use: a claimed sandbox is never returned to a pool; when it is
//! removed or expires it is destroyed like any other.
mod checkpointed;
mod claim;
mod driver;
mod gate;
mod golden;
mod manage;
pub mod plan;
mod standby;

pub use manage::{check_bounds, CreatePool, MAX_POOL};
pub use plan::Target;
pub use standby::STANDBY;

use crate::catalog::Catalog;
use crate::record::now_ms;
use crate::sandbox::{IdleEnded, IdleMember, Sandboxes};
use crate::snapshots::Snapshots;
use crate::store::Store;
use crate::workspaces::Workspaces;
use crate::EngineError;
use ember_runtime::Runtimes;
use ember_types::{Resources, SandboxId};
use plan::Sizing;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// How far back the arrival rate and the misses are counted.
pub const WINDOW: Duration = Duration::from_secs(60);

/// A pool as configured (persisted).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    pub name: String,
    pub template: String,
    pub min: u32,
    pub max: u32,
    pub target: Target,
    pub resources: Resources,
    pub runtime_class: String,
    /// Idle sandboxes are started with this network and policy, so a claim
    /// with egress finds its slot joined and policed already.
    #[serde(default)]
    pub network: ember_types::NetworkMode,
    #[serde(default)]
    pub egress: ember_types::EgressPolicy,
    /// A golden pool: each member's writable layer is restored from this
    /// sandbox snapshot before its init starts, and only a create restoring
    /// that snapshot claims one (`golden.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<String>,
    /// A golden pool from a gVisor checkpoint of this sandbox: its snapshot
    /// (`from_snapshot`, the pool's own) gives each member's writable layer,
    /// and each member is restored from the pool's copy of the checkpoint
    /// image, with the source's processes and memory (`checkpointed.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_checkpoint: Option<String>,
    /// Idle auto-pause given to the sandboxes claimed from the pool, unless
    /// the claim asks for its own (docs/auto-pause.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_secs: Option<u64>,
}

/// What `ember pool inspect` shows: the configuration, the arithmetic and the state.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolStatus {
    pub spec: PoolSpec,
    pub sizing: Sizing,
    pub idle: u32,
    pub starting: u32,
    pub claims_total: u64,
    pub misses_total: u64,
    pub misses_window: u32,
    pub create_failures: u64,
    pub idle_memory_bytes: u64,
    /// Each node's part of a cluster's pool (empty on a node on its own).
    pub nodes: Vec<PoolNodeStatus>,
}

/// One node's part of a cluster's pool: its share of the target, its idle
/// and starting members (docs/cluster.md, "Pools on a cluster").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolNodeStatus {
    pub node: String,
    pub target: u32,
    pub idle: u32,
    pub starting: u32,
}

/// The live state of one pool. std Mutexes: short sections, never held
/// across an await.
pub(crate) struct Pool {
    pub spec: Mutex<PoolSpec>,
    /// Ready sandboxes, oldest first.
    pub idle: Mutex<VecDeque<SandboxId>>,
    pub starting: AtomicU32,
    pub claims: Mutex<VecDeque<i64>>,
    pub misses: Mutex<VecDeque<i64>>,
    pub claims_total: AtomicU64,
    pub misses_total: AtomicU64,
    pub create_failures: AtomicU64,
    /// EWMA of cold launch time in µs (0 until the first launch).
    pub refill_us: AtomicU64,
    /// Wakes the driver: a claim happened, or the spec changed.
    pub wake: Notify,
    pub removed: AtomicBool,
}

fn window_push(q: &Mutex<VecDeque<i64>>, now: i64) {
    let mut q = q.lock().unwrap_or_else(|p| p.into_inner());
    q.push_back(now);
    let cutoff = now - WINDOW.as_millis() as i64;
    while q.front().is_some_and(|t| *t < cutoff) {
        q.pop_front();
    }
}

pub(crate) fn window_count(q: &Mutex<VecDeque<i64>>, now: i64) -> usize {
    let cutoff = now - WINDOW.as_millis() as i64;
    q.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|t| **t >= cutoff).count()
}

impl Pool {
    pub fn new(spec: PoolSpec) -> Pool {
        Pool {
            spec: Mutex::new(spec),
            idle: Mutex::new(VecDeque::new()),
            starting: AtomicU32::new(0),
            claims: Mutex::new(VecDeque::new()),
            misses: Mutex::new(VecDeque::new()),
            claims_total: AtomicU64::new(0),
            misses_total: AtomicU64::new(0),
            create_failures: AtomicU64::new(0),
            refill_us: AtomicU64::new(0),
            wake: Notify::new(),
            removed: AtomicBool::new(false),
        }
    }

    pub fn spec(&self) -> PoolSpec {
        self.spec.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn pop_idle(&self) -> Option<SandboxId> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop_front()
    }

    pub fn push_idle(&self, id: SandboxId) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).push_back(id);
    }

    /// A refilled member joins the idle ones unless the pool already holds
    /// its `max` of them: a pool shrunk (to none, say) while the member
    /// started never hands it out, where the reconciler's trim came only
    /// after it had been claimable (a checkpoint pool resized to 0 served a
    /// claim instead of `POOL::EMPTY`). Checked and pushed under one lock,
    /// so two refills ending at once cannot both pass the last place.
    pub fn push_refilled(&self, id: SandboxId) -> Result<(), SandboxId> {
        let max = self.spec.lock().unwrap_or_else(|p| p.into_inner()).max;
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() >= max as usize {
            return Err(id);
        }
        idle.push_back(id);
        Ok(())
    }

    pub fn idle_len(&self) -> u32 {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).len() as u32
    }

    pub fn record_claim(&self) {
        self.claims_total.fetch_add(1, Ordering::Relaxed);
        window_push(&self.claims, now_ms());
        self.wake.notify_one();
    }

    pub fn record_miss(&self) {
        self.misses_total.fetch_add(1, Ordering::Relaxed);
        window_push(&self.misses, now_ms());
        window_push(&self.claims, now_ms());
        self.wake.notify_one();
    }

    pub fn record_refill(&self, micros: u64) {
        let old = self.refill_us.load(Ordering::Relaxed);
        let new = if old == 0 { micros } else { (old * 4 + micros) / 5 };
        self.refill_us.store(new, Ordering::Relaxed);
    }

    /// The sizing from the last window's arrivals and the refill EWMA.
    pub fn sizing(&self) -> Sizing {
        let spec = self.spec();
        let now = now_ms();
        let arrivals = window_count(&self.claims, now) as f64 / WINDOW.as_secs_f64();
        let refill = self.refill_us.load(Ordering::Relaxed) as f64 / 1e6;
        plan::size(spec.target, spec.min, spec.max, arrivals, refill)
    }
}

/// The warm pools of this node: their specs (in memory and on disk), their
/// idle members and counters, one reconciler each. Sandboxes are launched,
/// claimed and removed through the sandbox service.
pub(crate) struct Pools {
    /// A std Mutex: lookups and inserts only, never held across an await.
    pools: Mutex<HashMap<String, Arc<Pool>>>,
    pool_store: Store<PoolSpec>,
    sandboxes: Arc<Sandboxes>,
    workspaces: Arc<Workspaces>,
    catalog: Arc<Catalog>,
    runtimes: Runtimes,
    /// Where a golden pool's members start from.
    snapshots: Arc<Snapshots>,
    /// The node's refills leave a core to its claims (`gate.rs`).
    gate: gate::RefillGate,
}

/// What a pool reads and starts its members through.
pub(crate) struct PoolDeps {
    pub sandboxes: Arc<Sandboxes>,
    pub workspaces: Arc<Workspaces>,
    pub catalog: Arc<Catalog>,
    pub runtimes: Runtimes,
    pub snapshots: Arc<Snapshots>,
}

impl Pools {
    pub fn open(cfg: &crate::EngineConfig, deps: PoolDeps) -> Result<Pools, EngineError> {
        let pool_store = Store::open(cfg.data_dir.join("state/pools"))?;
        let pools = Mutex::new(HashMap::new());
        let PoolDeps { sandboxes, workspaces, catalog, runtimes, snapshots } = deps;
        let gate = gate::RefillGate::for_this_node();
        Ok(Pools { pools, pool_store, sandboxes, workspaces, catalog, runtimes, snapshots, gate })
    }

    /// After a restart: the pools on disk, each with no idle member yet.
    pub fn load(&self) {
        for (name, spec) in self.pool_store.recover_all() {
            match spec {
                Ok(spec) => {
                    if let Some(sid) = &spec.from_snapshot {
                        self.snapshots.repin(sid, &spec.name);
                    }
                    let pool = Arc::new(Pool::new(spec));
                    self.pools.lock().unwrap_or_else(|p| p.into_inner()).insert(name, pool);
                }
                Err(why) => tracing::warn!(pool = %name, why = %why, "unreadable pool record; ignoring it"),
            }
        }
    }

    /// Idle members re-adopted after a restart go back to their pool; those
    /// of a pool that is gone are removed.
    pub async fn adopt_idle(&self, members: Vec<IdleMember>) {
        for m in members {
            match m.pool.as_deref().and_then(|n| self.pool(n).ok()) {
                Some(pool) => pool.push_idle(m.id),
                None => {
                    let _ = self.sandboxes.remove_any(m.id.as_str()).await;
                }
            }
        }
    }

    /// Starts every pool's reconciler.
    pub fn start(self: &Arc<Self>) {
        let pools: Vec<_> = self.pools.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        for pool in pools {
            driver::spawn(self, pool);
        }
    }

    pub(crate) fn pool(&self, name: &str) -> Result<Arc<Pool>, EngineError> {
        self.pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::PoolNotFound(name.to_string()))
    }

    /// The pool a create with this spec may claim from, among those
    /// `may_claim` lets it (a tenant's own: `Tenants::may_claim`); a pool
    /// named and not let is not found, as its own route would answer.
    pub(crate) fn matching_pool(
        &self,
        spec: &ember_types::SandboxSpec,
        name: Option<&str>,
        may_claim: &dyn Fn(&str) -> bool,
    ) -> Result<Option<Arc<Pool>>, EngineError> {
        // Volumes are mounts made at launch; an idle pooled sandbox has none.
        if !spec.volumes.is_empty() {
            if let Some(n) = name {
                return Err(EngineError::invalid("poolRef", format!("pool {n}: volumes cannot be bound at claim")));
            }
            return Ok(None);
        }
        if let Some(n) = name {
            if !may_claim(n) {
                return Err(EngineError::PoolNotFound(n.to_string()));
            }
            let p = self.pool(n)?;
            let ps = p.spec();
            if let Some(sid) = &ps.from_snapshot {
                return Err(EngineError::invalid(
                    "poolRef",
                    format!("pool {n} is golden: create with snapshotId {sid} to claim from it"),
                ));
            }
            if ps.template != spec.template || ps.runtime_class != spec.runtime_class {
                return Err(EngineError::invalid(
                    "poolRef",
                    format!("pool {n} serves template {} ({})", ps.template, ps.runtime_class),
                ));
            }
            if ps.network != spec.network || (ps.network != ember_types::NetworkMode::None && ps.egress != spec.egress)
            {
                return Err(EngineError::invalid(
                    "poolRef",
                    format!("pool {n} serves network {:?} with another policy; ask for the same network", ps.network),
                ));
            }
            return Ok(Some(p));
        }
        Ok(self.find_pool(|ps| {
            may_claim(&ps.name)
                && ps.from_snapshot.is_none()
                && ps.template == spec.template
                && ps.resources == spec.resources
                && ps.runtime_class == spec.runtime_class
                && ps.network == spec.network
                && (ps.network == ember_types::NetworkMode::None || ps.egress == spec.egress)
        }))
    }

    /// A pool whose spec `matches`.
    pub(crate) fn find_pool(&self, matches: impl Fn(&PoolSpec) -> bool) -> Option<Arc<Pool>> {
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools.values().find(|p| matches(&p.spec())).cloned()
    }
}

/// Idle pool members that ended (sent by their monitors): their pool stops
/// counting them, and its reconciler refills.
pub(crate) async fn idle_ended_loop(
    engine: std::sync::Weak<Pools>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<IdleEnded>,
) {
    while let Some(ev) = rx.recv().await {
        let Some(engine) = engine.upgrade() else { return };
        if let Ok(pool) = engine.pool(&ev.pool) {
            pool.idle.lock().unwrap_or_else(|p| p.into_inner()).retain(|i| *i != ev.id);
            pool.wake.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> SandboxId {
        SandboxId::from_random(crate::create::random16())
    }

    #[test]
    fn a_refilled_member_past_the_max_is_never_idle() {
        let pool = Pool::new(PoolSpec { max: 2, ..checkpointed::empty() });
        assert!(pool.push_refilled(id()).is_ok() && pool.push_refilled(id()).is_ok());
        let extra = id();
        assert_eq!(pool.push_refilled(extra.clone()), Err(extra), "a third member in a pool of at most 2");
        // Resized to none while two refills were under way: both are refused.
        pool.spec.lock().unwrap().max = 0;
        while pool.pop_idle().is_some() {}
        assert!(pool.push_refilled(id()).is_err() && pool.push_refilled(id()).is_err());
        assert_eq!(pool.idle_len(), 0);
    }
}
