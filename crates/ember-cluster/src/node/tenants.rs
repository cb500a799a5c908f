//! Tenants as the cluster's state (docs/tenancy.md, "Tenants across a
//! cluster"): three buckets, `<prefix>_tenants` (tenant name → its record:
//! quotas, keys by prefix and sha256), `<prefix>_owners` (`<kind>/<id>` →
//! the owning tenant; `secure/<id>` for `secureAccess` sandboxes) and
//! `<prefix>_tokens` (sha256 of a scoped token → its grant; the bucket's
//! age limit, a day and a minute, outlives the longest token).
//!
//! Every write is a compare-and-set on the key's revision (a new key by KV
//! `create`, one winner), so two nodes changing one tenant at once never
//! lose a change: the second write is refused, reads the first's value and
//! applies its change to it. Every node follows each bucket with a watch
//! ([`Mirror`]) that feeds the engine's copy ([`Tenants::observe`]), which
//! the key check reads on each request; a node reads the three buckets
//! whole before it serves.
use super::mirror::{Listener, Mirror};
use super::plane::ClusterPlane;
use super::registry;
use super::ClusterError;
use crate::queue::key_of;
use async_nats::jetstream::{self, kv};
use ember_engine::tenants::{Change, SharedTenants, Table, TenantError, Tenants, Write, MAX_TTL_SECS};
use std::sync::Arc;
use std::time::Duration;

/// How long a change keeps trying (conflicts, an election) before it is a
/// 503 `CLUSTER::BUSY`.
const BUDGET: Duration = Duration::from_secs(10);
/// No one read or write waits longer.
const STEP: Duration = Duration::from_secs(2);

/// The cluster's [`SharedTenants`].
struct Directory {
    tenants: kv::Store,
    owners: kv::Store,
    tokens: kv::Store,
}

/// Feeds one bucket's changes into the engine's copy.
struct Feed {
    table: Table,
    tenants: Arc<Tenants>,
}

impl Listener for Feed {
    fn changed(&self, key: &str, value: Option<&[u8]>, revision: Option<u64>) {
        match from_key(key) {
            Some(k) => self.tenants.observe(self.table, &k, value, revision),
            None => tracing::warn!(table = ?self.table, %key, "a key of the tenant buckets ember did not write"),
        }
    }
}

/// The string `key_of` made `key` from.
fn from_key(key: &str) -> Option<String> {
    let Some(hex) = key.strip_prefix('=') else { return Some(key.to_string()) };
    let bytes: Option<Vec<u8>> =
        (0..hex.len()).step_by(2).map(|i| hex.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok())).collect();
    String::from_utf8(bytes?).ok()
}

fn unavailable(key: &str, reason: impl std::fmt::Display) -> TenantError {
    TenantError::Shared { key: key.to_string(), reason: reason.to_string() }
}

/// Opens the three buckets, makes `tenants` the cluster's, and returns once
/// the watches have delivered each bucket whole (this node's copy is then
/// the cluster's, as of the watch).
pub async fn share_tenants(plane: &Arc<ClusterPlane>, tenants: Arc<Tenants>) -> Result<(), ClusterError> {
    let js = jetstream::new(plane.nats.clone());
    let replicas = crate::replicas::for_cluster(&plane.nats, plane.cfg.servers.len()).await;
    let open = |what: &str, max_age| registry::bucket(&js, format!("{}_{what}", plane.cfg.prefix), replicas, max_age);
    let dir = Arc::new(Directory {
        tenants: open("tenants", Duration::ZERO).await?,
        owners: open("owners", Duration::ZERO).await?,
        tokens: open("tokens", Duration::from_secs(MAX_TTL_SECS + 60)).await?,
    });
    // Shared before the watches start: the copy they fill starts empty.
    tenants.share(dir.clone());
    let mut mirrors = Vec::new();
    for table in Table::ALL {
        let (store, feed) = (dir.store(table).clone(), Arc::new(Feed { table, tenants: tenants.clone() }));
        mirrors.push((store.name.clone(), Mirror::spawn_with(store, Some(feed))));
    }
    let start = tokio::time::Instant::now();
    while let Some((name, _)) = mirrors.iter().find(|(_, m)| !m.synced()) {
        if start.elapsed() > crate::RETRY_BUDGET {
            let reason = format!("its watch did not deliver it within {:?}", crate::RETRY_BUDGET);
            return Err(ClusterError::Bucket { name: name.clone(), reason });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

impl Directory {
    fn store(&self, table: Table) -> &kv::Store {
        match table {
            Table::Tenants => &self.tenants,
            Table::Owners => &self.owners,
            Table::Tokens => &self.tokens,
        }
    }
}

/// One try of a change: `Ok(Some(rev))` written, `Ok(None)` kept, `Err`
/// refused by `f`; a failure to read or write (a conflict included) is
/// `Ok(Err(why))`, tried again.
async fn try_change(
    store: &kv::Store,
    key: &str,
    f: &mut Change<'_>,
) -> Result<Result<Option<u64>, String>, TenantError> {
    let step = |e: &dyn std::fmt::Display| e.to_string();
    let entry = match tokio::time::timeout(STEP, store.entry(key)).await {
        Err(_) => return Ok(Err(format!("no answer within {STEP:?}"))),
        Ok(Err(e)) => return Ok(Err(step(&e))),
        Ok(Ok(e)) => e,
    };
    let (cur, rev) = match &entry {
        None => (None, None),
        Some(e) if e.operation != kv::Operation::Put => (None, Some(e.revision)),
        Some(e) => (Some(&e.value[..]), Some(e.revision)),
    };
    let w = f(cur)?;
    let write = async {
        match (w, rev) {
            (Write::Keep, _) => Ok(None),
            (Write::Put(v), Some(r)) => store.update(key, v.into(), r).await.map(Some).map_err(|e| step(&e)),
            (Write::Put(v), None) => store.create(key, v.into()).await.map(Some).map_err(|e| step(&e)),
            // Deleting what is not there: nothing to do.
            (Write::Delete, None) => Ok(None),
            // The marker's revision is past `r`; `r + 1` bounds it from below,
            // which is all the copy needs to drop older values.
            (Write::Delete, Some(r)) => {
                store.delete_expect_revision(key, Some(r)).await.map(|()| Some(r + 1)).map_err(|e| step(&e))
            }
        }
    };
    Ok(tokio::time::timeout(STEP, write).await.unwrap_or_else(|_| Err(format!("no answer within {STEP:?}"))))
}

#[async_trait::async_trait]
impl SharedTenants for Directory {
    async fn change(&self, table: Table, key: &str, f: &mut Change<'_>) -> Result<Option<u64>, TenantError> {
        let (store, k) = (self.store(table), key_of(key));
        let start = tokio::time::Instant::now();
        loop {
            let failed = match try_change(store, &k, f).await? {
                Ok(rev) => return Ok(rev),
                Err(why) => why,
            };
            if start.elapsed() > BUDGET {
                return Err(unavailable(key, format!("no write took within {BUDGET:?}: {failed}")));
            }
            tokio::time::sleep(Duration::from_millis(fastrand::u64(1..=20))).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_comes_back_as_written() {
        for k in ["acme", "sandbox/abc-1", "secure/x", "workspace/my ws", "0f3a", "pool/é"] {
            assert_eq!(from_key(&key_of(k)).as_deref(), Some(k));
        }
        assert_eq!(from_key("=zz"), None, "not ember's");
    }
}
