//! Scoped tokens: a short-lived credential bound to one sandbox (and maybe
//! to exec or files only) that an agent or a browser can present to that
//! sandbox's proxy route without holding a tenant's key. Kept in memory,
//! hashed: a daemon restart ends every token (they are minutes long; ask for
//! a new one). A token dies at its expiry, when revoked with its sandbox
//! ([`Tenants::drop_tokens`]), or at its first use after the sandbox ended.
use super::{hash, random_hex, TenantError, Tenants};
use crate::record::now_ms;
use ember_types::tenant::TokenScope;

/// Every scoped token starts with it, so the key check knows what it holds.
pub const TOKEN_PREFIX: &str = "est_";
pub const DEFAULT_TTL_SECS: u64 = 900;
pub const MAX_TTL_SECS: u64 = 86_400;

/// What a presented token grants.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    pub sandbox: String,
    pub tenant: String,
    pub scope: TokenScope,
    pub expires_at_ms: i64,
    /// The token's first characters, for the audit log.
    pub prefix: String,
}

impl Tenants {
    /// A new token for `sandbox` of `tenant`; the token is returned this once.
    pub fn mint_token(
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
        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        tokens.retain(|_, g| g.expires_at_ms > now);
        tokens.insert(hash(&token), grant.clone());
        Ok((token, grant))
    }

    /// The grant of a presented token, unless it is unknown or expired.
    pub fn token(&self, presented: &str) -> Option<Grant> {
        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        let h = hash(presented);
        match tokens.get(&h) {
            Some(g) if g.expires_at_ms > now_ms() => Some(g.clone()),
            Some(_) => {
                tokens.remove(&h);
                None
            }
            None => None,
        }
    }

    /// Ends every token of `sandbox` (it ended, or was removed).
    pub fn drop_tokens(&self, sandbox: &str) {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, g| g.sandbox != sandbox);
    }
}
