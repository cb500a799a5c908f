//! Egress networking routes: a sandbox's network policy (read and replace at
//! runtime), its denied-flow log, and the node's slot pool. Also the parsing
//! of the create body's `network`, `allow` and OpenSandbox `networkPolicy`.
use crate::error::ApiError;
use crate::{ApiJson, ApiPath, ApiState};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_engine::NetworkStatus;
use ember_types::{DeniedFlowList, EgressPolicy, EgressTarget, NetworkInfo, NetworkMode, NetworkNodeInfo};

/// `network` and `allow` of a create body → (mode, policy). OpenSandbox's
/// `networkPolicy` is passed through to the engine, which decides whether it
/// is enforced (see `ember_engine::network`).
pub fn parse(
    network: Option<&str>,
    allow: &[String],
    has_network_policy: bool,
) -> Result<(Option<NetworkMode>, Option<EgressPolicy>), ApiError> {
    let mode = network
        .map(|n| {
            NetworkMode::parse(n).ok_or_else(|| ApiError::bad_request(format!("network {n:?}: \"none\" or \"egress\"")))
        })
        .transpose()?;
    if !allow.is_empty() && has_network_policy {
        return Err(ApiError::bad_request("give either allow or networkPolicy, not both"));
    }
    let policy = match allow.is_empty() {
        true => None,
        false => Some(EgressPolicy::allow_only(
            allow
                .iter()
                .map(|a| EgressTarget::parse(a).map_err(|e| ApiError::bad_request(e.to_string())))
                .collect::<Result<_, _>>()?,
        )),
    };
    Ok((mode, policy))
}

fn info(s: NetworkStatus) -> NetworkInfo {
    NetworkInfo {
        network: s.mode,
        enforcement_mode: ember_engine::enforcement(s.mode, &s.policy).to_string(),
        address: s.address.map(|a| a.to_string()),
        policy: s.policy,
    }
}

pub async fn get_policy(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(info(st.engine.network_status(&id).await?)).into_response())
}

pub async fn put_policy(
    State(st): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(policy): ApiJson<EgressPolicy>,
) -> Result<Response, ApiError> {
    Ok(Json(info(st.engine.set_network_policy(&id, policy).await?)).into_response())
}

pub async fn events(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(DeniedFlowList { items: st.engine.network_events(&id).await? }).into_response())
}

pub async fn node(State(st): State<ApiState>) -> Result<Response, ApiError> {
    let info = match st.engine.network_stats() {
        None => NetworkNodeInfo::default(),
        Some(s) => NetworkNodeInfo {
            enabled: true,
            range: st.engine.network_range().unwrap_or_default(),
            ready: s.ready as u64,
            in_use: s.in_use as u64,
            creating: s.creating as u64,
            target: s.target as u64,
            capacity: s.capacity as u64,
            created_total: s.created_total,
            create_micros_avg: s.create_micros_avg,
        },
    };
    Ok(Json(info).into_response())
}
