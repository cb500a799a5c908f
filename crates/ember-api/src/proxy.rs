//! `/v1/sandboxes/{id}/proxy/{port}/...`: HTTP and WebSocket to any port inside
//! the sandbox, always over the agent's host-side unix socket, so the sandbox
//! needs no network: port 44772 is the agent itself (execd); any other port is
//! the agent's own `/proxy/{port}` route, which connects to `127.0.0.1:{port}`
//! in the sandbox's network namespace. Port 18080 (egress policy) is answered
//! by the daemon (`egress.rs`). The agent's replies
//! are untrusted: hyper parses them with its limits and the body is streamed
//! through, never buffered whole.
use crate::error::{chain, ApiError};
use crate::{ApiPath, ApiState};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use ember_engine::AgentRoute;
use ember_types::execd::{EGRESS_PORT, EXECD_PORT};
use ember_types::proxy::strip_hop_by_hop;
use hyper_util::rt::TokioIo;

/// Besides the hop-by-hop headers ([`strip_hop_by_hop`]), never passed on in
/// either direction: the daemon's own credentials and `host` (set per hop).
const NOT_FORWARDED: &[&str] = &["host", crate::middleware::API_KEY_HEADER, "authorization"];

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

/// Port 44772 is the agent's own API; 18080 the egress port, answered here;
/// any other port goes to the agent's `/proxy/{port}/...`, which connects to
/// `127.0.0.1:{port}` inside the sandbox.
async fn forward(
    State(st): State<ApiState>,
    id: String,
    port: u16,
    rest: String,
    req: Request,
) -> Result<Response, ApiError> {
    if port == EGRESS_PORT {
        return crate::egress::handle(&st, &id, &rest, req).await;
    }
    if port == 0 {
        return Err(ApiError::bad_request("port 0 is not a port"));
    }
    if rest.starts_with("ember/") {
        // The agent's control routes (pool claim binding) are the daemon's alone.
        return Err(ApiError::new(StatusCode::NOT_FOUND, "GENERAL::NOT_FOUND", "no such route"));
    }
    let route = st.engine.agent_route(&id).await?;
    let bad_gateway = |what: &str, e: &dyn std::error::Error| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "SANDBOX::AGENT_UNREACHABLE",
            format!("sandbox {id} agent {what}: {}", chain(e)),
        )
    };
    let stream = match route {
        AgentRoute::Local { socket } => {
            ember_engine::connect_agent(&socket).await.map_err(|e| bad_gateway("connect", &e))?
        }
    };
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| bad_gateway("handshake", &e))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let (mut parts, body) = req.into_parts();
    let client_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let rest = match (port, rest.is_empty()) {
        (EXECD_PORT, _) => rest,
        (_, true) => format!("proxy/{port}"),
        (_, false) => format!("proxy/{port}/{rest}"),
    };
    let path = match parts.uri.query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    parts.uri = path.parse().map_err(|_| ApiError::bad_request(format!("bad proxied path {path:?}")))?;
    strip_hop_by_hop(&mut parts.headers, NOT_FORWARDED);
    parts.headers.insert(header::HOST, HeaderValue::from_static("agent"));
    let out = hyper::Request::from_parts(parts, body);
    let mut resp = sender.send_request(out).await.map_err(|e| bad_gateway("request", &e))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let agent_upgrade = hyper::upgrade::on(&mut resp);
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::bad_request("the sandbox switched protocols for a request that was no upgrade"));
        };
        tokio::spawn(async move {
            if let (Ok(a), Ok(b)) = (client_upgrade.await, agent_upgrade.await) {
                let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
            }
        });
    }
    let (mut rparts, rbody) = resp.into_parts();
    strip_hop_by_hop(&mut rparts.headers, NOT_FORWARDED);
    Ok(Response::from_parts(rparts, Body::new(rbody)))
}
