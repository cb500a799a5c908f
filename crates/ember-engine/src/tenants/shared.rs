//! Tenants on a cluster (docs/tenancy.md, "Tenants across a cluster"): the
//! tenants and their key hashes, the owner entries and the scoped tokens
//! live in three tables of the cluster's key-value store ([`SharedTenants`],
//! `ember-cluster`'s `node/tenants.rs`), not in `<data>/tenants`. Every node
//! keeps a copy in memory, fed by a watch of each table
//! ([`Tenants::observe`]), and checks each request's key against it: no
//! round trip on a request's path. A write goes to the table first, by
//! compare-and-set on the key's revision (two keys created at once for one
//! tenant through two nodes both survive), then into this node's copy, so
//! the node that answered a change sees it at once; the others once their
//! watch delivers it.
//!
//! Every value carries the revision it was written at: a watch that lags
//! this node's own write delivers older revisions, which are ignored, so
//! the copy never steps back.
use super::tokens::Grant;
use super::{State, TenantError, TenantRecord, Tenants};
use std::sync::Arc;

/// The tables of a cluster's tenants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    /// Tenant name → its record (quotas, keys by prefix and sha256).
    Tenants,
    /// `<kind>/<id>` → the owning tenant's name; `secure/<id>` → `""` for
    /// a sandbox created with `secureAccess`.
    Owners,
    /// sha256 of a token → its [`Grant`].
    Tokens,
}

impl Table {
    pub const ALL: [Table; 3] = [Table::Tenants, Table::Owners, Table::Tokens];
}

/// What a change writes.
#[derive(Debug, PartialEq)]
pub enum Write {
    /// Nothing: the value is already what was asked.
    Keep,
    Put(Vec<u8>),
    Delete,
}

/// The change a [`SharedTenants::change`] makes: given the value read
/// (`None`: absent), what to write, or a refusal.
pub type Change<'a> = dyn FnMut(Option<&[u8]>) -> Result<Write, TenantError> + Send + 'a;

/// A cluster's tables of tenants, set once at start ([`Tenants::share`]).
#[async_trait::async_trait]
pub trait SharedTenants: Send + Sync {
    /// Changes `key` of `table` by compare-and-set on its revision: `f` is
    /// run on the value read and again after a conflict. Answers the
    /// revision written (for a delete, one at most its marker's), `None`
    /// when `f` kept the value.
    async fn change(&self, table: Table, key: &str, f: &mut Change<'_>) -> Result<Option<u64>, TenantError>;
}

/// The table's value unreadable: refused, never taken for absent (an
/// absent tenant would be re-created over its keys).
fn unreadable(key: &str, e: serde_json::Error) -> TenantError {
    TenantError::Store(crate::EngineError::Internal(format!("tenant table entry {key:?} unreadable: {e}")))
}

fn encoded<T: serde::Serialize>(key: &str, v: &T) -> Result<Vec<u8>, TenantError> {
    serde_json::to_vec(v).map_err(|e| unreadable(key, e))
}

impl State {
    /// Whether a value of `key` at `revision` is newer than the copy's
    /// (`None`: the key is gone from the table for good); noted if so.
    fn fresh(&mut self, table: Table, key: &str, revision: Option<u64>) -> bool {
        let k = (table, key.to_string());
        match revision {
            None => drop(self.revs.remove(&k)),
            Some(r) if self.revs.get(&k).is_some_and(|known| *known > r) => return false,
            Some(r) => drop(self.revs.insert(k, r)),
        }
        true
    }
}

impl Tenants {
    /// Makes the tenants the cluster's: this node's record is no longer
    /// read (its copy starts empty, filled by the watches) nor written.
    pub fn share(&self, shared: Arc<dyn SharedTenants>) {
        if self.directory.set(shared).is_err() {
            tracing::warn!("the cluster's tenant tables were set twice; the first is kept");
            return;
        }
        *self.lock() = State::default();
        self.token_store().clear();
    }

    pub(super) fn shared_tables(&self) -> Option<&Arc<dyn SharedTenants>> {
        self.directory.get()
    }

    /// A table's value as a watch delivered it (or a write of this node
    /// made it): `value` `None` for a delete, `revision` `None` for a key
    /// gone from the table (its delete marker purged).
    pub fn observe(&self, table: Table, key: &str, value: Option<&[u8]>, revision: Option<u64>) {
        if table == Table::Tokens {
            let grant = value.and_then(|v| read::<Grant>(table, key, v));
            return self.token_store().observe(key, grant, revision);
        }
        let mut st = self.lock();
        if !st.fresh(table, key, revision) {
            return;
        }
        match (table, value) {
            (Table::Tenants, Some(v)) => match read::<TenantRecord>(table, key, v) {
                Some(r) => drop(st.tenants.insert(key.to_string(), r)),
                // A record this node cannot read grants no key.
                None => drop(st.tenants.remove(key)),
            },
            (Table::Tenants, None) => drop(st.tenants.remove(key)),
            (_, v) => match (key.strip_prefix(super::SECURE), v) {
                (Some(id), Some(_)) => drop(st.secure.insert(id.to_string())),
                (Some(id), None) => drop(st.secure.remove(id)),
                (None, Some(t)) => drop(st.owners.insert(key.to_string(), String::from_utf8_lossy(t).into_owned())),
                (None, None) => drop(st.owners.remove(key)),
            },
        }
    }

    /// Changes `key` of `table` through the cluster's tables, then this
    /// node's copy.
    pub(super) async fn write_shared(
        &self,
        shared: &dyn SharedTenants,
        table: Table,
        key: &str,
        f: &mut Change<'_>,
    ) -> Result<(), TenantError> {
        let mut last: Option<Option<Vec<u8>>> = None;
        let mut g = |cur: Option<&[u8]>| -> Result<Write, TenantError> {
            let w = f(cur)?;
            last = match &w {
                Write::Put(v) => Some(Some(v.clone())),
                Write::Delete => Some(None),
                Write::Keep => None,
            };
            Ok(w)
        };
        let revision = shared.change(table, key, &mut g).await?;
        if let (Some(rev), Some(v)) = (revision, last) {
            self.observe(table, key, v.as_deref(), Some(rev));
        }
        Ok(())
    }

    /// Changes tenant `name`'s record with `f` (given the record, `None`
    /// if there is none; answering the new one, `None` to remove it): in
    /// the cluster's table when shared, else in this node's record.
    pub(super) async fn change_tenant(
        &self,
        name: &str,
        mut f: impl FnMut(Option<TenantRecord>) -> Result<Option<TenantRecord>, TenantError> + Send,
    ) -> Result<(), TenantError> {
        let Some(shared) = self.shared_tables().cloned() else {
            return self.update(|st| {
                match f(st.tenants.get(name).cloned())? {
                    Some(r) => drop(st.tenants.insert(name.to_string(), r)),
                    None => drop(st.tenants.remove(name)),
                }
                Ok(())
            });
        };
        let mut g = |cur: Option<&[u8]>| -> Result<Write, TenantError> {
            let cur = cur.map(serde_json::from_slice::<TenantRecord>).transpose().map_err(|e| unreadable(name, e))?;
            Ok(match f(cur)? {
                Some(r) => Write::Put(encoded(name, &r)?),
                None => Write::Delete,
            })
        };
        self.write_shared(shared.as_ref(), Table::Tenants, name, &mut g).await
    }

    /// Sets owner-table entry `key` to `value` (`None`: no entry).
    pub(super) async fn put_entry(&self, key: &str, value: Option<&str>) -> Result<(), TenantError> {
        let Some(shared) = self.shared_tables().cloned() else {
            return self.update(|st| {
                match (key.strip_prefix(super::SECURE), value) {
                    (Some(id), Some(_)) => drop(st.secure.insert(id.to_string())),
                    (Some(id), None) => drop(st.secure.remove(id)),
                    (None, Some(t)) => drop(st.owners.insert(key.to_string(), t.to_string())),
                    (None, None) => drop(st.owners.remove(key)),
                }
                Ok(())
            });
        };
        let mut g = |cur: Option<&[u8]>| -> Result<Write, TenantError> {
            Ok(match (cur, value) {
                (c, v) if c == v.map(str::as_bytes) => Write::Keep,
                (_, Some(v)) => Write::Put(v.as_bytes().to_vec()),
                (_, None) => Write::Delete,
            })
        };
        self.write_shared(shared.as_ref(), Table::Owners, key, &mut g).await
    }

    /// Puts (or, `None`, deletes) the grant of token hash `h` in the
    /// cluster's table.
    pub(super) async fn put_token(
        &self,
        shared: &dyn SharedTenants,
        h: &str,
        grant: Option<&Grant>,
    ) -> Result<(), TenantError> {
        let value = grant.map(|g| encoded(h, g)).transpose()?;
        let mut g = |cur: Option<&[u8]>| -> Result<Write, TenantError> {
            Ok(match (&value, cur) {
                (Some(v), _) => Write::Put(v.clone()),
                (None, Some(_)) => Write::Delete,
                (None, None) => Write::Keep,
            })
        };
        self.write_shared(shared, Table::Tokens, h, &mut g).await
    }
}

/// `v` decoded, or `None` (logged): a value this node cannot read grants
/// nothing.
fn read<T: serde::de::DeserializeOwned>(table: Table, key: &str, v: &[u8]) -> Option<T> {
    serde_json::from_slice(v)
        .map_err(|e| tracing::warn!(?table, %key, error = %e, "an unreadable entry of the cluster's tenants"))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lagging_watch_never_steps_the_copy_back() {
        let mut st = State::default();
        assert!(st.fresh(Table::Tenants, "a", Some(5)), "a first value");
        assert!(!st.fresh(Table::Tenants, "a", Some(4)), "an older revision after this node's own write");
        assert!(st.fresh(Table::Tenants, "a", Some(5)), "the same revision again (a watch opened again)");
        assert!(st.fresh(Table::Owners, "a", Some(1)), "another table's key of the same name");
        assert!(st.fresh(Table::Tenants, "a", None), "gone for good");
        assert!(st.fresh(Table::Tenants, "a", Some(2)), "a key made again starts afresh");
    }
}
