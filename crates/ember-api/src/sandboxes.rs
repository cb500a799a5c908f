//! The lifecycle routes (`/v1/sandboxes...`), OpenSandbox 1.1.1 status codes.
use crate::convert::{create_request, parse_rfc3339_ms, rfc3339, sandbox_info};
use crate::error::ApiError;
use crate::paging::Paging;
use crate::{ApiJson, ApiPath, ApiState};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_engine::ListFilter;
use ember_types::api::{CreateSandboxRequest, Endpoint, RenewRequest, SandboxList};
use ember_types::SandboxState;
use std::collections::BTreeMap;

pub async fn create(
    State(st): State<ApiState>,
    axum::Extension(p): axum::Extension<crate::Principal>,
    ApiJson(mut req): ApiJson<CreateSandboxRequest>,
) -> Result<Response, ApiError> {
    // OpenSandbox's `secureAccess`: the endpoint answers carry a scoped token.
    let secure = req.secure_access.take() == Some(true);
    let mut create = create_request(req)?;
    // A warm claim only from the caller's tenant's pools.
    create.tenant = p.tenant_key().map(str::to_string);
    let rec = st.engine.create(create).await?;
    if secure {
        st.tenants.set_secure(rec.id.as_str()).await.map_err(crate::tenancy::quota_error)?;
    }
    let micros = rec.launch.as_ref().map_or(0, |l| l.micros);
    let mut resp = (StatusCode::ACCEPTED, Json(sandbox_info(&rec))).into_response();
    resp.headers_mut().insert("x-ember-launch-micros", micros.into());
    Ok(resp)
}

pub async fn get_one(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(sandbox_info(&st.engine.get(&id).await?)).into_response())
}

pub async fn remove(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<StatusCode, ApiError> {
    st.engine.remove(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn list(
    State(st): State<ApiState>,
    axum::Extension(p): axum::Extension<crate::Principal>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let mut f = ListFilter::default();
    let mut paging = Paging::default();
    let mut any_state = false;
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "state" => {
                // States ember never enters (Pausing, Allocated...) match nothing,
                // as upstream: clients must tolerate unknown state names.
                any_state = true;
                if let Some(st) = SandboxState::parse(&v) {
                    f.states.push(st);
                }
            }
            "metadata" => {
                for (mk, mv) in form_urlencoded::parse(v.as_bytes()) {
                    f.metadata.push((mk.into_owned(), mv.into_owned()));
                }
            }
            k => {
                paging.accept(k, &v)?;
            }
        }
    }
    let all = if any_state && f.states.is_empty() { Vec::new() } else { st.engine.list(&f).await? };
    let all = crate::tenancy::visible(&st, &p, ember_engine::tenants::Kind::Sandbox, all, |r| r.id.as_str());
    let (items, pagination) = paging.cut(&all, sandbox_info);
    Ok(Json(SandboxList { items, pagination }).into_response())
}

pub async fn pause(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<StatusCode, ApiError> {
    st.engine.pause(&id).await?;
    Ok(StatusCode::ACCEPTED)
}

pub async fn resume(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<StatusCode, ApiError> {
    st.engine.resume(&id).await?;
    Ok(StatusCode::ACCEPTED)
}

/// Saves a runsc sandbox's processes and memory to disk and stops them; it
/// reads Paused until a resume restores it.
pub async fn checkpoint(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<StatusCode, ApiError> {
    st.engine.checkpoint(&id).await?;
    Ok(StatusCode::ACCEPTED)
}

pub async fn renew(
    State(st): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<RenewRequest>,
) -> Result<Response, ApiError> {
    let ms = parse_rfc3339_ms(&req.expires_at)?;
    let rec = st.engine.renew(&id, ms).await?;
    let at = rec.expires_at_ms.map(rfc3339).unwrap_or_default();
    Ok(Json(serde_json::json!({ "expiresAt": at })).into_response())
}

pub async fn patch_metadata(
    State(st): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(patch): ApiJson<BTreeMap<String, Option<String>>>,
) -> Result<Response, ApiError> {
    Ok(Json(sandbox_info(&st.engine.patch_metadata(&id, patch).await?)).into_response())
}

/// Every port is reached through the daemon's proxy route, so the sandbox needs
/// no network of its own. The endpoint has no scheme, as OpenSandbox clients expect.
pub async fn endpoint(
    State(st): State<ApiState>,
    ApiPath((id, port)): ApiPath<(String, u16)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    st.engine.get(&id).await?;
    let host = st
        .cfg
        .public_host
        .clone()
        .or_else(|| headers.get("host").and_then(|h| h.to_str().ok()).map(str::to_string))
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    let mut out_headers = BTreeMap::new();
    if let (Some(_), Some(k)) =
        (&st.cfg.api_key, headers.get(crate::middleware::API_KEY_HEADER).and_then(|v| v.to_str().ok()))
    {
        // The proxy route is authenticated like every other; hand the caller's own
        // key back so the SDK sends it with its execd requests.
        out_headers.insert("OPEN-SANDBOX-API-KEY".to_string(), k.to_string());
    }
    if st.tenants.is_secure(&id) {
        let owner = st.tenants.owner(ember_engine::tenants::Kind::Sandbox, &id);
        let ttl = ember_engine::tenants::DEFAULT_TTL_SECS;
        let (token, _) = st
            .tenants
            .mint_token(&id, &owner, ember_types::tenant::TokenScope::All, ttl)
            .await
            .map_err(crate::tenancy::quota_error)?;
        out_headers.insert("OpenSandbox-Secure-Access".to_string(), token);
    }
    Ok(Json(Endpoint { endpoint: endpoint_of(&st.cfg, &host, &id, port), headers: out_headers }).into_response())
}

/// With `--sandbox-domain`, a port's own origin, `<port>-<id>.<domain>` on
/// the API's listener port; else (and always for execd and the egress port,
/// which the OpenSandbox SDKs reach by appending their paths to this answer,
/// and which serve no pages) the path route on the API's host.
fn endpoint_of(cfg: &crate::ApiConfig, host: &str, id: &str, port: u16) -> String {
    use ember_types::execd::{EGRESS_PORT, EXECD_PORT};
    match cfg.sandbox_domain.as_deref() {
        Some(domain) if port != EXECD_PORT && port != EGRESS_PORT => {
            let name = crate::origin::host_name(port, id, domain);
            match host.parse::<axum::http::uri::Authority>().ok().and_then(|a| a.port_u16()) {
                Some(listener) => format!("{name}:{listener}"),
                None => name,
            }
        }
        _ => format!("{host}/v1/sandboxes/{id}/proxy/{port}"),
    }
}

pub async fn boundary(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(st.engine.boundary(&id).await?).into_response())
}

/// `GET /v1/sandboxes/{id}/stats`: the cgroup's live figures (`ember stats`).
pub async fn stats(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(st.engine.stats(&id).await?).into_response())
}
