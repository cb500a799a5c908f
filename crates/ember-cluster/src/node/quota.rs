//! Tenants' quotas across the cluster (docs/tenancy.md, "Quotas across a
//! cluster"): in the bucket `<prefix>_tenant_usage`, one key per tenant, its
//! value a [`TenantUse`]: the tenant's sandboxes wherever they run, the
//! holds of creates in flight (a sandbox's, or another object's that a
//! quota limits), each naming its node, and its creates-per-second bucket.
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
//!
//! The other objects (pools, workspaces, tasks, snapshots) are counted by
//! the API wherever they are ([`Count`]), between the ledger's read and its
//! write: of two creates racing through two nodes, the one whose write
//! lands second read the value again and counts again, and sees the first
//! one's hold or, once it is settled, its object (the settled hold counts on
//! until the count has the object, [`SETTLED_FOR_MS`]).
//!
//! [`SETTLED_FOR_MS`]: super::tenant_use::SETTLED_FOR_MS
use super::mirror::Mirror;
use super::plane::ClusterPlane;
use super::registry::{self, SandboxEntry};
use super::tenant_use::{Share, TenantUse};
use super::ClusterError;
use async_nats::jetstream::{self, kv};
use ember_engine::record::now_ms;
use ember_engine::tenants::{check, Count, Counted, Demand, Kind, SharedQuota, TenantError, Tenants};
use ember_engine::ListFilter;
use ember_types::tenant::{Quotas, Usage, DEFAULT_TENANT};
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
            if tenant != DEFAULT_TENANT && u.reconcile(self.me(), &running, &owned, &pending, now_ms()) {
                if let Err(e) = self.write(&tenant, &u, rev).await {
                    tracing::debug!(%tenant, error = %e, "tenant quota sweep: the value changed, next pass");
                }
            }
        }
        Ok(())
    }

    fn share(&self, memory_bytes: u64, cpu_millis: u64) -> Share {
        Share { node: self.me().to_string(), memory_bytes, cpu_millis, sandboxes: 1, ..Default::default() }
    }

    /// One try of [`SharedQuota::admit`]: the value read, the objects
    /// counted after it (when a quota limits them), the demand checked and
    /// the hold written on the revision read. `Ok(Err(_))`: a failure to
    /// read or write (a conflict among them), tried again.
    async fn admit_once(
        &self,
        tenant: &str,
        quotas: &Quotas,
        demand: &Demand,
        hold: (&str, &Share),
        count: &dyn Count,
    ) -> Result<Result<(), String>, TenantError> {
        let (mut u, rev) = match self.read(tenant).await {
            Ok(read) => read,
            Err(e) => return Ok(Err(e)),
        };
        let counted = match demand.counts_objects(quotas) {
            true => count.count().await?,
            false => Counted::default(),
        };
        let now = now_ms();
        let mut used = u.count(&|n| self.live(n), Some(&counted.objects), now);
        let c = &counted.usage;
        let objects = Demand {
            pool_size: c.pool_size,
            workspace_bytes: c.workspace_bytes,
            tasks: c.tasks,
            snapshot_bytes: c.snapshot_bytes,
            ..Default::default()
        };
        objects.add_to(&mut used);
        check(tenant, quotas, &used, &Demand { rate_limited: false, ..*demand })?;
        if let Some(rate) = quotas.creates_per_second.filter(|_| demand.rate_limited) {
            u.take_token(tenant, rate, now)?;
        }
        u.held.insert(hold.0.to_string(), hold.1.clone());
        Ok(self.write(tenant, &u, rev).await)
    }
}

#[async_trait::async_trait]
impl SharedQuota for Ledger {
    async fn admit(
        &self,
        tenant: &str,
        quotas: &Quotas,
        demand: &Demand,
        count: &dyn Count,
    ) -> Result<String, TenantError> {
        let id = format!("{}-{}-{}", self.me(), self.boot, self.seq.fetch_add(1, Ordering::Relaxed));
        let share = Share::of(self.me(), demand);
        // Pending before it is written: the sweep never drops a hold in flight.
        self.pending().insert(id.clone(), share.clone());
        let start = tokio::time::Instant::now();
        let out = loop {
            let failed = match self.admit_once(tenant, quotas, demand, (&id, &share), count).await {
                Ok(Ok(())) => break Ok(()),
                Ok(Err(e)) => e,
                Err(refused) => break Err(refused),
            };
            if start.elapsed() > BUDGET {
                break Err(busy(tenant, format!("no write took within {BUDGET:?}: {failed}")));
            }
            tokio::time::sleep(Duration::from_millis(fastrand::u64(1..=20))).await;
        };
        if out.is_err() {
            self.pending().remove(&id);
        }
        out.map(|()| id)
    }

    async fn settle(&self, tenant: &str, ticket: &str, made: Option<(Kind, &str)>) -> Result<(), TenantError> {
        let mine = self.pending().get(ticket).cloned().unwrap_or_else(|| self.share(0, 0));
        let placed = match made {
            Some((Kind::Sandbox, id)) => Some(Share { node: self.node_of(id).await, ..mine }),
            _ => None,
        };
        let out = self.change(tenant, |u| Ok(u.settle(ticket, made, placed.as_ref(), now_ms()))).await;
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
                Ok((u, _)) => return Ok(u.count(&|n| self.live(n), None, now_ms())),
                Err(e) if start.elapsed() > BUDGET => return Err(busy(tenant, e)),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}
