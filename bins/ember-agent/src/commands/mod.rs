//! `/command` routes (protocol §3.3): run (streamed), interrupt, status, logs.
//!
//! Layout: `spawn` builds and starts the process, `run` watches it and
//! writes the events, `registry` keeps status and logs, `lines` splits and
//! bounds output.
pub mod lines;
pub mod registry;
pub mod run;
pub mod spawn;

use crate::error::{ApiError, ApiResult, ErrorCode, JsonBody};
use crate::query::Query;
use crate::server::App;
use crate::stream::{error_event, event, event_stream, fixed_stream, frame};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_sys::process::SIGKILL;
use ember_types::execd::RunCommandRequest;
use registry::Lookup;
use run::{Run, DRAIN};
use spawn::Spawned;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Frames buffered between a command and a slow client before the command's
/// output pipe is left to fill (backpressure).
const STREAM_BUFFER: usize = 64;

/// Starts a command and registers it, under `name` if given. `Err` carries
/// the id and the message of a start failure, already recorded as finished.
pub fn start(app: &App, req: &RunCommandRequest, name: Option<&str>) -> Result<(String, Spawned), (String, String)> {
    let content = spawn::content(req);
    let spawned = spawn::plan(&app.config, req).and_then(|plan| spawn::spawn(&app.reaper, &plan, false));
    match spawned {
        Ok(sp) => Ok((app.registry.create(name, content, Some(sp.pid)), sp)),
        Err(msg) => {
            let id = app.registry.create(name, content, None);
            // 127 is the shell's "could not run": the status must say something.
            app.registry.finish(&id, 127, Some(msg.clone()));
            Err((id, msg))
        }
    }
}

/// `POST /command`.
pub async fn run_command(State(app): State<App>, JsonBody(req): JsonBody<RunCommandRequest>) -> Response {
    stream(app, req).await
}

/// Runs a command and answers with its event stream (also used by sessions).
pub async fn stream(app: App, req: RunCommandRequest) -> Response {
    if let Err(e) = spawn::validate(&req) {
        return e.into_response();
    }
    let started = Instant::now();
    let (id, spawned) = match start(&app, &req, None) {
        Ok(ok) => ok,
        Err((id, msg)) => {
            let err = error_event("CommandExecError", msg.clone(), vec![msg]);
            return fixed_stream(vec![frame(&event("init", Some(id))), frame(&err)]);
        }
    };
    let init = frame(&event("init", Some(id.clone())));
    let mut run = Run {
        registry: app.registry.clone(),
        reaper: app.reaper.clone(),
        id,
        started,
        timeout: req.timeout.filter(|t| *t > 0).map(Duration::from_millis),
        drain: Some(DRAIN),
        grace: app.config.grace,
    };
    if req.background {
        run.drain = None;
        tokio::spawn(run.watch(spawned, None));
        let mut done = event("execution_complete", None);
        done.execution_time = Some(started.elapsed().as_millis() as i64);
        return fixed_stream(vec![init, frame(&done)]);
    }
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    // Cannot fail: the channel is empty and rx is alive.
    let _ = tx.try_send(init);
    tokio::spawn(run.watch(spawned, Some(tx)));
    event_stream(rx)
}

/// `DELETE /command?id=`: SIGKILL the command's process group.
pub async fn interrupt(State(app): State<App>, RawQuery(q): RawQuery) -> ApiResult<()> {
    let q = Query::parse(q.as_deref());
    let id = q.get("id").filter(|s| !s.is_empty()).ok_or_else(|| ApiError::missing_query("id"))?;
    match app.registry.lookup(id) {
        Lookup::Unknown => Err(unknown(id)),
        Lookup::Running(pid) => {
            app.reaper.signal_group(pid, SIGKILL);
            Ok(())
        }
        Lookup::Finished => Ok(()),
    }
}

/// `GET /command/status/{id}`.
pub async fn status(State(app): State<App>, Path(id): Path<String>) -> Response {
    match app.registry.status(&id) {
        Some(s) => Json(s).into_response(),
        None => unknown(&id).into_response(),
    }
}

/// `GET /command/{id}/logs?cursor=n`: the combined output after line `n` as
/// text, and the next cursor in `EXECD-COMMANDS-TAIL-CURSOR`.
pub async fn logs(State(app): State<App>, Path(id): Path<String>, RawQuery(q): RawQuery) -> Response {
    let q = Query::parse(q.as_deref());
    let cursor = match q.get("cursor").filter(|c| !c.is_empty()).map(str::parse::<u64>).transpose() {
        Ok(c) => c,
        Err(_) => return ApiError::bad_request("cursor must be a non-negative integer").into_response(),
    };
    let Some((text, next)) = app.registry.logs(&id, cursor) else {
        return unknown(&id).into_response();
    };
    let mut resp = text.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert("EXECD-COMMANDS-TAIL-CURSOR", HeaderValue::from(next));
    resp
}

fn unknown(id: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("command not found: {id}"))
}
