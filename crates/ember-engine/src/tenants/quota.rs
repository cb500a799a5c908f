//! Quota admission: a create's demand is checked against the tenant's quotas
//! and held as a reservation under one lock, so two racing creates cannot
//! both take the last slot. The reservation stands until the create's object
//! is recorded as the tenant's (then the usage count sees it) or the create
//! fails (dropped).
//!
//! On a cluster a [`SharedQuota`] (`ember-cluster`'s ledger in the cluster's
//! KV) admits the demand too, after the node's own check and under the same
//! lock, and holds it until the create settles: every sandbox create (its
//! running sandboxes, memory and cpu are the ledger's own count, and its
//! creates per second the ledger's one bucket), and a create of any other
//! object that a quota of the tenant limits (the ledger then counts the
//! tenant's objects with [`Count`] between its read and its write, so the
//! ledger's per-tenant compare-and-set orders racing creates on two nodes).
use super::{Kind, TenantError, Tenants};
use ember_types::tenant::{Quotas, Usage};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Quotas held across a cluster (docs/tenancy.md, "Quotas across a
/// cluster"). Set once at start ([`Tenants::share_quota`]).
#[async_trait::async_trait]
pub trait SharedQuota: Send + Sync {
    /// Checks `demand` against `quotas` and the cluster's use, and holds
    /// it: the answer names the hold. The running sandboxes, memory, cpu and
    /// creates per second are the ledger's; the other objects' use is
    /// `count`ed after the ledger is read, when a quota limits what
    /// `demand` asks ([`Demand::counts_objects`]).
    async fn admit(
        &self,
        tenant: &str,
        quotas: &Quotas,
        demand: &Demand,
        count: &dyn Count,
    ) -> Result<String, TenantError>;
    /// The create of hold `ticket` made `made` (a sandbox now counted in its
    /// place; another object's hold counted until the count of objects has
    /// it), or failed (`None`: the hold is dropped).
    async fn settle(&self, tenant: &str, ticket: &str, made: Option<(Kind, &str)>) -> Result<(), TenantError>;
    /// `sandbox` is gone: its use is given back.
    async fn release(&self, tenant: &str, sandbox: &str) -> Result<(), TenantError>;
    /// The tenant's running sandboxes, memory and cpu across the cluster
    /// (the other fields zero).
    async fn usage(&self, tenant: &str) -> Result<Usage, TenantError>;
}

/// What a tenant's objects use as the API counts them, and which objects
/// it counted (owner keys, [`Kind::key`]): a settled hold of the ledger
/// whose object is among them is not counted twice.
#[derive(Clone, Debug, Default)]
pub struct Counted {
    pub usage: Usage,
    pub objects: HashSet<String>,
}

/// Counts a tenant's objects, anew at each call.
#[async_trait::async_trait]
pub trait Count: Send + Sync {
    async fn count(&self) -> Result<Counted, TenantError>;
}

/// A [`Count`] made of the API's closure.
struct ByFn<'a, F>(&'a F);

#[async_trait::async_trait]
impl<F, Fut> Count for ByFn<'_, F>
where
    F: Fn() -> Fut + Send + Sync,
    Fut: Future<Output = Result<Counted, crate::EngineError>> + Send,
{
    async fn count(&self) -> Result<Counted, TenantError> {
        Ok((self.0)().await?)
    }
}

/// A hold in the [`SharedQuota`]: given back when dropped unsettled.
struct Ticket {
    shared: Arc<dyn SharedQuota>,
    tenant: String,
    id: String,
}

/// What one create asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Demand {
    pub sandboxes: u64,
    pub memory_bytes: u64,
    pub cpu_millis: u64,
    pub pool_size: u64,
    pub workspace_bytes: u64,
    pub tasks: u64,
    pub snapshot_bytes: u64,
    /// Counts against `creates_per_second`.
    pub rate_limited: bool,
}

impl Demand {
    /// Whether it asks for a sandbox's part (the ledger always holds it).
    pub fn is_sandbox(&self) -> bool {
        self.sandboxes + self.memory_bytes + self.cpu_millis > 0
    }

    /// Counts it in `used` (a hold is use until it settles). Saturating: a
    /// demand is the request's numbers, checked by its handler only later.
    pub fn add_to(&self, used: &mut Usage) {
        let add = |u: &mut u64, d: u64| *u = u.saturating_add(d);
        add(&mut used.running_sandboxes, self.sandboxes);
        add(&mut used.memory_bytes, self.memory_bytes);
        add(&mut used.cpu_millis, self.cpu_millis);
        add(&mut used.pool_size, self.pool_size);
        add(&mut used.workspace_bytes, self.workspace_bytes);
        add(&mut used.tasks, self.tasks);
        add(&mut used.snapshot_bytes, self.snapshot_bytes);
    }

    /// Whether a quota in `q` limits what it asks of the objects the API
    /// counts (pools, workspaces, tasks, snapshots).
    pub fn counts_objects(&self, q: &Quotas) -> bool {
        (self.pool_size > 0 && q.pool_size.is_some())
            || (self.workspace_bytes > 0 && q.workspace_bytes.is_some())
            || (self.tasks > 0 && q.tasks.is_some())
            || (self.snapshot_bytes > 0 && q.snapshot_bytes.is_some())
    }
}

#[derive(Default)]
pub(super) struct Admission {
    /// Serializes admissions with completions: a usage count taken under it
    /// sees each create either as a reservation or as an owned object.
    serial: tokio::sync::Mutex<()>,
    held: Mutex<HashMap<u64, (String, Demand)>>,
    next: Mutex<u64>,
    buckets: Mutex<HashMap<String, Bucket>>,
    /// On a cluster: the ledger the sandbox quotas are held in.
    shared: std::sync::OnceLock<Arc<dyn SharedQuota>>,
}

/// A token bucket of `rate` tokens refilled at `rate` per second.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn take(&mut self, rate: u32, now: Instant) -> bool {
        let rate = f64::from(rate);
        self.tokens = (self.tokens + now.saturating_duration_since(self.at).as_secs_f64() * rate).min(rate);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return true;
        }
        false
    }
}

/// A demand admitted and not yet recorded; dropping it gives it back.
pub struct Reservation<'a> {
    tenants: &'a Tenants,
    id: u64,
    ticket: Option<Ticket>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.tenants.quota.held.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
        // A create that failed (or whose answer was lost): its cluster hold
        // is dropped off the request's path (the ledger's sweep drops it too).
        if let (Some(t), Ok(rt)) = (self.ticket.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(async move {
                if let Err(e) = t.shared.settle(&t.tenant, &t.id, None).await {
                    tracing::warn!(tenant = %t.tenant, ticket = %t.id, error = %e, "dropping a quota hold");
                }
            });
        }
    }
}

fn exceeded(tenant: &str, quota: &'static str, limit: u64, used: u64, asked: u64) -> TenantError {
    TenantError::QuotaExceeded { tenant: tenant.to_string(), quota, limit, used, asked }
}

/// The first quota `used + d` goes over.
pub fn check(tenant: &str, q: &Quotas, used: &Usage, d: &Demand) -> Result<(), TenantError> {
    let rows: [(&'static str, Option<u64>, u64, u64); 7] = [
        ("runningSandboxes", q.running_sandboxes, used.running_sandboxes, d.sandboxes),
        ("memoryBytes", q.memory_bytes, used.memory_bytes, d.memory_bytes),
        ("cpuMillis", q.cpu_millis, used.cpu_millis, d.cpu_millis),
        ("poolSize", q.pool_size, used.pool_size, d.pool_size),
        ("workspaceBytes", q.workspace_bytes, used.workspace_bytes, d.workspace_bytes),
        ("tasks", q.tasks, used.tasks, d.tasks),
        ("snapshotBytes", q.snapshot_bytes, used.snapshot_bytes, d.snapshot_bytes),
    ];
    for (name, limit, u, asked) in rows {
        if let Some(limit) = limit.filter(|l| asked > 0 && u.saturating_add(asked) > *l) {
            return Err(exceeded(tenant, name, limit, u, asked));
        }
    }
    Ok(())
}

impl Tenants {
    /// Admits `demand` for `tenant` or says which quota it exceeds. `usage`
    /// counts the tenant's objects; it runs under the admission lock.
    pub async fn admit<F, Fut>(&self, tenant: &str, demand: Demand, usage: F) -> Result<Reservation<'_>, TenantError>
    where
        F: Fn() -> Fut + Send + Sync,
        Fut: Future<Output = Result<Counted, crate::EngineError>> + Send,
    {
        let q = self.quotas(tenant);
        let _serial = self.quota.serial.lock().await;
        if let Some(rate) = q.creates_per_second.filter(|_| demand.rate_limited) {
            let now = Instant::now();
            let mut b = self.quota.buckets.lock().unwrap_or_else(|p| p.into_inner());
            let bucket = b.entry(tenant.to_string()).or_insert(Bucket { tokens: f64::from(rate), at: now });
            if !bucket.take(rate, now) {
                return Err(exceeded(tenant, "createsPerSecond", rate.into(), rate.into(), 1));
            }
        }
        let mut used = usage().await?.usage;
        for (_, d) in self.quota.held.lock().unwrap_or_else(|p| p.into_inner()).values().filter(|(t, _)| t == tenant) {
            d.add_to(&mut used);
        }
        check(tenant, &q, &used, &demand)?;
        let ticket = match self.shared() {
            Some(shared) if demand.is_sandbox() || demand.counts_objects(&q) => {
                let id = shared.admit(tenant, &q, &demand, &ByFn(&usage)).await?;
                Some(Ticket { shared, tenant: tenant.to_string(), id })
            }
            _ => None,
        };
        let id = {
            let mut n = self.quota.next.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            *n
        };
        self.quota.held.lock().unwrap_or_else(|p| p.into_inner()).insert(id, (tenant.to_string(), demand));
        Ok(Reservation { tenants: self, id, ticket })
    }

    /// The create went through: `id` is recorded as `tenant`'s, then the
    /// reservation is given back (in that order, under the admission lock).
    /// A cluster hold becomes the sandbox first: its owner entry, which the
    /// ledger's sweep counts from, follows the settled hold, never precedes it.
    /// Another object's settled hold counts on until the count of objects
    /// has the object (which needs the owner entry, so the order is free).
    pub async fn complete(
        &self,
        mut r: Reservation<'_>,
        kind: Kind,
        id: &str,
        tenant: &str,
    ) -> Result<(), TenantError> {
        let _serial = self.quota.serial.lock().await;
        if let Some(t) = r.ticket.take() {
            if let Err(e) = t.shared.settle(&t.tenant, &t.id, Some((kind, id))).await {
                // The sandbox exists: the answer stands; the sweep counts it.
                tracing::warn!(tenant = %t.tenant, ticket = %t.id, error = %e, "settling a quota hold");
            }
        }
        let out = self.set_owner(kind, id, tenant).await;
        drop(r);
        out
    }

    /// The cluster's ledger, once [`Tenants::share_quota`] set it.
    pub fn shared(&self) -> Option<Arc<dyn SharedQuota>> {
        self.quota.shared.get().cloned()
    }

    /// Makes the quotas the cluster's (see the module's docs).
    pub fn share_quota(&self, shared: Arc<dyn SharedQuota>) {
        if self.quota.shared.set(shared).is_err() {
            tracing::warn!("the cluster's quota ledger was set twice; the first is kept");
        }
    }

    /// Sandbox `id` of `tenant` was removed: its cluster use is given back.
    pub async fn released(&self, tenant: &str, id: &str) {
        if let Some(shared) = self.shared() {
            if let Err(e) = shared.release(tenant, id).await {
                // The ledger's sweep drops it on the sandbox's node.
                tracing::warn!(%tenant, sandbox = %id, error = %e, "releasing a sandbox's quota use");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_bucket_refills_at_its_rate_and_holds_no_more_than_it() {
        let t0 = Instant::now();
        let mut b = Bucket { tokens: 2.0, at: t0 };
        assert!(b.take(2, t0) && b.take(2, t0));
        assert!(!b.take(2, t0), "a third create in the same instant passed a rate of 2");
        assert!(b.take(2, t0 + Duration::from_millis(500)), "half a second refills one token at 2/s");
        assert!(!b.take(2, t0 + Duration::from_millis(500)));
        let later = t0 + Duration::from_secs(60);
        assert!(b.take(2, later) && b.take(2, later) && !b.take(2, later), "a minute's idle banked more than the rate");
    }

    #[test]
    fn holds_add_up_without_overflow() {
        let huge = Demand { workspace_bytes: u64::MAX - 1, ..Default::default() };
        let mut used = Usage { workspace_bytes: 5, ..Default::default() };
        huge.add_to(&mut used);
        huge.add_to(&mut used);
        assert_eq!(used.workspace_bytes, u64::MAX);
    }

    #[test]
    fn the_first_quota_over_is_named_with_limit_and_use() {
        let q = Quotas { running_sandboxes: Some(3), memory_bytes: Some(1 << 30), ..Default::default() };
        let used = Usage { running_sandboxes: 2, memory_bytes: 1 << 29, ..Default::default() };
        let one = Demand { sandboxes: 1, memory_bytes: 1 << 28, ..Default::default() };
        assert!(check("a", &q, &used, &one).is_ok());
        let big = Demand { sandboxes: 1, memory_bytes: 1 << 30, ..Default::default() };
        let e = check("a", &q, &used, &big).expect_err("over memory").to_string();
        assert!(e.contains("memoryBytes") && e.contains("limit 1073741824") && e.contains("in use 536870912"), "{e}");
        let full = Usage { running_sandboxes: 3, ..Default::default() };
        assert!(check("a", &q, &full, &one).expect_err("full").to_string().contains("runningSandboxes"));
    }
}
