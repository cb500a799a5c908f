//! `/proxy/{port}/...`: HTTP, and WebSocket or any other `Upgrade`, to
//! `127.0.0.1:{port}` inside the sandbox. The agent lives in the sandbox's own
//! network namespace (only `lo`), so this reaches servers the sandbox runs
//! without giving the sandbox any network: the daemon's
//! `/v1/sandboxes/{id}/proxy/{port}` route comes here over the agent socket.
use crate::error::{ApiError, ApiResult, ErrorCode};
use axum::body::Body;
use axum::extract::{Path, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use ember_types::proxy::strip_hop_by_hop;
use hyper_util::rt::TokioIo;

fn port_of(raw: &str) -> ApiResult<u16> {
    raw.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| ApiError::bad_request(format!("invalid port {raw:?}: expected 1..65535")))
}

/// `ANY /proxy/{port}`.
pub async fn proxy_root(Path(port): Path<String>, req: Request) -> ApiResult<Response> {
    forward(port_of(&port)?, String::new(), req).await
}

/// `ANY /proxy/{port}/{*rest}`.
pub async fn proxy(Path((port, rest)): Path<(String, String)>, req: Request) -> ApiResult<Response> {
    forward(port_of(&port)?, rest, req).await
}

async fn forward(port: u16, rest: String, req: Request) -> ApiResult<Response> {
    let bad_gateway = |what: &str, e: &dyn std::fmt::Display| {
        ApiError::new(ErrorCode::BadGateway, format!("127.0.0.1:{port} in the sandbox: {what}: {e}"))
    };
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| bad_gateway("connect", &e))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| bad_gateway("handshake", &e))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let (mut parts, body) = req.into_parts();
    let client_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let path = match parts.uri.query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    parts.uri = path.parse().map_err(|_| ApiError::bad_request(format!("bad proxied path {path:?}")))?;
    strip_hop_by_hop(&mut parts.headers, &[]);
    let host = HeaderValue::from_str(&format!("127.0.0.1:{port}")).expect("ASCII host");
    parts.headers.insert(header::HOST, host);
    let mut resp =
        sender.send_request(hyper::Request::from_parts(parts, body)).await.map_err(|e| bad_gateway("request", &e))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let server_upgrade = hyper::upgrade::on(&mut resp);
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::bad_request("the server switched protocols but the request was not an upgrade"));
        };
        tokio::spawn(async move {
            if let (Ok(a), Ok(b)) = (client_upgrade.await, server_upgrade.await) {
                let _ = tokio::io::copy_bidirectional(&mut TokioIo::new(a), &mut TokioIo::new(b)).await;
            }
        });
    }
    let (mut rparts, rbody) = resp.into_parts();
    strip_hop_by_hop(&mut rparts.headers, &[]);
    Ok(Response::from_parts(rparts, Body::new(rbody)))
}
