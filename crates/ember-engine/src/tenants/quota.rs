//! Quota admission: a create's demand is checked against the tenant's quotas
//! and held as a reservation under one lock, so two racing creates cannot
//! both take the last slot. The reservation stands until the create's object
//! is recorded as the tenant's (then the usage count sees it) or the create
//! fails (dropped).
use super::{Kind, TenantError, Tenants};
use ember_types::tenant::{Quotas, Usage};
use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Instant;

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

#[derive(Default)]
pub(super) struct Admission {
    /// Serializes admissions with completions: a usage count taken under it
    /// sees each create either as a reservation or as an owned object.
    serial: tokio::sync::Mutex<()>,
    held: Mutex<HashMap<u64, (String, Demand)>>,
    next: Mutex<u64>,
    buckets: Mutex<HashMap<String, Bucket>>,
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
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.tenants.quota.held.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
    }
}

fn exceeded(tenant: &str, quota: &'static str, limit: u64, used: u64, asked: u64) -> TenantError {
    TenantError::QuotaExceeded { tenant: tenant.to_string(), quota, limit, used, asked }
}

/// The first quota `used + d` goes over.
fn check(tenant: &str, q: &Quotas, used: &Usage, d: &Demand) -> Result<(), TenantError> {
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
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Usage, crate::EngineError>>,
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
        let mut used = usage().await?;
        let mut held = self.quota.held.lock().unwrap_or_else(|p| p.into_inner());
        for (_, d) in held.values().filter(|(t, _)| t == tenant) {
            used.running_sandboxes += d.sandboxes;
            used.memory_bytes += d.memory_bytes;
            used.cpu_millis += d.cpu_millis;
            used.pool_size += d.pool_size;
            used.workspace_bytes += d.workspace_bytes;
            used.tasks += d.tasks;
            used.snapshot_bytes += d.snapshot_bytes;
        }
        check(tenant, &q, &used, &demand)?;
        let id = {
            let mut n = self.quota.next.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            *n
        };
        held.insert(id, (tenant.to_string(), demand));
        Ok(Reservation { tenants: self, id })
    }

    /// The create went through: `id` is recorded as `tenant`'s, then the
    /// reservation is given back (in that order, under the admission lock).
    pub async fn complete(&self, r: Reservation<'_>, kind: Kind, id: &str, tenant: &str) -> Result<(), TenantError> {
        let _serial = self.quota.serial.lock().await;
        let out = self.set_owner(kind, id, tenant);
        drop(r);
        out
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
