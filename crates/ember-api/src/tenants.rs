//! `/v1/tenants` and `/v1/audit`: the admin's routes of multi-tenancy
//! (`tenancy.rs` keeps tenant keys away from them), and the per-tenant usage
//! figures of `/metrics`.
use crate::error::ApiError;
use crate::tenancy::{quota_error, usage};
use crate::{ApiJson, ApiPath, ApiState};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_types::tenant::{AuditList, CreateTenantRequest, KeyList, TenantList, UpdateTenantRequest};
use std::fmt::Write;

pub async fn create(
    State(st): State<ApiState>,
    ApiJson(req): ApiJson<CreateTenantRequest>,
) -> Result<Response, ApiError> {
    let t = st.tenants.create(&req.name, req.quotas).await.map_err(quota_error)?;
    Ok((StatusCode::CREATED, Json(t)).into_response())
}

pub async fn list(State(st): State<ApiState>) -> Json<TenantList> {
    Json(TenantList { items: st.tenants.list() })
}

/// One tenant with its usage counted now.
pub async fn get_one(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<Response, ApiError> {
    let mut t = st.tenants.get(&name).map_err(quota_error)?;
    t.usage = Some(usage(&st, &name).await?);
    Ok(Json(t).into_response())
}

/// `PATCH`: a merge patch of the tenant's quotas; answers the tenant with
/// its usage counted now.
pub async fn update(
    State(st): State<ApiState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<UpdateTenantRequest>,
) -> Result<Response, ApiError> {
    let mut t = st.tenants.update_quotas(&name, &req.quotas).await.map_err(quota_error)?;
    t.usage = Some(usage(&st, &name).await?);
    Ok(Json(t).into_response())
}

pub async fn remove(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<StatusCode, ApiError> {
    st.tenants.remove(&name).await.map_err(quota_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// A new key, shown in this answer only.
pub async fn create_key(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<Response, ApiError> {
    let k = st.tenants.create_key(&name).await.map_err(quota_error)?;
    Ok((StatusCode::CREATED, Json(k)).into_response())
}

pub async fn keys(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<Json<KeyList>, ApiError> {
    Ok(Json(KeyList { items: st.tenants.get(&name).map_err(quota_error)?.keys }))
}

pub async fn revoke_key(
    State(st): State<ApiState>,
    ApiPath((name, prefix)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    st.tenants.revoke_key(&name, &prefix).await.map_err(quota_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `since`: unix milliseconds or an RFC 3339 time.
fn parse_since(v: &str) -> Result<i64, ApiError> {
    if let Ok(ms) = v.parse::<i64>() {
        return Ok(ms);
    }
    let t = time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc3339)
        .map_err(|e| ApiError::bad_request(format!("since {v:?}: expected unix ms or RFC 3339 ({e})")))?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// `GET /v1/audit?tenant=&since=`: the newest matching records, oldest
/// first; on a cluster every live node's, merged by time.
pub async fn audit(State(st): State<ApiState>, RawQuery(q): RawQuery) -> Result<Json<AuditList>, ApiError> {
    let (mut tenant, mut since) = (None, 0);
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "tenant" => tenant = Some(v.into_owned()),
            "since" => since = parse_since(&v)?,
            _ => {}
        }
    }
    let mut items = st.engine.audit_elsewhere(tenant.as_deref(), since).await?;
    if !items.is_empty() {
        items.extend(audit_here(&st, tenant, since).await?);
        items.sort_by_key(|r| r.ts_ms);
        let over = items.len().saturating_sub(ember_engine::tenants::MAX_AUDIT_QUERY);
        items.drain(..over);
    } else {
        items = audit_here(&st, tenant, since).await?;
    }
    Ok(Json(AuditList { items }))
}

/// This node's own audit records of `tenant` (all without one) from `since`.
pub(crate) async fn audit_here(
    st: &ApiState,
    tenant: Option<String>,
    since: i64,
) -> Result<Vec<ember_types::tenant::AuditRecord>, ApiError> {
    let audit = st.tenants.clone();
    tokio::task::spawn_blocking(move || audit.audit().query(tenant.as_deref(), since))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "GENERAL::INTERNAL", e.to_string()))?
        .map_err(quota_error)
}

/// A gauge's name, help and figure.
type Series = (&'static str, &'static str, fn(&ember_types::tenant::Usage) -> u64);

/// `ember_tenant_*` gauges, one series per tenant, for `/metrics`.
pub(crate) async fn metrics_text(st: &ApiState) -> String {
    let mut out = String::new();
    let tenants = st.tenants.list();
    if tenants.is_empty() {
        return out;
    }
    let mut rows = Vec::new();
    for t in &tenants {
        if let Ok(u) = usage(st, &t.name).await {
            rows.push((t.name.clone(), u));
        }
    }
    let series: [Series; 7] = [
        ("ember_tenant_running_sandboxes", "Sandboxes of the tenant that have not ended.", |u| u.running_sandboxes),
        ("ember_tenant_memory_bytes", "Memory limits of those sandboxes, summed.", |u| u.memory_bytes),
        ("ember_tenant_cpu_millis", "Cpu limits of those sandboxes, summed, in thousandths.", |u| u.cpu_millis),
        ("ember_tenant_pool_size", "Maximum sizes of the tenant's warm pools, summed.", |u| u.pool_size),
        ("ember_tenant_workspace_bytes", "Sizes of the tenant's workspaces, summed.", |u| u.workspace_bytes),
        ("ember_tenant_tasks", "The tenant's tasks not finished.", |u| u.tasks),
        ("ember_tenant_snapshot_bytes", "Bytes of the tenant's snapshots, summed.", |u| u.snapshot_bytes),
    ];
    for (name, help, get) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (t, u) in &rows {
            let _ = writeln!(out, "{name}{{tenant=\"{t}\"}} {}", get(u));
        }
    }
    out
}
