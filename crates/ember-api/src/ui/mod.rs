//! The `/ui` dashboard (`ember serve --ui`, docs/observability.md): one static
//! page (`assets/`, embedded), a JSON snapshot pushed every second over
//! server-sent events (`/ui/events`, `snapshot.rs`), and a terminal into a
//! sandbox through the agent's PTY WebSocket (`/ui/sandboxes/{id}/pty...`,
//! forwarded as the API's proxy route forwards it).
//!
//! Auth: with an API key set, a browser (which cannot add a header to a page
//! load, an EventSource or a WebSocket) exchanges the key once at
//! `/ui/login` for a random session token in an `HttpOnly; SameSite=Strict`
//! cookie scoped to `Path=/ui`; the key itself never sits in the browser.
//! The header still works (scripts). docs/threat-model.md has the why.
mod snapshot;

use crate::error::ApiError;
use crate::Principal;
use crate::{ApiPath, ApiState};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{any, get, post};
use axum::Router;
use ember_types::execd::EXECD_PORT;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const COOKIE: &str = "ember_ui";
/// Sessions kept at once: a login past it drops them all (the oldest is not
/// tracked; logging in again is cheap).
const MAX_SESSIONS: usize = 1024;

/// `--ui`: where lab and chaos reports are, and the logged-in sessions
/// (each with the principal of the key it was opened with).
#[derive(Clone, Debug, Default)]
pub struct UiConfig {
    pub reports: Option<PathBuf>,
    sessions: Arc<Mutex<HashMap<String, Principal>>>,
}

impl UiConfig {
    pub fn new(reports: Option<PathBuf>) -> UiConfig {
        UiConfig { reports, sessions: Default::default() }
    }
}

/// The dashboard's routes; merged by `crate::router` when `--ui` is on.
pub fn routes() -> Router<ApiState> {
    Router::new()
        .route("/ui", get(page))
        .route("/ui/app.js", get(|| asset("text/javascript", include_str!("assets/app.js"))))
        .route("/ui/app.css", get(|| asset("text/css", include_str!("assets/app.css"))))
        .route("/ui/login", get(login_page).post(login))
        .route("/ui/events", get(events))
        .route("/ui/reports/{name}", get(snapshot::report))
        .route("/ui/sandboxes/{id}/boundary", get(boundary))
        .route("/ui/sandboxes/{id}/pty", post(pty))
        .route("/ui/sandboxes/{id}/pty/{*rest}", any(pty_rest))
}

async fn asset(kind: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// Who a dashboard request is, if it may see the dashboard: the key in its
/// header (the admin's, or a tenant's: it then sees that tenant's objects
/// alone), the admin when no key is configured, or the principal of the
/// live session its cookie names. A scoped token is no dashboard login.
/// `middleware::auth` puts it in the request for `tenancy::guard`.
pub(crate) fn principal(st: &ApiState, h: &HeaderMap) -> Option<Principal> {
    if let Ok(p) = crate::middleware::principal(st, h) {
        return (!matches!(p, Principal::Scoped(_))).then_some(p);
    }
    let ui = st.cfg.ui.as_ref()?;
    let token = cookie(h)?;
    let mut sessions = ui.sessions.lock().unwrap_or_else(|p| p.into_inner());
    let p = sessions.get(token).cloned()?;
    if !live(st, &p) {
        sessions.remove(token);
        return None;
    }
    Some(p)
}

/// Whether the key `p` logged in with still opens the dashboard: a session
/// ends with its key (revoked, or its tenant removed), not at its cookie's.
fn live(st: &ApiState, p: &Principal) -> bool {
    match p {
        Principal::Tenant { name, key } => st.tenants.holds_key(name, key),
        Principal::Admin { .. } | Principal::Scoped(_) => true,
    }
}

fn cookie(h: &HeaderMap) -> Option<&str> {
    h.get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| kv.trim().strip_prefix(COOKIE)?.strip_prefix('='))
}

/// The 401 of a dashboard call without a session; pages redirect instead.
fn refused() -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "MISSING_API_KEY", "log in at /ui/login (or send the API key)")
}

/// Against cross-site WebSockets and form posts (which `SameSite` alone
/// leaves to the browser): a state-changing call from a page must come from
/// this origin.
fn same_origin(h: &HeaderMap) -> Result<(), ApiError> {
    let (Some(origin), Some(host)) = (h.get(header::ORIGIN), h.get(header::HOST)) else { return Ok(()) };
    let origin = origin.to_str().unwrap_or("");
    let host = host.to_str().unwrap_or("");
    let bare = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")).unwrap_or("");
    match bare == host {
        true => Ok(()),
        false => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "GENERAL::CROSS_ORIGIN",
            format!("origin {origin:?} is not this server's"),
        )),
    }
}

async fn page(State(st): State<ApiState>, h: HeaderMap) -> Response {
    if principal(&st, &h).is_none() {
        return Redirect::to("/ui/login").into_response();
    }
    Html(include_str!("assets/index.html")).into_response()
}

async fn login_page() -> Html<&'static str> {
    Html(include_str!("assets/login.html"))
}

/// `key` of an `application/x-www-form-urlencoded` body (axum's `Form`
/// would build serde_urlencoded for this one field).
fn form_key(body: &str) -> String {
    let raw = body.split('&').find_map(|kv| kv.strip_prefix("key=")).unwrap_or("").replace('+', " ");
    percent_encoding::percent_decode_str(&raw).decode_utf8_lossy().into_owned()
}

/// The key once, for a session cookie; a wrong key is a 401 like the API's.
async fn login(State(st): State<ApiState>, h: HeaderMap, body: String) -> Result<Response, ApiError> {
    same_origin(&h)?;
    let mut given = HeaderMap::new();
    if let Ok(v) = form_key(&body).parse() {
        given.insert(crate::middleware::API_KEY_HEADER, v);
    }
    // The admin's key or a tenant's; the session is that principal's.
    let p = match crate::middleware::principal(&st, &given) {
        Err(refusal) => return Ok(*refusal),
        Ok(Principal::Scoped(_)) => return Err(refused()),
        Ok(p) => p,
    };
    let Some(ui) = &st.cfg.ui else { return Err(refused()) };
    let token = session_token()?;
    {
        let mut s = ui.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if s.len() >= MAX_SESSIONS {
            s.clear();
        }
        s.insert(token.clone(), p);
    }
    let cookie = format!("{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict");
    Ok(([(header::SET_COOKIE, cookie)], Redirect::to("/ui")).into_response())
}

/// 128 random bits, hex; no session rather than a guessable one.
fn session_token() -> Result<String, ApiError> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).map_err(|e| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "GENERAL::INTERNAL", format!("/dev/urandom: {e}"))
    })?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// A snapshot now and every second after, as `data:` JSON events.
async fn events(State(st): State<ApiState>, h: HeaderMap) -> Result<Response, ApiError> {
    let Some(p) = principal(&st, &h) else { return Err(refused()) };
    let stream = futures_util::stream::unfold((st, p, true), |(st, p, first)| async move {
        if !first {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        // The stream ends with the session's key: it was opened with it.
        if !live(&st, &p) {
            return None;
        }
        let snap = snapshot::take(&st, &p).await;
        let ev = Event::default().event("snapshot").json_data(snap).unwrap_or_else(|_| Event::default());
        Some((Ok::<_, std::convert::Infallible>(ev), (st, p, false)))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response())
}

async fn boundary(
    State(st): State<ApiState>,
    h: HeaderMap,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    if principal(&st, &h).is_none() {
        return Err(refused());
    }
    Ok(axum::Json(st.engine.boundary(&id).await?).into_response())
}

/// `POST /ui/sandboxes/{id}/pty`: the agent's `POST /pty` (a new session).
async fn pty(st: State<ApiState>, ApiPath(id): ApiPath<String>, req: Request) -> Result<Response, ApiError> {
    forward_pty(st, id, String::new(), req).await
}

/// `/ui/sandboxes/{id}/pty/{rest}`: the session's status and WebSocket.
async fn pty_rest(
    st: State<ApiState>,
    ApiPath((id, rest)): ApiPath<(String, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    forward_pty(st, id, format!("/{rest}"), req).await
}

async fn forward_pty(
    State(st): State<ApiState>,
    id: String,
    rest: String,
    mut req: Request,
) -> Result<Response, ApiError> {
    let Some(p) = principal(&st, req.headers()) else { return Err(refused()) };
    // The session's principal: the proxy closes its terminal with its key.
    req.extensions_mut().insert(p);
    same_origin(req.headers())?;
    // The proxy route's way to the agent (its cookie stripped there).
    crate::proxy::forward_path(st, id, EXECD_PORT, format!("pty{rest}"), req).await
}
