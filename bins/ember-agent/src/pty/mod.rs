//! Interactive terminals (execd ≥ 1.0.10, protocol §3): `POST /pty {cwd?,
//! command?}` → 201 `{session_id}`, `GET /pty/{id}` → status with
//! `output_offset`, `DELETE /pty/{id}`, and the WebSocket `GET /pty/{id}/ws`
//! (`ws.rs`). The process starts when the first client connects, on a real
//! terminal (`pty=1`, the default) or on plain pipes (`pty=0`).
//!
//! Layout: `ring` (the replay buffer), `session` (process, output pump,
//! attachment), `ws` (the WebSocket protocol).
mod ring;
mod session;
mod ws;

use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::server::App;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use session::PtySession;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::DirBuilderExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Default)]
pub struct PtySessions {
    /// A std Mutex: map operations only, never held across an await.
    map: Mutex<HashMap<String, Arc<PtySession>>>,
    seq: AtomicU64,
}

impl PtySessions {
    fn get(&self, id: &str) -> ApiResult<Arc<PtySession>> {
        let map = self.map.lock();
        map.get(id).cloned().ok_or_else(|| not_found(id))
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorCode::ContextNotFound, format!("pty session {id} not found"))
}

#[derive(Debug, Default, Deserialize)]
pub struct CreatePtyRequest {
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub command: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct CreatePtyResponse {
    pub session_id: String,
}

#[derive(Debug, Serialize)]
pub struct PtyStatusResponse {
    pub session_id: String,
    pub running: bool,
    pub output_offset: u64,
    pub launch_attempted: bool,
    pub launch_failed: bool,
}

/// `POST /pty {cwd?, command?}` → 201 `{session_id}`. The working directory
/// is created if missing, as execd does.
pub async fn create(State(app): State<App>, body: axum::body::Bytes) -> ApiResult<Response> {
    let req: CreatePtyRequest = if body.is_empty() { Default::default() } else { crate::error::parse_json(&body)? };
    let cwd = req.cwd.filter(|c| !c.is_empty());
    if let Some(dir) = cwd.clone() {
        crate::files::blocking(move || {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&dir)
                .map_err(|e| ApiError::runtime(format!("error creating PTY session work directory {dir}: {e}")))
        })
        .await?;
    }
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(app.ptys.seq.fetch_add(1, Ordering::Relaxed));
    let id = format!("pty-{:016x}", h.finish());
    let command = req.command.filter(|c| !c.trim().is_empty());
    let session = Arc::new(PtySession::new(id.clone(), cwd, command));
    app.ptys.map.lock().insert(id.clone(), session);
    Ok((StatusCode::CREATED, Json(CreatePtyResponse { session_id: id })).into_response())
}

/// `GET /pty/{id}`.
pub async fn status(State(app): State<App>, Path(id): Path<String>) -> ApiResult<Json<PtyStatusResponse>> {
    let s = app.ptys.get(&id)?.status();
    Ok(Json(PtyStatusResponse {
        session_id: id,
        running: s.running,
        output_offset: s.output_offset,
        launch_attempted: s.launch_attempted,
        launch_failed: s.launch_failed,
    }))
}

/// `DELETE /pty/{id}`: kills the process group and drops the session.
pub async fn delete(State(app): State<App>, Path(id): Path<String>) -> ApiResult<()> {
    let session = app.ptys.map.lock().remove(&id).ok_or_else(|| not_found(&id))?;
    session.close(&app);
    Ok(())
}

#[derive(Debug, Default, Deserialize)]
pub struct WsQuery {
    #[serde(default)]
    pty: Option<String>,
    #[serde(default)]
    since: Option<String>,
    #[serde(default)]
    takeover: Option<String>,
}

/// `GET /pty/{id}/ws`: 404 for an unknown session and 409 `ALREADY_CONNECTED`
/// while another client is attached, both before the upgrade.
pub async fn websocket(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(q): Query<WsQuery>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let session = app.ptys.get(&id)?;
    let upgrade = upgrade.map_err(|e| ApiError::bad_request(format!("a WebSocket upgrade is required: {e}")))?;
    // A takeover evicts the holder only once the handshake has been accepted
    // (in the upgrade callback), so a failed handshake never evicts anyone.
    let takeover = q.takeover.as_deref() == Some("1");
    let attach = match session.try_attach() {
        Some(a) => Some(a),
        None if takeover => None,
        None => {
            return Err(ApiError::new(
                ErrorCode::AlreadyConnected,
                format!("another client is already connected to pty session {id}"),
            ))
        }
    };
    let pipe_mode = q.pty.as_deref() == Some("0");
    let since = q.since.as_deref().and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    Ok(upgrade.on_upgrade(move |socket| async move {
        // An attachment dropped unused (failed upgrade) frees the session again.
        let attach = attach.unwrap_or_else(|| session.take_over());
        let _open = crate::quiesce::StreamGuard::new();
        ws::serve(app, attach, socket, pipe_mode, since).await
    }))
}
