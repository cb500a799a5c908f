//! kubernetes-sigs/agent-sandbox's sandbox-router on ember's API: a request
//! carrying `X-Sandbox-ID` (the Sandbox resource's name), `X-Sandbox-Namespace`
//! and `X-Sandbox-Port` goes to that sandbox, so its clients
//! (`k8s-agent-sandbox`'s `SandboxDirectConnectionConfig(api_url=...)`) work
//! against `ember serve` unchanged. The sandbox is found by the metadata the
//! operator wrote when it answered the claim (`ember_types::agent_sandbox`),
//! never through the Kubernetes API. On the runtime's port (8888) the router
//! answers the runtime's `POST /execute` and its file routes (`files.rs`)
//! itself through ember's agent, since an ember sandbox runs no runtime
//! server; any other port is proxied as
//! `/v1/sandboxes/{id}/proxy/{port}` is. The key rule is the proxy route's:
//! the admin key, the owning tenant's key, or the sandbox's scoped token.
mod files;

use crate::error::ApiError;
use crate::middleware::principal;
use crate::ApiState;
use crate::Principal;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ember_engine::ListFilter;
use ember_types::agent_sandbox::{
    ExecuteRequest, ExecuteResponse, ID_HEADER, NAMESPACE_HEADER, NAMESPACE_KEY, PORT_HEADER, RUNTIME_PORT, SANDBOX_KEY,
};
use ember_types::execd::{FrameDecoder, RunCommandRequest, EXECD_PORT};
use ember_types::SandboxState;
use http_body_util::BodyExt;

/// `/execute`'s body is a command line: more is no command.
const MAX_REQUEST: usize = 1 << 20;
/// Each of stdout and stderr kept in the answer; the rest is dropped (the
/// command still runs to its end).
pub const MAX_OUTPUT: usize = 16 << 20;

/// Runs before the API's routes: a request with `X-Sandbox-ID` is the
/// router's whole, whatever its path. Any other request goes on.
pub async fn dispatch(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    if !req.headers().contains_key(ID_HEADER) {
        return next.run(req).await;
    }
    let p = match principal(&st, req.headers()) {
        Ok(p) => p,
        Err(refused) => return crate::tenancy::unauthorized(&st, req, *refused).await,
    };
    route(st, p, req).await.unwrap_or_else(IntoResponse::into_response)
}

fn text<'a>(h: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    match h.get(name) {
        None => Ok(None),
        Some(v) => v.to_str().map(Some).map_err(|_| ApiError::bad_request(format!("{name} is not text"))),
    }
}

/// The router's target: the Sandbox resource's namespace and name, and the port.
fn target(h: &HeaderMap) -> Result<(String, String, u16), ApiError> {
    let name = text(h, ID_HEADER)?.unwrap_or_default().to_string();
    if name.is_empty() {
        return Err(ApiError::bad_request(format!("{ID_HEADER} is empty")));
    }
    let ns = text(h, NAMESPACE_HEADER)?.filter(|n| !n.is_empty()).unwrap_or("default").to_string();
    let port = match text(h, PORT_HEADER)? {
        None => RUNTIME_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| ApiError::bad_request(format!("{PORT_HEADER} {p:?} is not a port")))?,
    };
    Ok((ns, name, port))
}

/// The caller's key rule is the proxy route's (`tenancy::outside_call`): a
/// tenant reaches its own sandboxes, a token its sandbox within its scope
/// (`/execute` is an exec).
async fn route(st: ApiState, p: Principal, req: Request) -> Result<Response, ApiError> {
    let (ns, name, port) = target(req.headers())?;
    let (id, workdir) = resolve(&st, &p, &ns, &name).await?;
    if port != RUNTIME_PORT {
        let rest = req.uri().path().trim_start_matches('/').to_string();
        let call = crate::proxy::forward_path;
        let (s, i, r) = (st.clone(), id.clone(), rest.clone());
        let forward =
            move |req| async move { call(s, i, port, r, req).await.unwrap_or_else(IntoResponse::into_response) };
        return Ok(crate::tenancy::outside_call(&st, &p, (&id, port, &rest), req, forward).await);
    }
    match (req.method(), req.uri().path()) {
        (&Method::POST, "/execute") => {
            let (s, i) = (st.clone(), id.clone());
            let forward = move |req| async move { execute(s, i, req).await.into_response() };
            Ok(crate::tenancy::outside_call(&st, &p, (&id, EXECD_PORT, "command"), req, forward).await)
        }
        (m, path) => match files::parse(m, path) {
            Some(route) => {
                let route = route?;
                let (s, i, as_agent) = (st.clone(), id.clone(), route.agent_path());
                let forward = move |req| async move {
                    files::serve(s, i, route, workdir, req).await.unwrap_or_else(IntoResponse::into_response)
                };
                Ok(crate::tenancy::outside_call(&st, &p, (&id, EXECD_PORT, as_agent), req, forward).await)
            }
            None => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "GENERAL::NOT_FOUND",
                format!(
                    "{m} {path}: ember's router answers POST /execute, POST /upload, GET /download/, /list/ and \
                     /exists/ on port {RUNTIME_PORT}"
                ),
            )),
        },
    }
}

/// The running ember sandbox backing Sandbox `ns/name`, among those `p`
/// sees, and its commands' working directory when its template sets one.
async fn resolve(st: &ApiState, p: &Principal, ns: &str, name: &str) -> Result<(String, Option<String>), ApiError> {
    let f = ListFilter {
        states: Vec::new(),
        metadata: vec![(NAMESPACE_KEY.into(), ns.into()), (SANDBOX_KEY.into(), name.into())],
        ..Default::default()
    };
    let mut found = st.engine.list(&f).await?;
    // Another tenant's Sandbox is not found, whatever its state.
    found.retain(|s| crate::tenancy::sees_sandbox(st, p, s.id.as_str()));
    let not_found = || ApiError::new(StatusCode::NOT_FOUND, "SANDBOX::NOT_FOUND", format!("no Sandbox {ns}/{name}"));
    let first = found.first().ok_or_else(not_found)?;
    match found.iter().find(|s| s.state == SandboxState::Running) {
        Some(s) => Ok((s.id.to_string(), s.spec.workdir.clone())),
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "SANDBOX::NOT_RUNNING",
            format!("Sandbox {ns}/{name} (ember sandbox {}) is {:?}", first.id, first.state),
        )),
    }
}

/// `POST /execute {command, timeout_seconds}` → `{stdout, stderr, exit_code}`:
/// the command runs through the agent's `/command` (a shell line, as the
/// runtime runs it), its streamed output collected up to [`MAX_OUTPUT`] each.
async fn execute(st: ApiState, id: String, req: Request) -> Result<Response, ApiError> {
    let body = axum::body::to_bytes(req.into_body(), MAX_REQUEST)
        .await
        .map_err(|e| ApiError::bad_request(format!("/execute body (at most {MAX_REQUEST} bytes): {e}")))?;
    let exec: ExecuteRequest =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("/execute body: {e}")))?;
    let timeout = exec.timeout_seconds.filter(|t| t.is_finite() && *t > 0.0).map(|t| (t * 1000.0).ceil() as u64);
    let run = RunCommandRequest { command: Some(exec.command), timeout, ..Default::default() };
    let json = serde_json::to_vec(&run).map_err(|e| internal(&e))?;
    let inner = Request::builder()
        .method(Method::POST)
        .uri("/command")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json))
        .map_err(|e| internal(&e))?;
    let resp = crate::proxy::forward_path(st, id.clone(), EXECD_PORT, "command".into(), inner).await?;
    if !resp.status().is_success() {
        return Ok(resp);
    }
    let out = collect(&id, resp.into_body()).await?;
    Ok(axum::Json(out).into_response())
}

fn internal(e: &dyn std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "GENERAL::INTERNAL", format!("command request: {e}"))
}

/// The command's events, read as they stream, into one answer.
async fn collect(id: &str, mut body: Body) -> Result<ExecuteResponse, ApiError> {
    let broken = |e: &dyn std::fmt::Display| {
        ApiError::new(StatusCode::BAD_GATEWAY, "SANDBOX::AGENT_UNREACHABLE", format!("sandbox {id} command: {e}"))
    };
    let mut dec = FrameDecoder::default();
    let mut out = ExecuteResponse { exit_code: -1, ..Default::default() };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| broken(&e))?;
        let Ok(data) = frame.into_data() else { continue };
        dec.push(&data);
        while let Some(ev) = dec.next_event() {
            let ev = ev.map_err(|e| broken(&e))?;
            match ev.kind.as_str() {
                "stdout" => append(&mut out.stdout, ev.text.as_deref()),
                "stderr" => append(&mut out.stderr, ev.text.as_deref()),
                "execution_complete" => out.exit_code = 0,
                "error" => match ev.exit_code() {
                    Some(code) => out.exit_code = code,
                    // It could not start: the shell's "not found" status, the reason on stderr.
                    None => {
                        out.exit_code = 127;
                        append(&mut out.stderr, ev.error.as_ref().map(|e| e.evalue.as_str()));
                    }
                },
                _ => {}
            }
        }
    }
    Ok(out)
}

/// The agent streams output line by line, without the newline.
fn append(to: &mut String, text: Option<&str>) {
    let Some(t) = text else { return };
    if to.len() + t.len() < MAX_OUTPUT {
        to.push_str(t);
        to.push('\n');
    }
}
