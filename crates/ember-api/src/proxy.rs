//! `/v1/sandboxes/{id}/proxy/{port}/...`: HTTP to a port inside the sandbox.
//!
//! Port 44772 is the agent itself (execd), reached over its host-side unix socket,
//! so exec and file traffic needs no network in the sandbox. The agent's replies
//! are untrusted: hyper parses them with its limits and the body is streamed
//! through, never buffered whole.
use crate::error::{chain, ApiError};
use crate::{ApiPath, ApiState};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use ember_types::execd::EXECD_PORT;
use hyper_util::rt::TokioIo;

const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    crate::middleware::API_KEY_HEADER,
    "authorization",
];

fn strip(h: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        h.remove(*name);
    }
}

pub async fn proxy_root(
    st: State<ApiState>,
    ApiPath((id, port)): ApiPath<(String, u16)>,
    req: Request,
) -> Result<Response, ApiError> {
    forward(st, id, port, String::new(), req).await
}

pub async fn proxy(
    st: State<ApiState>,
    ApiPath((id, port, rest)): ApiPath<(String, u16, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    forward(st, id, port, rest, req).await
}

async fn forward(
    State(st): State<ApiState>,
    id: String,
    port: u16,
    rest: String,
    req: Request,
) -> Result<Response, ApiError> {
    if port != EXECD_PORT {
        st.engine.get(&id)?;
        return Err(ApiError::not_supported(format!(
            "port {port}: only the agent's port {EXECD_PORT} is proxied so far"
        )));
    }
    if rest.starts_with("ember/") {
        // The agent's control routes (pool claim binding) are the daemon's alone.
        return Err(ApiError::new(StatusCode::NOT_FOUND, "GENERAL::NOT_FOUND", "no such route"));
    }
    let sock = st.engine.agent_socket(&id)?;
    let bad_gateway = |what: &str, e: &dyn std::error::Error| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "SANDBOX::AGENT_UNREACHABLE",
            format!("sandbox {id} agent {what}: {}", chain(e)),
        )
    };
    let stream = tokio::net::UnixStream::connect(&sock).await.map_err(|e| bad_gateway("connect", &e))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| bad_gateway("handshake", &e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let (mut parts, body) = req.into_parts();
    let path = match parts.uri.query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    parts.uri = path.parse().map_err(|_| ApiError::bad_request(format!("bad proxied path {path:?}")))?;
    strip(&mut parts.headers);
    parts.headers.insert(header::HOST, "agent".parse().expect("static header value"));
    let out = hyper::Request::from_parts(parts, body);
    let resp = sender.send_request(out).await.map_err(|e| bad_gateway("request", &e))?;
    let (mut rparts, rbody) = resp.into_parts();
    strip(&mut rparts.headers);
    Ok(Response::from_parts(rparts, Body::new(rbody)))
}
