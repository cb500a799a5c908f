//! Tenants' quotas across the cluster (docs/tenancy.md, "Quotas across a
//! cluster"): the running sandboxes, memory and cpu of a tenant wherever
//! they run, in the bucket `<prefix>_tenant_usage`, one key per tenant, its
//! value a [`TenantUse`]: the tenant's sandboxes and the holds of creates in
//! flight, each naming its node.
//!
//! Every write is a compare-and-set on the key's revision: an admission
//! reads the value, counts it (skipping entries of nodes this node takes for
//! dead: a dead node's use is given back at MTTD, and counted again if it
//! comes back with its sandboxes), checks the quotas and writes its hold on
//! the revision read. Of two creates on two nodes for the last slot, one
//! write wins; the other reads again and is refused. A settled create turns
//! its hold into the sandbox; a removal drops it. Each node's sweep keeps
//! its own entries true: sandboxes that ended by themselves (exit, TTL) go,
//! holds of creates it no longer runs go (its restart), and its running
//! sandboxes of a tenant the value lacks come back.
use super::mirror::Mirror;
use super::plane::ClusterPlane;
use super::registry::{self, SandboxEntry};
use super::ClusterError;
use async_nats::jetstream::{self, kv};
use ember_engine::tenants::{check, Demand, Kind, SharedQuota, TenantError, Tenants};
use ember_engine::ListFilter;
use ember_types::tenant::{Quotas, Usage, DEFAULT_TENANT};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a change keeps trying (revision conflicts, an election) before
/// the create is a 503 `CLUSTER::BUSY`: never a pass.
const BUDGET: Duration = Duration::from_secs(10);
/// No one read or write waits longer.
const STEP: Duration = Duration::from_secs(2);
/// How often a node's sweep brings its entries in line.
const SWEEP: Duration = Duration::from_secs(1);

/// One tenant's use across the cluster: the value of its key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantUse {
    /// Sandbox id → where it runs and what it holds.
    #[serde(default)]
    pub sandboxes: BTreeMap<String, Share>,
    /// Hold id (`<node>-<boot ms>-<seq>`) → a create admitted, not settled.
    #[serde(default)]
    pub held: BTreeMap<String, Share>,
}

/// One sandbox's (or one create's) part of a tenant's use.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Share {
    pub node: String,
    pub memory_bytes: u64,
    pub cpu_millis: u64,
}

impl TenantUse {
    /// The use of the entries whose node `live` takes for live; holds too
    /// when `with_held` (an admission counts them; `usage` shows sandboxes).
    pub fn count(&self, live: &dyn Fn(&str) -> bool, with_held: bool) -> Usage {
        let mut u = Usage::default();
        let held = self.held.values().filter(|_| with_held);
        for s in self.sandboxes.values().chain(held).filter(|s| live(&s.node)) {
            u.running_sandboxes += 1;
            u.memory_bytes += s.memory_bytes;
            u.cpu_millis += s.cpu_millis;
        }
        u
    }

    /// Node `me`'s entries brought in line with what it runs: its sandboxes
    /// not in `running` dropped, its holds not `pending` dropped, the
    /// tenant's sandboxes `owned` here that lack an entry put. Whether
    /// anything changed.
    pub fn reconcile(
        &mut self,
        me: &str,
        running: &BTreeSet<String>,
        owned: &BTreeMap<String, Share>,
        pending: &BTreeSet<String>,
    ) -> bool {
        let before = (self.sandboxes.len(), self.held.len());
        self.sandboxes.retain(|id, s| s.node != me || running.contains(id));
        self.held.retain(|id, s| s.node != me || pending.contains(id));
        let mut changed = before != (self.sandboxes.len(), self.held.len());
        for (id, s) in owned {
            if !self.sandboxes.contains_key(id) {
                self.sandboxes.insert(id.clone(), s.clone());
                changed = true;
            }
        }
        changed
    }
}

/// The cluster's [`SharedQuota`]: this node's view of the bucket.
pub struct Ledger {
    kv: kv::Store,
    /// The bucket as a watch keeps it: the sweep takes the tenants' names
    /// from it. Listing the keys each second was an ephemeral consumer a
    /// second per node (created and deleted through the meta leader), on
    /// an idle cluster with no tenant too.
    seen: Arc<Mirror>,
    plane: Arc<ClusterPlane>,
    tenants: Arc<Tenants>,
    /// Names this node's holds: unique across its restarts.
    boot: i64,
    seq: AtomicU64,
    /// This node's holds not settled yet (the sweep keeps them).
    pending: Mutex<HashMap<String, Share>>,
}

/// Opens the bucket, makes `tenants`' sandbox quotas the cluster's and
/// starts this node's sweep.
pub async fn share_quotas(plane: &Arc<ClusterPlane>, tenants: Arc<Tenants>) -> Result<(), ClusterError> {
    let js = jetstream::new(plane.nats.clone());
    let replicas = crate::replicas::for_cluster(&plane.nats, plane.cfg.servers.len()).await;
    let name = format!("{}_tenant_usage", plane.cfg.prefix);
    let kv = registry::bucket(&js, name, replicas, Duration::ZERO).await?;
    let ledger = Arc::new(Ledger {
        seen: Mirror::spawn(kv.clone()),
        kv,
        plane: plane.clone(),
        tenants: tenants.clone(),
        boot: ember_engine::record::now_ms(),
        seq: AtomicU64::new(0),
        pending: Mutex::default(),
    });
    tenants.share_quota(ledger.clone());
    tokio::spawn(ledger.sweep_loop());
    Ok(())
}

fn busy(tenant: &str, reason: impl std::fmt::Display) -> TenantError {
    TenantError::Cluster { tenant: tenant.to_string(), reason: reason.to_string() }
}

impl Ledger {
    fn me(&self) -> &str {
        self.plane.name()
    }

    /// Whether `node`'s entries count: this node, or one it takes for live.
    fn live(&self, node: &str) -> bool {
        node == self.me() || self.plane.nodes.get(node).is_ok()
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashMap<String, Share>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `tenant`'s value and revision (`None`: no key yet).
    async fn read(&self, tenant: &str) -> Result<(TenantUse, Option<u64>), String> {
        let entry = tokio::time::timeout(STEP, self.kv.entry(tenant)).await;
        match entry.map_err(|_| format!("no answer within {STEP:?}"))?.map_err(|e| e.to_string())? {
            None => Ok((TenantUse::default(), None)),
            Some(e) if e.operation != kv::Operation::Put => Ok((TenantUse::default(), Some(e.revision))),
            // Unreadable is an error, never an empty count (that would pass anything).
            Some(e) => {
                Ok((serde_json::from_slice(&e.value).map_err(|e| format!("unreadable: {e}"))?, Some(e.revision)))
            }
        }
    }

    /// Writes `u` on revision `rev`; `Err` on a conflict or a failure.
    async fn write(&self, tenant: &str, u: &TenantUse, rev: Option<u64>) -> Result<(), String> {
        let value: bytes::Bytes = serde_json::to_vec(u).map_err(|e| e.to_string())?.into();
        let put = async {
            match rev {
                Some(r) => self.kv.update(tenant, value, r).await.map(drop).map_err(|e| e.to_string()),
                None => self.kv.create(tenant, value).await.map(drop).map_err(|e| e.to_string()),
            }
        };
        tokio::time::timeout(STEP, put).await.map_err(|_| format!("no answer within {STEP:?}"))?
    }

    /// Applies `f` to `tenant`'s value by compare-and-set, read again after
    /// a conflict (with jitter), for up to [`BUDGET`]. `f` answers whether
    /// it changed the value (nothing is written otherwise) or refuses.
    async fn change(
        &self,
        tenant: &str,
        mut f: impl FnMut(&mut TenantUse) -> Result<bool, TenantError>,
    ) -> Result<(), TenantError> {
        let start = tokio::time::Instant::now();
        loop {
            let failed = match self.read(tenant).await {
                Ok((mut u, rev)) => match f(&mut u)? {
                    false => return Ok(()),
                    true => match self.write(tenant, &u, rev).await {
                        Ok(()) => return Ok(()),
                        Err(e) => e,
                    },
                },
                Err(e) => e,
            };
            if start.elapsed() > BUDGET {
                return Err(busy(tenant, format!("no write took within {BUDGET:?}: {failed}")));
            }
            tokio::time::sleep(Duration::from_millis(fastrand::u64(1..=20))).await;
        }
    }

    /// The node sandbox `id` runs on, as the sandbox registry says (a warm
    /// claim or an API-only node's create runs elsewhere); this node if the
    /// registry does not say.
    async fn node_of(&self, id: &str) -> String {
        let got = tokio::time::timeout(STEP, self.plane.sandboxes.get(id)).await;
        let entry = got.ok().and_then(Result::ok).flatten();
        entry.and_then(|v| serde_json::from_slice::<SandboxEntry>(&v).ok()).map_or_else(|| self.me().into(), |e| e.node)
    }

    async fn sweep_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(SWEEP);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.sweep().await {
                tracing::warn!(node = %self.me(), error = %e, "tenant quota sweep");
            }
        }
    }

    /// One pass: every tenant's value read, then this node's sandboxes
    /// listed (after the reads: a sandbox settled before a read was made
    /// before it, so it is listed), then each value changed on the revision
    /// read (a conflict waits for the next pass).
    async fn sweep(&self) -> Result<(), String> {
        let mut names: BTreeSet<String> = match self.seen.entries() {
            Some(entries) => entries.into_iter().map(|(k, _, _)| k).collect(),
            None => return Ok(()),
        };
        let tenants: BTreeSet<String> = self.tenants.list().into_iter().map(|t| t.name).collect();
        names.extend(tenants.iter().cloned());
        // The default tenant has no quotas and is never written (below).
        names.remove(DEFAULT_TENANT);
        if names.is_empty() {
            return Ok(());
        }
        let mut read = Vec::new();
        for t in names {
            read.push((self.read(&t).await?, t));
        }
        let all = self.plane.local.list(&ListFilter::default()).await.map_err(|e| e.to_string())?;
        let alive: Vec<_> = all.into_iter().filter(|r| !r.state.is_terminal()).collect();
        let running: BTreeSet<String> = alive.iter().map(|r| r.id.as_str().to_string()).collect();
        let pending: BTreeSet<String> = self.pending().keys().cloned().collect();
        for ((mut u, rev), tenant) in read {
            let owned: BTreeMap<String, Share> = alive
                .iter()
                .filter(|r| tenants.contains(&tenant) && self.tenants.owner(Kind::Sandbox, r.id.as_str()) == tenant)
                .map(|r| {
                    (r.id.as_str().to_string(), self.share(r.spec.resources.memory_bytes, r.spec.resources.cpu_millis))
                })
                .collect();
            if tenant != DEFAULT_TENANT && u.reconcile(self.me(), &running, &owned, &pending) {
                if let Err(e) = self.write(&tenant, &u, rev).await {
                    tracing::debug!(%tenant, error = %e, "tenant quota sweep: the value changed, next pass");
                }
            }
        }
        Ok(())
    }

    fn share(&self, memory_bytes: u64, cpu_millis: u64) -> Share {
        Share { node: self.me().to_string(), memory_bytes, cpu_millis }
    }
}

#[async_trait::async_trait]
impl SharedQuota for Ledger {
    async fn admit(&self, tenant: &str, quotas: &Quotas, demand: &Demand) -> Result<String, TenantError> {
        let id = format!("{}-{}-{}", self.me(), self.boot, self.seq.fetch_add(1, Ordering::Relaxed));
        let share = self.share(demand.memory_bytes, demand.cpu_millis);
        // Pending before it is written: the sweep never drops a hold in flight.
        self.pending().insert(id.clone(), share.clone());
        let asked = Demand {
            sandboxes: 1,
            memory_bytes: share.memory_bytes,
            cpu_millis: share.cpu_millis,
            ..Default::default()
        };
        let out = self
            .change(tenant, |u| {
                check(tenant, quotas, &u.count(&|n| self.live(n), true), &asked)?;
                u.held.insert(id.clone(), share.clone());
                Ok(true)
            })
            .await;
        if out.is_err() {
            self.pending().remove(&id);
        }
        out.map(|()| id)
    }

    async fn settle(&self, tenant: &str, ticket: &str, sandbox: Option<&str>) -> Result<(), TenantError> {
        let mine = self.pending().get(ticket).cloned().unwrap_or_else(|| self.share(0, 0));
        let placed = match sandbox {
            Some(id) => Some((id, Share { node: self.node_of(id).await, ..mine })),
            None => None,
        };
        let out = self
            .change(tenant, |u| {
                let dropped = u.held.remove(ticket).is_some();
                match &placed {
                    Some((id, s)) => Ok(u.sandboxes.insert(id.to_string(), s.clone()).as_ref() != Some(s) || dropped),
                    None => Ok(dropped),
                }
            })
            .await;
        self.pending().remove(ticket);
        out
    }

    async fn release(&self, tenant: &str, sandbox: &str) -> Result<(), TenantError> {
        self.change(tenant, |u| Ok(u.sandboxes.remove(sandbox).is_some())).await
    }

    /// Read through an election as a change is (it is on the create path).
    async fn usage(&self, tenant: &str) -> Result<Usage, TenantError> {
        let start = tokio::time::Instant::now();
        loop {
            match self.read(tenant).await {
                Ok((u, _)) => return Ok(u.count(&|n| self.live(n), false)),
                Err(e) if start.elapsed() > BUDGET => return Err(busy(tenant, e)),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(node: &str) -> Share {
        Share { node: node.into(), memory_bytes: 1 << 29, cpu_millis: 1000 }
    }

    #[test]
    fn a_dead_nodes_entries_are_not_counted_and_holds_only_when_asked() {
        let mut u = TenantUse::default();
        u.sandboxes.insert("s1".into(), share("a"));
        u.sandboxes.insert("s2".into(), share("b"));
        u.held.insert("a-1-0".into(), share("a"));
        let all = u.count(&|_| true, true);
        assert_eq!((all.running_sandboxes, all.memory_bytes, all.cpu_millis), (3, 3 << 29, 3000));
        assert_eq!(u.count(&|_| true, false).running_sandboxes, 2);
        let b_dead = u.count(&|n| n != "b", true);
        assert_eq!((b_dead.running_sandboxes, b_dead.cpu_millis), (2, 2000));
    }

    #[test]
    fn a_sweep_touches_its_own_nodes_entries_alone() {
        let mut u = TenantUse::default();
        u.sandboxes.insert("ended".into(), share("a"));
        u.sandboxes.insert("runs".into(), share("a"));
        u.sandboxes.insert("elsewhere".into(), share("b"));
        u.held.insert("a-1-0".into(), share("a"));
        u.held.insert("a-1-1".into(), share("a"));
        u.held.insert("b-1-0".into(), share("b"));
        let running: BTreeSet<String> = ["runs".to_string(), "lost".to_string()].into();
        let owned: BTreeMap<String, Share> = [("lost".to_string(), share("a"))].into();
        let pending: BTreeSet<String> = ["a-1-1".to_string()].into();
        assert!(u.reconcile("a", &running, &owned, &pending));
        let ids: Vec<&str> = u.sandboxes.keys().map(String::as_str).collect();
        assert_eq!(ids, ["elsewhere", "lost", "runs"]);
        let held: Vec<&str> = u.held.keys().map(String::as_str).collect();
        assert_eq!(held, ["a-1-1", "b-1-0"]);
        assert!(!u.reconcile("a", &running, &owned, &pending), "a second pass changed something");
    }
}
