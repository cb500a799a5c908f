//! Wire types of multi-tenancy (`/v1/tenants`, `/v1/audit`): tenants, their
//! API keys (only a prefix is ever shown after creation), quotas and usage,
//! and one audit record. docs/tenancy.md describes the model.
use serde::{Deserialize, Serialize};

/// The tenant of every object created without a tenant key (the admin key,
/// or no key on a loopback daemon).
pub const DEFAULT_TENANT: &str = "default";

/// Limits of one tenant; `None` is no limit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Quotas {
    /// Sandboxes that are not ended (pending, running, paused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_sandboxes: Option<u64>,
    /// Sum of those sandboxes' memory limits, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Sum of those sandboxes' cpu limits, in thousandths of a cpu.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u64>,
    /// Sum of the tenant's warm pools' sizes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_size: Option<u64>,
    /// Sizes of the tenant's workspaces, summed, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_bytes: Option<u64>,
    /// The tenant's tasks not finished (queued, leased, running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<u64>,
    /// Bytes of the tenant's sandbox and workspace snapshots, summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_bytes: Option<u64>,
    /// Sandbox creates per second (a token bucket of that size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creates_per_second: Option<u32>,
}

/// What a tenant uses of its quotas now.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub running_sandboxes: u64,
    pub memory_bytes: u64,
    pub cpu_millis: u64,
    pub pool_size: u64,
    pub workspace_bytes: u64,
    pub tasks: u64,
    #[serde(default)]
    pub snapshot_bytes: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateTenantRequest {
    pub name: String,
    #[serde(default)]
    pub quotas: Quotas,
}

/// `PATCH /v1/tenants/{name}`: a JSON merge patch (RFC 7396) of the
/// tenant's quotas.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateTenantRequest {
    #[serde(default)]
    pub quotas: QuotasPatch,
}

/// A change of [`Quotas`]: a quota given sets its limit, one given `null`
/// removes it (no limit), one not named stays as it is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotasPatch {
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub running_sandboxes: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub pool_size: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub workspace_bytes: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub snapshot_bytes: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub creates_per_second: Option<Option<u32>>,
}

/// A field that is there, `null` included (`Some(None)`); one that is not
/// is the field's default (`None`).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl QuotasPatch {
    /// `q` with this change applied.
    pub fn apply(&self, q: &mut Quotas) {
        fn set<T: Copy>(to: &mut Option<T>, change: Option<Option<T>>) {
            if let Some(v) = change {
                *to = v;
            }
        }
        set(&mut q.running_sandboxes, self.running_sandboxes);
        set(&mut q.memory_bytes, self.memory_bytes);
        set(&mut q.cpu_millis, self.cpu_millis);
        set(&mut q.pool_size, self.pool_size);
        set(&mut q.workspace_bytes, self.workspace_bytes);
        set(&mut q.tasks, self.tasks);
        set(&mut q.snapshot_bytes, self.snapshot_bytes);
        set(&mut q.creates_per_second, self.creates_per_second);
    }
}

/// One API key as listed: never the key itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyInfo {
    pub prefix: String,
    pub created_at_ms: i64,
}

/// The answer of a key's creation: the only time the key is shown.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedKey {
    pub prefix: String,
    pub key: String,
    pub created_at_ms: i64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantInfo {
    pub name: String,
    pub created_at_ms: i64,
    pub quotas: Quotas,
    pub keys: Vec<KeyInfo>,
    /// Filled by `GET /v1/tenants/{name}` (a live count), not by the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One line of the audit log (`<data>/audit/audit.jsonl`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    pub ts_ms: i64,
    pub tenant: String,
    /// The key's prefix (`admin` for the admin key, `none` without a key).
    pub key: String,
    pub source: String,
    pub request_id: String,
    pub method: String,
    pub path: String,
    /// What was done, e.g. `sandbox.create`, `exec`, `file.write`.
    pub action: String,
    /// An exec's command line; never its output, never env values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argv: Option<String>,
    pub status: u16,
    /// `ok`, `denied` or `error`.
    pub outcome: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TenantList {
    pub items: Vec<TenantInfo>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KeyList {
    pub items: Vec<KeyInfo>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AuditList {
    pub items: Vec<AuditRecord>,
}

/// What a scoped token opens on its sandbox's proxy route.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenScope {
    /// Every port of the sandbox, every path.
    #[default]
    All,
    /// execd's commands, sessions, PTYs and code contexts (and `/ping`).
    Exec,
    /// execd's file and directory routes (and `/ping`).
    Files,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateTokenRequest {
    /// Lifetime; default 900 s, at most 86,400 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    #[serde(default)]
    pub scope: TokenScope,
}

/// A scoped token, shown once.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopedToken {
    pub token: String,
    pub sandbox_id: String,
    pub scope: TokenScope,
    pub expires_at_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_patch_sets_what_it_names_clears_its_nulls_and_keeps_the_rest() {
        let mut q = Quotas { running_sandboxes: Some(1), memory_bytes: Some(8), tasks: Some(3), ..Quotas::default() };
        let p: UpdateTenantRequest =
            serde_json::from_str(r#"{"quotas": {"runningSandboxes": 5, "memoryBytes": null}}"#).expect("a patch");
        p.quotas.apply(&mut q);
        assert_eq!(q, Quotas { running_sandboxes: Some(5), tasks: Some(3), ..Quotas::default() });
        let back = serde_json::to_value(&p).expect("encodes");
        assert_eq!(back, serde_json::json!({"quotas": {"runningSandboxes": 5, "memoryBytes": null}}));
        let unknown = serde_json::from_str::<UpdateTenantRequest>(r#"{"quotas": {"sandboxes": 5}}"#);
        assert!(unknown.is_err(), "an unknown quota is refused");
    }
}
