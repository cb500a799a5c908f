//! Bash sessions (protocol §3.3): `POST /session`, `POST /session/{id}/run`,
//! `DELETE /session/{id}`. A session keeps its working directory and its
//! exported variables from one run to the next.
//!
//! Each run is an ordinary command (`commands::stream`): `bash -c WRAPPER`,
//! where the wrapper restores the session's saved state, `eval`s the command,
//! and on exit (whatever the exit path) saves `export -p` and `pwd` back into
//! the session's private directory `/run/ember-sessions/<id>` (owned by the
//! user the commands run as). Shell functions and unexported variables do not
//! survive a run; runs of one session should not overlap.
use crate::commands;
use crate::error::{ApiError, ApiResult, ErrorCode, JsonBody};
use crate::server::App;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_types::execd::RunCommandRequest;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

const ROOT: &str = "/run/ember-sessions";

/// `$1` state dir, `$2` command, `$3` cwd of this run (may be empty).
const WRAPPER: &str = r#"__ember_d=$1; __ember_c=$2; __ember_w=$3; shift 3
[ -f "$__ember_d/env" ] && . "$__ember_d/env"
if [ -s "$__ember_d/cwd" ]; then cd -- "$(cat "$__ember_d/cwd")" 2>/dev/null; fi
if [ -n "$__ember_w" ]; then cd -- "$__ember_w" || exit 1; fi
trap 'export -p > "$__ember_d/env"; pwd > "$__ember_d/cwd"' EXIT
unset __ember_w
eval "$__ember_c"
"#;

#[derive(Default)]
pub struct Sessions {
    /// A std Mutex: map operations only, never held across an await.
    map: Mutex<HashMap<String, PathBuf>>,
    seq: AtomicU64,
}

#[derive(Debug, Default, Deserialize)]
pub struct CreateSessionRequest {
    #[serde(default)]
    pub cwd: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct CreateSessionResponse {
    pub session_id: String,
}

#[derive(Debug, Deserialize)]
pub struct RunInSessionRequest {
    pub command: String,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Milliseconds.
    #[serde(default)]
    pub timeout: Option<u64>,
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("session not found: {id}"))
}

/// `POST /session {cwd?}` → `{session_id}`.
pub async fn create(State(app): State<App>, body: axum::body::Bytes) -> ApiResult<Json<CreateSessionResponse>> {
    let req: CreateSessionRequest = if body.is_empty() { Default::default() } else { crate::error::parse_json(&body)? };
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(app.sessions.seq.fetch_add(1, Ordering::Relaxed));
    let id = format!("sess-{:016x}", h.finish());
    let dir = PathBuf::from(ROOT).join(&id);
    let owner = app.config.default_identity.map(|i| (i.uid, i.gid.unwrap_or(i.uid)));
    let d = dir.clone();
    crate::files::blocking(move || {
        let io = |e: std::io::Error| ApiError::runtime(format!("session dir {}: {e}", d.display()));
        std::fs::DirBuilder::new().recursive(true).mode(0o711).create(ROOT).map_err(io)?;
        std::fs::DirBuilder::new().mode(0o700).create(&d).map_err(io)?;
        if let Some(cwd) = req.cwd.filter(|c| !c.is_empty()) {
            std::fs::write(d.join("cwd"), format!("{cwd}\n")).map_err(io)?;
        }
        if let Some((uid, gid)) = owner {
            for p in [d.clone(), d.join("cwd")] {
                if p.exists() {
                    std::os::unix::fs::chown(&p, Some(uid), Some(gid)).map_err(io)?;
                }
            }
        }
        Ok(())
    })
    .await?;
    app.sessions.map.lock().insert(id.clone(), dir);
    Ok(Json(CreateSessionResponse { session_id: id }))
}

/// `POST /session/{id}/run {command, cwd?, timeout?}` → command stream.
pub async fn run(
    State(app): State<App>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<RunInSessionRequest>,
) -> Response {
    let Some(dir) = app.sessions.map.lock().get(&id).cloned() else {
        return not_found(&id).into_response();
    };
    if req.command.trim().is_empty() {
        return ApiError::bad_request("command is empty").into_response();
    }
    let argv = vec![
        "bash".to_string(),
        "-c".to_string(),
        WRAPPER.to_string(),
        "ember-session".to_string(),
        dir.display().to_string(),
        req.command,
        req.cwd.unwrap_or_default(),
    ];
    let run = RunCommandRequest { argv: Some(argv), timeout: req.timeout, ..Default::default() };
    commands::stream(app, run).await
}

/// `DELETE /session/{id}`.
pub async fn delete(State(app): State<App>, Path(id): Path<String>) -> ApiResult<()> {
    let dir = app.sessions.map.lock().remove(&id).ok_or_else(|| not_found(&id))?;
    let _ = crate::files::blocking(move || Ok(std::fs::remove_dir_all(&dir))).await;
    Ok(())
}
