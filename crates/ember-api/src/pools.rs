//! `/v1/pools`: ember's warm pools.
use crate::error::ApiError;
use crate::{ApiJson, ApiPath, ApiState};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_engine::pool::plan::Target;
use ember_engine::pool::{CreatePool, PoolStatus, WINDOW};
use ember_types::api::{CreatePoolRequest, PoolInfo, PoolList, PoolNodeInfo, PoolSizing, ResizePoolRequest};

fn target(v: Option<serde_json::Value>) -> Result<Option<Target>, ApiError> {
    let bad = || ApiError::bad_request("target must be \"auto\" or a number of idle sandboxes");
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) if s == "auto" => Ok(Some(Target::Auto)),
        Some(serde_json::Value::String(s)) => s.parse().map(|n| Some(Target::Fixed(n))).map_err(|_| bad()),
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().and_then(|n| u32::try_from(n).ok()).map(|n| Some(Target::Fixed(n))).ok_or_else(bad)
        }
        Some(_) => Err(bad()),
    }
}

pub fn info(s: &PoolStatus) -> PoolInfo {
    PoolInfo {
        name: s.spec.name.clone(),
        template: s.spec.template.clone(),
        min: s.spec.min,
        max: s.spec.max,
        target: match s.spec.target {
            Target::Auto => "auto".into(),
            Target::Fixed(n) => n.into(),
        },
        resources: s.spec.resources.clone(),
        runtime_class: s.spec.runtime_class.clone(),
        idle: s.idle,
        starting: s.starting,
        claims_total: s.claims_total,
        misses_total: s.misses_total,
        misses_in_window: s.misses_window,
        create_failures: s.create_failures,
        idle_memory_bytes: s.idle_memory_bytes,
        sizing: PoolSizing {
            arrival_per_sec: s.sizing.arrival_per_sec,
            refill_secs: s.sizing.refill_secs,
            in_flight_demand: s.sizing.in_flight_demand,
            headroom: s.sizing.headroom,
            target: s.sizing.target,
            window_secs: WINDOW.as_secs(),
        },
        network: (s.spec.network == ember_types::NetworkMode::Egress).then(|| "egress".to_string()),
        from_snapshot: s.spec.from_snapshot.clone(),
        from_checkpoint: s.spec.from_checkpoint.clone(),
        auto_pause: s
            .spec
            .auto_pause_secs
            .map(|after_seconds| ember_types::api::AutoPause { after_seconds, checkpoint: false }),
        nodes: s
            .nodes
            .iter()
            .map(|n| PoolNodeInfo { node: n.node.clone(), target: n.target, idle: n.idle, starting: n.starting })
            .collect(),
    }
}

pub async fn create(
    State(st): State<ApiState>,
    ApiJson(req): ApiJson<CreatePoolRequest>,
) -> Result<Response, ApiError> {
    if req.auto_pause.is_some_and(|a| a.checkpoint) {
        return Err(ApiError::bad_request("autoPause.checkpoint is a create's choice, not a pool's"));
    }
    let res = req.resources.unwrap_or_default();
    let (network, egress) = crate::network::parse(req.network.as_deref(), &req.allow, false)?;
    let status = st
        .engine
        .create_pool(CreatePool {
            name: req.name,
            template: req.template,
            min: req.min,
            max: req.max,
            target: target(req.target)?,
            memory: res.memory,
            cpu: res.cpu,
            pids: res.pids,
            disk: res.disk,
            runtime_class: req.runtime_class,
            network,
            egress,
            from_snapshot: req.from_snapshot,
            from_checkpoint: req.from_checkpoint,
            auto_pause_secs: req.auto_pause.map(|a| a.after_seconds),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(info(&status))).into_response())
}

pub async fn list(
    State(st): State<ApiState>,
    axum::Extension(p): axum::Extension<crate::Principal>,
) -> Result<Response, ApiError> {
    let all = st.engine.list_pools().await?;
    let items = crate::tenancy::visible(&st, &p, ember_engine::tenants::Kind::Pool, all, |s| &s.spec.name)
        .iter()
        .map(info)
        .collect();
    Ok(Json(PoolList { items }).into_response())
}

pub async fn get_one(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(info(&st.engine.pool_status(&name).await?)).into_response())
}

pub async fn resize(
    State(st): State<ApiState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<ResizePoolRequest>,
) -> Result<Response, ApiError> {
    let s = st.engine.resize_pool(&name, req.min, req.max, target(req.target)?).await?;
    Ok(Json(info(&s)).into_response())
}

pub async fn remove(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<StatusCode, ApiError> {
    st.engine.remove_pool(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
