//! Workspace snapshots: `/v1/workspaces/{name}/snapshots` and
//! `/v1/workspace-snapshots/...` (OpenSandbox's `/v1/snapshots` are sandbox
//! snapshots, a different thing).
use crate::convert::rfc3339;
use crate::error::ApiError;
use crate::workspaces::info as workspace_info;
use crate::{ApiJson, ApiPath, ApiState};
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_snapshot::SnapshotSummary;
use ember_types::api::{
    ForkSnapshotRequest, RestoreSnapshotRequest, SnapshotGcReport, SnapshotGcRequest, SnapshotOperation,
    SnapshotOperationList, SnapshotWorkspaceRequest, WorkspaceList, WorkspaceSnapshotInfo, WorkspaceSnapshotList,
};

pub fn info(s: &SnapshotSummary) -> WorkspaceSnapshotInfo {
    let st = &s.stats;
    WorkspaceSnapshotInfo {
        id: s.id.clone(),
        workspace: s.labels.get("workspace").cloned().unwrap_or_default(),
        created_at: rfc3339(s.created_unix_ms as i64),
        epoch: s.labels.get("epoch").and_then(|e| e.parse().ok()),
        logical_bytes: st.logical_bytes,
        files: st.files,
        chunks: st.chunk_refs,
        unique_chunks: st.unique_chunks,
        chunks_uploaded: st.chunks_uploaded,
        bytes_uploaded: st.bytes_uploaded,
        stored_bytes_uploaded: st.stored_bytes_uploaded,
        chunks_reused: st.chunks_reused,
        dedup_ratio: if st.bytes_uploaded == 0 { st.logical_bytes.max(1) as f64 } else { st.dedup_ratio() },
        stored_bytes: st.stored_bytes,
        compression_ratio: st.compression_ratio(),
        warnings: s.warnings.clone(),
    }
}

pub async fn create(
    State(st): State<ApiState>,
    ApiPath(name): ApiPath<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    // The body is optional: an empty one means "no fencing".
    let req: SnapshotWorkspaceRequest = optional_json(&body)?;
    let fence = match (req.holder, req.epoch) {
        (Some(h), Some(e)) => Some((h, e)),
        (None, None) => None,
        _ => return Err(ApiError::bad_request("holder and epoch go together")),
    };
    let s = st.engine.snapshot_workspace_op(&name, fence, req.operation_id).await?;
    Ok((StatusCode::CREATED, Json(info(&s))).into_response())
}

pub async fn list(
    State(st): State<ApiState>,
    axum::Extension(p): axum::Extension<crate::Principal>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let ws = form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "workspace")
        .map(|(_, v)| v.into_owned());
    let all = st.engine.list_snapshots(ws).await?;
    let items = crate::tenancy::visible(&st, &p, ember_engine::tenants::Kind::WorkspaceSnapshot, all, |s| &s.id)
        .iter()
        .map(info)
        .collect();
    Ok(Json(WorkspaceSnapshotList { items }).into_response())
}

pub async fn get_one(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(info(&st.engine.inspect_snapshot(&id).await?)).into_response())
}

pub async fn remove(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<StatusCode, ApiError> {
    st.engine.delete_snapshot(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn restore(
    State(st): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<RestoreSnapshotRequest>,
) -> Result<Response, ApiError> {
    let size = req
        .size
        .map(|s| ember_types::parse_memory_bytes(&s).map_err(|e| ApiError::bad_request(format!("size: {e}"))))
        .transpose()?;
    let w = st.engine.restore_workspace_op(&id, &req.name, size, req.operation_id).await?;
    Ok((StatusCode::CREATED, Json(workspace_info(&w))).into_response())
}

pub async fn fork(
    State(st): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(req): ApiJson<ForkSnapshotRequest>,
) -> Result<Response, ApiError> {
    let all = st.engine.fork_snapshot_op(&id, req.count, &req.prefix, req.operation_id).await?;
    Ok((StatusCode::CREATED, Json(WorkspaceList { items: all.iter().map(workspace_info).collect() })).into_response())
}

fn operation(o: &ember_engine::SnapshotOp) -> SnapshotOperation {
    SnapshotOperation {
        id: o.id.clone(),
        kind: o.kind.as_str().into(),
        target: o.target.clone(),
        phase: o.phase().into(),
        bytes_done: o.bytes_done(),
        bytes_total: o.progress.bytes_total,
        chunks_done: o.progress.chunks_done,
        chunks_new: o.progress.chunks_new,
        items_done: o.items_done,
        items_total: o.items_total,
        started_at: rfc3339(o.started_ms),
        finished_at: o.finished_ms.map(rfc3339),
        error: o.error.clone(),
        result: o.result.clone(),
    }
}

/// `GET /v1/workspace-snapshots/operations`: running and recently finished operations.
pub async fn operations(State(st): State<ApiState>) -> Result<Response, ApiError> {
    let items = st.engine.snapshot_ops().await?.iter().map(operation).collect();
    Ok(Json(SnapshotOperationList { items }).into_response())
}

/// `GET /v1/workspace-snapshots/operations/{id}`.
pub async fn operation_one(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(operation(&st.engine.snapshot_op(&id).await?)).into_response())
}

/// `POST /v1/snapshot-store/gc`: one mark-and-sweep now (it waits for the
/// snapshots this daemon is writing, and holds new ones until it is done).
pub async fn gc(State(st): State<ApiState>, body: axum::body::Bytes) -> Result<Response, ApiError> {
    let req: SnapshotGcRequest = optional_json(&body)?;
    let r = st.engine.gc_snapshots(req.min_age_seconds.map(std::time::Duration::from_secs)).await?;
    Ok(Json(SnapshotGcReport {
        manifests: r.manifests,
        chunks_seen: r.chunks_seen,
        chunks_referenced: r.chunks_referenced,
        chunks_deleted: r.chunks_deleted,
        bytes_deleted: r.bytes_deleted,
        chunks_spared_young: r.chunks_spared_young,
        missing_chunks: r.missing_chunks,
    })
    .into_response())
}

/// A JSON body that may be left out (empty or whitespace: the defaults).
fn optional_json<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    crate::body::decode_slice(body)
}
