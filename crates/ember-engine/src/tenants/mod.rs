//! Tenants: who may call the API with which key, which objects each owns, and
//! its quotas (`quota.rs`) and the audit log (`audit.rs`). One service owns
//! this state; the API resolves a request's key here and asks it who owns an
//! object before a handler acts.
//!
//! Persisted as one record (`<data>/tenants/tenants.json`, written durably by
//! [`crate::store::Store`]) holding the tenants, their keys (sha256 of the key,
//! never the key) and the owner of every object a tenant key created. An object
//! without an entry belongs to [`DEFAULT_TENANT`]: with no tenant ever created
//! nothing is written and the daemon behaves as a single-key one. Scoped
//! tokens are records of their own (`tokens.rs`). On a cluster all of it is
//! the cluster's instead, in tables every node watches (`shared.rs`).
mod audit;
mod quota;
mod shared;
mod tokens;

pub use audit::{Audit, MAX_QUERY as MAX_AUDIT_QUERY};
pub use quota::{check, Count, Counted, Demand, Reservation, SharedQuota};
pub use shared::{Change, SharedTenants, Table, Write};
pub use tokens::{Grant, DEFAULT_TTL_SECS, MAX_TOKENS, MAX_TTL_SECS, TOKEN_PREFIX};

use crate::record::now_ms;
use crate::store::Store;
use ember_types::tenant::{CreatedKey, KeyInfo, Quotas, QuotasPatch, TenantInfo, DEFAULT_TENANT};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

/// The kinds of object a tenant owns; the first part of an owner entry's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sandbox,
    Pool,
    Workspace,
    Task,
    SandboxSnapshot,
    WorkspaceSnapshot,
}

impl Kind {
    /// The owner entry's key of object `id` of this kind.
    pub fn key(self, id: &str) -> String {
        format!("{}/{id}", self.tag())
    }

    fn tag(self) -> &'static str {
        match self {
            Kind::Sandbox => "sandbox",
            Kind::Pool => "pool",
            Kind::Workspace => "workspace",
            Kind::Task => "task",
            Kind::SandboxSnapshot => "sandbox-snapshot",
            Kind::WorkspaceSnapshot => "workspace-snapshot",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error("tenant {0:?} not found")]
    NotFound(String),
    #[error("tenant {0:?} exists")]
    Exists(String),
    #[error("tenant {name:?}: no key with prefix {prefix:?}")]
    KeyNotFound { name: String, prefix: String },
    #[error("invalid tenant name {0:?}: 1-63 of [a-z0-9-], not starting with '-', and not \"default\"")]
    InvalidName(String),
    #[error("quota {quota} of tenant {tenant:?} exceeded: limit {limit}, in use {used}, asked {asked}")]
    QuotaExceeded { tenant: String, quota: &'static str, limit: u64, used: u64, asked: u64 },
    /// The cluster's quota ledger could not be read or written.
    #[error("quota of tenant {tenant:?} across the cluster: {reason}")]
    Cluster { tenant: String, reason: String },
    /// The cluster's tenant tables could not be read or written.
    #[error("the cluster's tenant tables, entry {key:?}: {reason}")]
    Shared { key: String, reason: String },
    #[error("tenant store: {0}")]
    Store(#[from] crate::EngineError),
}

impl TenantError {
    /// As an engine error (opening the record at start).
    pub fn into_engine(self) -> crate::EngineError {
        match self {
            TenantError::Store(e) => e,
            e => crate::EngineError::Internal(e.to_string()),
        }
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct KeyRecord {
    prefix: String,
    /// Hex sha256 of the whole key.
    hash: String,
    created_at_ms: i64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct TenantRecord {
    created_at_ms: i64,
    quotas: Quotas,
    keys: Vec<KeyRecord>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct State {
    tenants: BTreeMap<String, TenantRecord>,
    /// `<kind>/<id>` → tenant, for objects a tenant key created.
    owners: BTreeMap<String, String>,
    /// Sandboxes created with OpenSandbox's `secureAccess: true`: their
    /// endpoint answers carry a scoped token.
    #[serde(default)]
    secure: std::collections::BTreeSet<String>,
    /// On a cluster: the revision of each table entry the copy holds.
    #[serde(skip)]
    revs: HashMap<(Table, String), u64>,
}

pub struct Tenants {
    store: Store<State>,
    state: Mutex<State>,
    quota: quota::Admission,
    audit: Audit,
    /// The live scoped tokens, hashed (`tokens.rs`).
    tokens: Mutex<tokens::TokenStore>,
    /// On a cluster: where tenants, owners and tokens are kept (`shared.rs`).
    directory: OnceLock<Arc<dyn SharedTenants>>,
}

const RECORD: &str = "tenants";
/// The owner-table key prefix marking a `secureAccess` sandbox.
const SECURE: &str = "secure/";

fn hash(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex(n: usize) -> Result<String, TenantError> {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).map_err(|e| crate::EngineError::Internal(format!("getrandom: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn valid_name(n: &str) -> bool {
    (1..=63).contains(&n.len())
        && n != DEFAULT_TENANT
        && !n.starts_with('-')
        && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl Tenants {
    /// Opens (or starts empty) the tenant record and the audit log under `data_dir`.
    pub fn open(data_dir: &Path) -> Result<Tenants, TenantError> {
        let store: Store<State> = Store::open(data_dir.join("tenants"))?;
        let state = match store.load(RECORD) {
            None => State::default(),
            Some(Ok(s)) => s,
            Some(Err(why)) => {
                // Never start open: a torn record would make every tenant key
                // unknown, and every tenant object the admin's alone.
                return Err(crate::EngineError::Internal(format!("tenants record unreadable: {why}")).into());
            }
        };
        let audit = Audit::open(&data_dir.join("audit"))?;
        Ok(Tenants {
            store,
            state: Mutex::new(state),
            quota: quota::Admission::default(),
            audit,
            tokens: Mutex::new(tokens::TokenStore::open(&data_dir.join("tenants").join("tokens"))?),
            directory: OnceLock::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `f` to a copy of the state, saves it durably, then keeps it: a
    /// failed save changes nothing.
    fn update<T>(&self, f: impl FnOnce(&mut State) -> Result<T, TenantError>) -> Result<T, TenantError> {
        let mut st = self.lock();
        let mut next = st.clone();
        let out = f(&mut next)?;
        self.store.save(RECORD, &next)?;
        *st = next;
        Ok(out)
    }

    /// Whether any tenant exists (else ownership is never recorded).
    pub fn any(&self) -> bool {
        !self.lock().tenants.is_empty()
    }

    pub async fn create(&self, name: &str, quotas: Quotas) -> Result<TenantInfo, TenantError> {
        if !valid_name(name) {
            return Err(TenantError::InvalidName(name.to_string()));
        }
        let rec = TenantRecord { created_at_ms: now_ms(), quotas, keys: vec![] };
        self.change_tenant(name, |cur| match cur {
            Some(_) => Err(TenantError::Exists(name.to_string())),
            None => Ok(Some(rec.clone())),
        })
        .await?;
        Ok(info(name, &rec))
    }

    pub fn list(&self) -> Vec<TenantInfo> {
        self.lock().tenants.iter().map(|(n, r)| info(n, r)).collect()
    }

    pub fn get(&self, name: &str) -> Result<TenantInfo, TenantError> {
        let st = self.lock();
        st.tenants.get(name).map(|r| info(name, r)).ok_or_else(|| TenantError::NotFound(name.to_string()))
    }

    pub fn quotas(&self, name: &str) -> Quotas {
        self.lock().tenants.get(name).map(|r| r.quotas.clone()).unwrap_or_default()
    }

    /// Changes tenant `name`'s quotas by `patch` (in the cluster's table
    /// when shared). The next check of each quota uses them: what the
    /// tenant holds over a lowered quota stays, its next create over it is
    /// refused.
    pub async fn update_quotas(&self, name: &str, patch: &QuotasPatch) -> Result<TenantInfo, TenantError> {
        let mut now = None;
        self.change_tenant(name, |cur| {
            let mut t = cur.ok_or_else(|| TenantError::NotFound(name.to_string()))?;
            patch.apply(&mut t.quotas);
            now = Some(info(name, &t));
            Ok(Some(t))
        })
        .await?;
        now.ok_or_else(|| TenantError::NotFound(name.to_string()))
    }

    /// Removes the tenant and its keys. Its objects stay, owned by a tenant
    /// no key names: only the admin reaches them.
    pub async fn remove(&self, name: &str) -> Result<(), TenantError> {
        self.change_tenant(name, |cur| match cur {
            Some(_) => Ok(None),
            None => Err(TenantError::NotFound(name.to_string())),
        })
        .await
    }

    /// A new key for `name`, returned whole this once; only its hash is kept.
    pub async fn create_key(&self, name: &str) -> Result<CreatedKey, TenantError> {
        let prefix = format!("emb_{}", random_hex(4)?);
        let key = format!("{prefix}_{}", random_hex(24)?);
        let rec = KeyRecord { prefix: prefix.clone(), hash: hash(&key), created_at_ms: now_ms() };
        self.change_tenant(name, |cur| {
            let mut t = cur.ok_or_else(|| TenantError::NotFound(name.to_string()))?;
            t.keys.push(rec.clone());
            Ok(Some(t))
        })
        .await?;
        Ok(CreatedKey { prefix, key, created_at_ms: rec.created_at_ms })
    }

    pub async fn revoke_key(&self, name: &str, prefix: &str) -> Result<(), TenantError> {
        self.change_tenant(name, |cur| {
            let mut t = cur.ok_or_else(|| TenantError::NotFound(name.to_string()))?;
            let before = t.keys.len();
            t.keys.retain(|k| k.prefix != prefix);
            if t.keys.len() == before {
                return Err(TenantError::KeyNotFound { name: name.to_string(), prefix: prefix.to_string() });
            }
            Ok(Some(t))
        })
        .await
    }

    /// Whether tenant `name` still has the key of `prefix` (a dashboard
    /// session opened with it ends once it is revoked).
    pub fn holds_key(&self, name: &str, prefix: &str) -> bool {
        self.lock().tenants.get(name).is_some_and(|t| t.keys.iter().any(|k| k.prefix == prefix))
    }

    /// The tenant and key prefix a presented key belongs to. Keys are compared
    /// by their hashes, so the comparison's timing tells nothing of a key.
    pub fn resolve(&self, key: &str) -> Option<(String, String)> {
        let h = hash(key);
        let st = self.lock();
        st.tenants.iter().find_map(|(n, t)| t.keys.iter().find(|k| k.hash == h).map(|k| (n.clone(), k.prefix.clone())))
    }

    /// The tenant owning `id` of `kind` ([`DEFAULT_TENANT`] without an entry).
    pub fn owner(&self, kind: Kind, id: &str) -> String {
        let st = self.lock();
        st.owners.get(&kind.key(id)).cloned().unwrap_or_else(|| DEFAULT_TENANT.to_string())
    }

    /// Records `tenant` as the owner of `id`; the default tenant's objects
    /// need no entry (and a name reused by the admin drops a stale one).
    pub async fn set_owner(&self, kind: Kind, id: &str, tenant: &str) -> Result<(), TenantError> {
        let k = kind.key(id);
        // An entry this node's copy lacks may be in the cluster's table
        // (its watch not there yet): asked there, where the write checks.
        if tenant == DEFAULT_TENANT && !self.lock().owners.contains_key(&k) && self.shared_tables().is_none() {
            return Ok(());
        }
        self.put_entry(&k, Some(tenant).filter(|t| *t != DEFAULT_TENANT)).await
    }

    /// Whether a create for `tenant` may claim a member of `pool`: a
    /// tenant's pool is its own. The admin's creates (`None`, or a name no
    /// tenant has: a task's free-form tenant) claim from the default
    /// tenant's pools, and from any pool they name.
    pub fn may_claim(&self, tenant: Option<&str>, pool: &str, named: bool) -> bool {
        let st = self.lock();
        let owner = st.owners.get(&format!("{}/{pool}", Kind::Pool.tag())).map_or(DEFAULT_TENANT, String::as_str);
        match tenant.filter(|t| st.tenants.contains_key(*t)) {
            Some(t) => owner == t,
            None => named || owner == DEFAULT_TENANT,
        }
    }

    /// Ids of `kind` that `tenant` owns.
    pub fn owned(&self, kind: Kind, tenant: &str) -> Vec<String> {
        let pre = format!("{}/", kind.tag());
        let st = self.lock();
        st.owners
            .iter()
            .filter(|(_, t)| *t == tenant)
            .filter_map(|(k, _)| k.strip_prefix(&pre).map(str::to_string))
            .collect()
    }

    /// Marks `sandbox` as created with `secureAccess: true`.
    pub async fn set_secure(&self, sandbox: &str) -> Result<(), TenantError> {
        self.put_entry(&format!("{SECURE}{sandbox}"), Some("")).await
    }

    pub fn is_secure(&self, sandbox: &str) -> bool {
        self.lock().secure.contains(sandbox)
    }

    pub fn audit(&self) -> &Audit {
        &self.audit
    }
}

fn info(name: &str, r: &TenantRecord) -> TenantInfo {
    TenantInfo {
        name: name.to_string(),
        created_at_ms: r.created_at_ms,
        quotas: r.quotas.clone(),
        keys: r.keys.iter().map(|k| KeyInfo { prefix: k.prefix.clone(), created_at_ms: k.created_at_ms }).collect(),
        usage: None,
    }
}
