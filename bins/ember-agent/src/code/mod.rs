//! The code interpreter (protocol §3.5): `/code/context`, `/code/contexts`,
//! `/code`. Each context is a persistent Python process (`context.rs` runs
//! `driver.py` in it), so state survives between cells; no Jupyter is needed.
//! Only `python` is supported.
//!
//! `opensandbox-code-interpreter` checks readiness by opening a TCP connection
//! to `127.0.0.1:${JUPYTER_PORT:-44771}` inside the sandbox; [`readiness_port`]
//! answers that (it accepts and closes connections, nothing more).
mod context;

use crate::error::{ApiError, ApiResult, ErrorCode, JsonBody};
use crate::query::Query;
use crate::server::App;
use crate::stream::{event, event_stream, frame};
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use context::Context;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use tokio::sync::mpsc;

pub const LANGUAGES: &[&str] = &["python"];

#[derive(Default)]
pub struct Contexts {
    /// A std Mutex: map operations only, never held across an await.
    map: Mutex<HashMap<String, Arc<Context>>>,
    /// The context `POST /code` uses when the request names none, per language.
    defaults: Mutex<HashMap<String, String>>,
    /// Serialises the creation of default contexts.
    creating: tokio::sync::Mutex<()>,
    seq: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CodeContext {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default = "python")]
    pub language: String,
}

fn python() -> String {
    "python".into()
}

#[derive(Debug, Deserialize)]
pub struct RunCodeRequest {
    pub code: String,
    #[serde(default)]
    pub context: Option<CodeContext>,
}

impl Contexts {
    fn get(&self, id: &str) -> ApiResult<Arc<Context>> {
        let map = self.map.lock();
        map.get(id).cloned().ok_or_else(|| ApiError::new(ErrorCode::ContextNotFound, format!("context {id} not found")))
    }

    fn remove(&self, app: &App, id: &str) -> Option<Arc<Context>> {
        let ctx = self.map.lock().remove(id)?;
        self.defaults.lock().retain(|_, v| v != id);
        ctx.kill(app);
        Some(ctx)
    }

    fn list(&self, language: Option<&str>) -> Vec<Arc<Context>> {
        let map = self.map.lock();
        let mut v: Vec<_> = map.values().filter(|c| language.is_none_or(|l| c.language == l)).cloned().collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }
}

fn check_language(language: &str) -> ApiResult<()> {
    if LANGUAGES.contains(&language) {
        return Ok(());
    }
    Err(ApiError::bad_request(format!("language {language:?} is not supported; supported: {}", LANGUAGES.join(", "))))
}

fn describe(c: &Context) -> CodeContext {
    CodeContext { id: Some(c.id.clone()), language: c.language.clone() }
}

async fn create(app: &App, language: &str) -> ApiResult<Arc<Context>> {
    check_language(language)?;
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(app.contexts.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let id = format!("ctx-{:016x}", h.finish());
    let ctx = Arc::new(Context::start(app, id.clone(), language.to_string()).await?);
    app.contexts.map.lock().insert(id, ctx.clone());
    Ok(ctx)
}

/// `POST /code/context {language?}` → `{id, language}`.
pub async fn create_context(State(app): State<App>, body: axum::body::Bytes) -> ApiResult<Json<CodeContext>> {
    let req: CodeContext =
        if body.is_empty() { CodeContext { id: None, language: python() } } else { crate::error::parse_json(&body)? };
    let ctx = create(&app, &req.language).await?;
    Ok(Json(describe(&ctx)))
}

/// `GET /code/contexts?language=`.
pub async fn list_contexts(State(app): State<App>, RawQuery(q): RawQuery) -> Json<Vec<CodeContext>> {
    let q = Query::parse(q.as_deref());
    Json(app.contexts.list(q.get("language").filter(|l| !l.is_empty())).iter().map(|c| describe(c)).collect())
}

/// `GET /code/contexts/{id}`.
pub async fn get_context(State(app): State<App>, Path(id): Path<String>) -> ApiResult<Json<CodeContext>> {
    let ctx = app.contexts.get(&id)?;
    Ok(Json(describe(&ctx)))
}

/// `DELETE /code/contexts/{id}`: stops the interpreter.
pub async fn delete_context(State(app): State<App>, Path(id): Path<String>) -> ApiResult<()> {
    app.contexts
        .remove(&app, &id)
        .map(|_| ())
        .ok_or_else(|| ApiError::new(ErrorCode::ContextNotFound, format!("context {id} not found")))
}

/// `DELETE /code/contexts?language=`: stops every context of the language.
pub async fn delete_contexts(State(app): State<App>, RawQuery(q): RawQuery) -> ApiResult<()> {
    let q = Query::parse(q.as_deref());
    let language = q.get("language").filter(|l| !l.is_empty()).ok_or_else(|| ApiError::missing_query("language"))?;
    for c in app.contexts.list(Some(language)) {
        app.contexts.remove(&app, &c.id);
    }
    Ok(())
}

/// `DELETE /code?id=`: interrupts the cell running in the context (the
/// execution id of a cell is its context's id).
pub async fn interrupt(State(app): State<App>, RawQuery(q): RawQuery) -> ApiResult<()> {
    let q = Query::parse(q.as_deref());
    let id = q.get("id").filter(|s| !s.is_empty()).ok_or_else(|| ApiError::missing_query("id"))?;
    app.contexts.get(id)?.interrupt(&app);
    Ok(())
}

/// `POST /code {code, context?}` → stream: `init` (text = the context id),
/// then the cell's events.
pub async fn run_code(State(app): State<App>, JsonBody(req): JsonBody<RunCodeRequest>) -> Response {
    match resolve(&app, req.context).await {
        Ok(ctx) => {
            let (tx, rx) = mpsc::channel(64);
            // Cannot fail: the channel is empty and rx is alive.
            let _ = tx.try_send(frame(&event("init", Some(ctx.id.clone()))));
            tokio::spawn(async move { ctx.execute(&app, req.code, tx).await });
            event_stream(rx)
        }
        Err(e) => e.into_response(),
    }
}

/// The request's context, or the language's default one (created on first use).
async fn resolve(app: &App, context: Option<CodeContext>) -> ApiResult<Arc<Context>> {
    let c = context.unwrap_or(CodeContext { id: None, language: python() });
    if let Some(id) = c.id.filter(|i| !i.is_empty()) {
        return app.contexts.get(&id);
    }
    check_language(&c.language)?;
    let _one = app.contexts.creating.lock().await;
    let known = app.contexts.defaults.lock().get(&c.language).cloned();
    if let Some(ctx) = known.and_then(|id| app.contexts.get(&id).ok()) {
        return Ok(ctx);
    }
    let ctx = create(app, &c.language).await?;
    app.contexts.defaults.lock().insert(c.language, ctx.id.clone());
    Ok(ctx)
}

/// Accepts and closes connections on `127.0.0.1:${JUPYTER_PORT:-44771}`, the
/// port code-interpreter clients probe for readiness.
pub async fn readiness_port(port: u16) {
    loop {
        // Closed while the agent is quiesced for a checkpoint: gVisor cannot
        // save a listening TCP endpoint.
        let _open = crate::quiesce::listener_guard().await;
        let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("ember-agent: code interpreter readiness port {port}: {e}");
                return;
            }
        };
        let accept = async {
            loop {
                if let Ok((s, _)) = listener.accept().await {
                    drop(s);
                }
            }
        };
        tokio::select! {
            _ = accept => {}
            _ = crate::quiesce::quiesce_requested() => {}
        }
        drop(listener);
        drop(_open);
        crate::quiesce::quiesce_over().await;
    }
}
