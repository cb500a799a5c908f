//! Scoped tokens: short-lived credentials bound to one sandbox (and a scope
//! of its routes) that an agent or a browser can present to that sandbox's
//! proxy route without holding a tenant's key. Kept hashed like the keys,
//! one record each under `<data>/tenants/tokens/<sha256>.json`, written
//! durably before the token is handed out, so a daemon restart keeps every
//! live token; memory holds the same map for the key check. A token dies at
//! its expiry (its record is swept then), when revoked with its sandbox
//! ([`Tenants::drop_tokens`]), or at its first use after the sandbox ended.
//! On a cluster the grants are the cluster's table's (`shared.rs`), which
//! every node's map follows, and no record is written here.
use super::{hash, random_hex, TenantError, Tenants};
use crate::record::now_ms;
use crate::store::Store;
use ember_types::tenant::TokenScope;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// Every scoped token starts with it, so the key check knows what it holds.
pub const TOKEN_PREFIX: &str = "est_";
pub const DEFAULT_TTL_SECS: u64 = 900;
pub const MAX_TTL_SECS: u64 = 86_400;
/// Live tokens a daemon holds at most: each is a file, and minting is open
/// to every tenant (a day's tokens of a busy daemon fit many times over).
pub const MAX_TOKENS: usize = 65_536;

/// What a presented token grants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    pub sandbox: String,
    pub tenant: String,
    pub scope: TokenScope,
    pub expires_at_ms: i64,
    /// The token's first characters, for the audit log.
    pub prefix: String,
}

/// The live tokens: sha256 of the token → its grant, and their records.
pub(super) struct TokenStore {
    store: Store<Grant>,
    live: HashMap<String, Grant>,
    /// On a cluster: the grants are the table's (no record here), and the
    /// revision of each the map holds.
    shared: Option<HashMap<String, u64>>,
}

impl TokenStore {
    /// Loads the live tokens of `dir`; expired and unreadable records go.
    pub(super) fn open(dir: &Path) -> Result<TokenStore, TenantError> {
        let store: Store<Grant> = Store::open(dir.to_path_buf())?;
        let now = now_ms();
        let mut live = HashMap::new();
        for (h, g) in store.recover_all() {
            match g {
                Ok(g) if g.expires_at_ms > now => {
                    live.insert(h, g);
                }
                Ok(_) => store.remove(&h)?,
                Err(why) => {
                    // A torn or altered record grants nothing.
                    tracing::warn!(record = %h, %why, "unreadable token record; dropping it");
                    store.remove(&h)?;
                }
            }
        }
        Ok(TokenStore { store, live, shared: None })
    }

    /// Drops the grants `keep` refuses, their records with them.
    fn retain(&mut self, keep: impl Fn(&Grant) -> bool) {
        let gone: Vec<String> = self.live.iter().filter(|(_, g)| !keep(g)).map(|(h, _)| h.clone()).collect();
        for h in gone {
            self.live.remove(&h);
            if self.shared.is_some() {
                // The table's entry expires with the bucket's age limit.
                continue;
            }
            if let Err(e) = self.store.remove(&h) {
                tracing::warn!(error = %e, "removing a token record");
            }
        }
    }

    /// The grants become the cluster's table's: the map starts empty.
    pub(super) fn clear(&mut self) {
        self.live.clear();
        self.shared = Some(HashMap::new());
    }

    /// Token hash `h`'s grant as the table holds it at `revision` (see
    /// [`Tenants::observe`]).
    pub(super) fn observe(&mut self, h: &str, grant: Option<Grant>, revision: Option<u64>) {
        let Some(revs) = self.shared.as_mut() else { return };
        match revision {
            None => drop(revs.remove(h)),
            Some(r) if revs.get(h).is_some_and(|known| *known > r) => return,
            Some(r) => drop(revs.insert(h.to_string(), r)),
        }
        match grant {
            Some(g) => drop(self.live.insert(h.to_string(), g)),
            None => drop(self.live.remove(h)),
        }
    }
}

impl Tenants {
    pub(super) fn token_store(&self) -> std::sync::MutexGuard<'_, TokenStore> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new token for `sandbox` of `tenant`, on disk before it is returned
    /// (this once; only its hash is kept).
    pub async fn mint_token(
        &self,
        sandbox: &str,
        tenant: &str,
        scope: TokenScope,
        ttl_secs: u64,
    ) -> Result<(String, Grant), TenantError> {
        let token = format!("{TOKEN_PREFIX}{}", random_hex(24)?);
        let ttl_ms = i64::try_from(ttl_secs.clamp(1, MAX_TTL_SECS) * 1000).unwrap_or(i64::MAX);
        let now = now_ms();
        let grant = Grant {
            sandbox: sandbox.to_string(),
            tenant: tenant.to_string(),
            scope,
            expires_at_ms: now.saturating_add(ttl_ms),
            prefix: token[..TOKEN_PREFIX.len() + 8].to_string(),
        };
        let h = hash(&token);
        {
            let mut tokens = self.token_store();
            tokens.retain(|g| g.expires_at_ms > now);
            if tokens.live.len() >= MAX_TOKENS {
                let used = tokens.live.len() as u64;
                return Err(TenantError::QuotaExceeded {
                    tenant: tenant.to_string(),
                    quota: "liveTokens",
                    limit: MAX_TOKENS as u64,
                    used,
                    asked: 1,
                });
            }
            if self.shared_tables().is_none() {
                tokens.store.save(&h, &grant)?;
                tokens.live.insert(h, grant.clone());
                return Ok((token, grant));
            }
        }
        // On a cluster: in the table before it is answered, so every node
        // takes it once its watch delivers it.
        if let Some(shared) = self.shared_tables().cloned() {
            self.put_token(shared.as_ref(), &h, Some(&grant)).await?;
        }
        Ok((token, grant))
    }

    /// The grant of a presented token, unless it is unknown or expired.
    pub fn token(&self, presented: &str) -> Option<Grant> {
        let h = hash(presented);
        let mut tokens = self.token_store();
        match tokens.live.get(&h) {
            Some(g) if g.expires_at_ms > now_ms() => Some(g.clone()),
            Some(_) => {
                tokens.retain(|g| g.expires_at_ms > now_ms());
                None
            }
            None => None,
        }
    }

    /// Ends every token of `sandbox` (it ended, or was removed); on a
    /// cluster, those of the table this node's copy holds.
    pub async fn drop_tokens(&self, sandbox: &str) {
        let Some(shared) = self.shared_tables().cloned() else {
            return self.token_store().retain(|g| g.sandbox != sandbox);
        };
        let mine: Vec<String> =
            self.token_store().live.iter().filter(|(_, g)| g.sandbox == sandbox).map(|(h, _)| h.clone()).collect();
        for h in mine {
            if let Err(e) = self.put_token(shared.as_ref(), &h, None).await {
                // The sandbox is gone: a use of the token finds that and refuses it.
                tracing::warn!(%sandbox, error = %e, "dropping a token from the cluster's table");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_tokens_are_reloaded_and_expired_or_torn_ones_dropped() {
        let d = std::env::temp_dir().join(format!("ember-tokens-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let t = TokenStore::open(&d).expect("open");
        let g = |sandbox: &str, expires_at_ms| Grant {
            sandbox: sandbox.into(),
            tenant: "t".into(),
            scope: TokenScope::Exec,
            expires_at_ms,
            prefix: "est_0".into(),
        };
        let far = now_ms() + 600_000;
        t.store.save("live", &g("a", far)).expect("save");
        t.store.save("old", &g("b", now_ms() - 1)).expect("save");
        std::fs::write(d.join("torn.json"), "EMBER-STATE v1 0\n{").expect("torn");
        let t = TokenStore::open(&d).expect("reopen");
        assert_eq!(t.live.keys().collect::<Vec<_>>(), ["live"]);
        assert_eq!(t.live["live"], g("a", far));
        // A removed record's files are kept as spares for the next ones
        // (store/spares.rs): zeroed, named `.spare-<n>`, no records.
        let mut left: Vec<_> = std::fs::read_dir(&d)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().into_string().expect("utf-8"))
            .filter(|n| !n.starts_with(".spare-"))
            .collect();
        left.sort();
        assert_eq!(left, ["live.json"], "expired and torn records stay on disk");
        let _ = std::fs::remove_dir_all(&d);
    }
}
