//! `/v1/workspaces`: ember's durable volumes.
use crate::convert::rfc3339;
use crate::error::ApiError;
use crate::{ApiJson, ApiPath, ApiState};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_engine::WorkspaceStatus;
use ember_types::api::{CreateWorkspaceRequest, WorkspaceCheckpointInfo, WorkspaceInfo, WorkspaceLease, WorkspaceList};

pub fn info(s: &WorkspaceStatus) -> WorkspaceInfo {
    WorkspaceInfo {
        name: s.meta.name.clone(),
        size_bytes: s.meta.size_bytes,
        used_bytes: s.used_bytes,
        created_at: rfc3339(s.meta.created_at_ms),
        epoch: s.meta.leases.epoch,
        lease: s.meta.leases.lease.as_ref().map(|l| WorkspaceLease { holder: l.holder.clone(), epoch: l.epoch }),
    }
}

pub async fn create(
    State(st): State<ApiState>,
    ApiJson(req): ApiJson<CreateWorkspaceRequest>,
) -> Result<Response, ApiError> {
    let size = ember_types::parse_memory_bytes(&req.size).map_err(|e| ApiError::bad_request(format!("size: {e}")))?;
    let s = st.engine.create_workspace(req.name, size).await?;
    Ok((StatusCode::CREATED, Json(info(&s))).into_response())
}

pub async fn list(
    State(st): State<ApiState>,
    axum::Extension(p): axum::Extension<crate::Principal>,
) -> Result<Response, ApiError> {
    let all = st.engine.list_workspaces().await?;
    let items = crate::tenancy::visible(&st, &p, ember_engine::tenants::Kind::Workspace, all, |w| &w.meta.name)
        .iter()
        .map(info)
        .collect();
    Ok(Json(WorkspaceList { items }).into_response())
}

pub async fn get_one(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(info(&st.engine.workspace(&name).await?)).into_response())
}

pub async fn remove(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<StatusCode, ApiError> {
    st.engine.remove_workspace(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A synchronous checkpoint: once this answers 200, every byte written in the
/// workspace before the call is in the snapshot store (off the node on a
/// cluster's shared store); 409 `WORKSPACE::FENCED` when the caller's node no
/// longer holds the workspace at its epoch.
pub async fn checkpoint(State(st): State<ApiState>, ApiPath(name): ApiPath<String>) -> Result<Response, ApiError> {
    let c = st.engine.checkpoint_workspace(&name).await?;
    Ok(Json(WorkspaceCheckpointInfo { snapshot_id: c.snapshot_id, epoch: c.epoch, at: rfc3339(c.at_ms) })
        .into_response())
}
