//! Sandbox snapshots, OpenSandbox 1.1.1: `POST /v1/sandboxes/{id}/snapshots`
//! (202 + `Location`), `GET /v1/snapshots` (filters `sandboxId`, `name`,
//! `state` OR-ed, pagination), `GET|DELETE /v1/snapshots/{id}`. Restore is a
//! create with `snapshotId` (`sandboxes.rs`). The snapshot is taken before the
//! 202 is answered (as upstream's Docker runtime does), so it is Ready then.
use crate::convert::rfc3339;
use crate::error::ApiError;
use crate::paging::Paging;
use crate::{ApiPath, ApiState};
use axum::extract::{RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_engine::{SandboxSnapshotRecord, SandboxSnapshotState, SnapshotFilter};
use ember_types::api::{
    CreateSnapshotRequest, SandboxSnapshotInfo, SandboxSnapshotList, SnapshotStatus, SnapshotWorkspaceInfo,
};

pub fn snapshot_info(r: &SandboxSnapshotRecord) -> SandboxSnapshotInfo {
    SandboxSnapshotInfo {
        id: r.id.clone(),
        sandbox_id: r.sandbox_id.to_string(),
        name: r.name.clone(),
        status: SnapshotStatus {
            state: r.state.as_str().to_string(),
            reason: r.reason.clone(),
            message: r.message.clone(),
            last_transition_at: Some(rfc3339(r.last_transition_ms)),
        },
        created_at: rfc3339(r.created_at_ms),
        template: Some(r.spec.template.clone()),
        runtime_class: Some(r.spec.runtime_class.clone()),
        layer_bytes: (r.state == SandboxSnapshotState::Ready).then_some(r.layer_bytes),
        workspaces: r
            .workspaces
            .iter()
            .map(|w| SnapshotWorkspaceInfo {
                name: w.name.clone(),
                mount_path: w.path.clone(),
                read_only: w.read_only,
                snapshot_id: w.snapshot_id.clone(),
            })
            .collect(),
    }
}

/// The body is optional (the SDK sends `{"name": null}` or nothing).
pub async fn create(
    State(st): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let req: CreateSnapshotRequest = if body.iter().all(u8::is_ascii_whitespace) {
        CreateSnapshotRequest::default()
    } else {
        crate::body::decode_slice::<Option<CreateSnapshotRequest>>(&body)?.unwrap_or_default()
    };
    if req.name.as_deref() == Some("") {
        return Err(ApiError::bad_request("name must not be empty"));
    }
    let rec = st.engine.snapshot_sandbox(&id, req.name).await?;
    let mut resp = (StatusCode::ACCEPTED, Json(snapshot_info(&rec))).into_response();
    if let Ok(v) = format!("/v1/snapshots/{}", rec.id).parse() {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
}

pub async fn get_one(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(snapshot_info(&st.engine.sandbox_snapshot(&id).await?)).into_response())
}

pub async fn remove(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<StatusCode, ApiError> {
    st.engine.delete_sandbox_snapshot(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn list(
    State(st): State<ApiState>,
    axum::Extension(p): axum::Extension<crate::Principal>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let mut f = SnapshotFilter::default();
    let mut paging = Paging::default();
    let mut any_state = false;
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "sandboxId" => f.sandbox_id = Some(v.into_owned()),
            "name" => f.name = Some(v.into_owned()),
            "state" => {
                // Unknown state names match nothing, as for sandboxes.
                any_state = true;
                f.states.extend(SandboxSnapshotState::parse(&v));
            }
            k => {
                paging.accept(k, &v)?;
            }
        }
    }
    let all = if any_state && f.states.is_empty() { Vec::new() } else { st.engine.list_sandbox_snapshots(&f).await? };
    let all = crate::tenancy::visible(&st, &p, ember_engine::tenants::Kind::SandboxSnapshot, all, |r| &r.id);
    let (items, pagination) = paging.cut(&all, snapshot_info);
    Ok(Json(SandboxSnapshotList { items, pagination }).into_response())
}
