//! `/v1/sandboxes/{id}/proxy/{port}/...`: HTTP and WebSocket to any port inside
//! the sandbox, always over the agent's host-side unix socket, so the sandbox
//! needs no network: port 44772 is the agent itself (execd); any other port is
//! the agent's own `/proxy/{port}` route, which connects to `127.0.0.1:{port}`
//! in the sandbox's network namespace. Port 18080 (egress policy) is answered
//! by the daemon (`egress.rs`). The agent's replies
//! are untrusted: hyper parses them with its limits and the body is streamed
//! through, never buffered whole. In a cluster, a sandbox of another node
//! (`AgentRoute::Remote`) is reached through that node's own proxy route,
//! over TCP with the cluster's API key: the same streaming and the same
//! upgrade splice, one hop more.
//!
//! Two ways in, one forwarding path: the route above, on the API's own browser
//! origin, whose every answer carries [`PATH_ROUTE_CSP`]; and a sandbox
//! origin's host name (`origin.rs`, `--sandbox-domain`), whose whole request
//! is the port's and whose answer is the sandbox's own.
use crate::error::{chain, ApiError};
use crate::tenancy::Principal;
use crate::{ApiPath, ApiState};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use ember_engine::AgentRoute;
use ember_types::execd::{EGRESS_PORT, EXECD_PORT};
use ember_types::proxy::strip_hop_by_hop;
use hyper_util::rt::TokioIo;
use tokio_util::either::Either;

/// How long the proxy waits to connect to the node that owns a sandbox.
const NODE_CONNECT: std::time::Duration = std::time::Duration::from_secs(3);

/// Besides the hop-by-hop headers ([`strip_hop_by_hop`]), never passed on in
/// either direction: the daemon's own credentials and `host` (set per hop).
const NOT_FORWARDED: &[&str] =
    &["host", crate::middleware::API_KEY_HEADER, "authorization", crate::middleware::SECURE_ACCESS_HEADER];

/// The policy of every answer of the path route but an upgrade: the page runs
/// as an opaque origin, so its scripts cannot read the API origin's storage or
/// call the API (or another sandbox's path) as that origin with the user's
/// credentials. No `allow-same-origin`, which would undo exactly that.
pub const PATH_ROUTE_CSP: &str = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

/// Layered on the path routes (so rejections of their parameters carry it
/// too). A policy the sandbox sent is replaced, not kept beside ours: it was
/// written for an origin of the page's own, its `report-uri`/`report-to` would
/// have browsers post reports about the API's origin wherever the sandbox
/// names, and one policy we set is one we can read. A 101 carries no page.
/// No `Set-Cookie` passes, 101 included: every sandbox shares the API's host
/// for cookies, so one would be sent to every other sandbox's path.
pub async fn on_api_origin(mut resp: Response) -> Response {
    resp.headers_mut().remove(header::SET_COOKIE);
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let h = resp.headers_mut();
        h.remove(header::CONTENT_SECURITY_POLICY_REPORT_ONLY);
        h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(PATH_ROUTE_CSP));
    }
    resp
}

/// How the request reached the proxy, for the hop to an owning node.
enum Via {
    /// `/v1/sandboxes/{id}/proxy/{port}/...` on the API's origin.
    Path,
    /// A sandbox origin's name, the request's `Host` (kept for the owner,
    /// which answers the same name).
    Host(HeaderValue),
}

pub async fn proxy_root(
    st: State<ApiState>,
    ApiPath((id, port)): ApiPath<(String, u16)>,
    req: Request,
) -> Result<Response, ApiError> {
    forward(st, id, port, String::new(), req, Via::Path).await
}

pub async fn proxy(
    st: State<ApiState>,
    ApiPath((id, port, rest)): ApiPath<(String, u16, String)>,
    req: Request,
) -> Result<Response, ApiError> {
    forward(st, id, port, rest, req, Via::Path).await
}

/// A request to a sandbox origin (`origin::dispatch`): its whole path and
/// query go to the port. The path stays as sent (the path route's `rest` is
/// axum's decoded parameter), so the agent's private routes are looked for in
/// its decoded form too.
pub async fn forward_host(st: ApiState, id: String, port: u16, host: &str, req: Request) -> Response {
    // Every leading `/` goes, as in the check: `//ember/...` is no way around it.
    let rest = req.uri().path().trim_start_matches('/').to_string();
    if percent_encoding::percent_decode_str(&rest).decode_utf8_lossy().starts_with("ember/") {
        return not_found().into_response();
    }
    let host = match HeaderValue::from_str(host) {
        Ok(h) => h,
        Err(_) => return ApiError::bad_request(format!("bad Host {host:?}")).into_response(),
    };
    forward(State(st), id, port, rest, req, Via::Host(host)).await.into_response()
}

/// A request of the sandbox-router (`agent_sandbox.rs`): `rest` to `port`,
/// routed as the path route is (this node's agent, or the owner's).
pub(crate) async fn forward_path(
    st: ApiState,
    id: String,
    port: u16,
    rest: String,
    req: Request,
) -> Result<Response, ApiError> {
    forward(State(st), id, port, rest, req, Via::Path).await
}

fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "GENERAL::NOT_FOUND", "no such route")
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
    via: Via,
) -> Result<Response, ApiError> {
    if port == EGRESS_PORT {
        return crate::egress::handle(&st, &id, &rest, req).await;
    }
    if port == 0 {
        return Err(ApiError::bad_request("port 0 is not a port"));
    }
    if rest.starts_with("ember/") {
        // The agent's control routes (pool claim binding) are the daemon's alone.
        return Err(not_found());
    }
    let route = st.engine.agent_route(&id).await?;
    // Timed where the agent is local: a forwarded one is timed on its owner.
    let timer = (port == EXECD_PORT && rest == "command" && req.method() == axum::http::Method::POST)
        .then_some(())
        .filter(|_| matches!(route, AgentRoute::Local { .. }))
        .map(|_| ExecTimer { st: st.clone(), t0: std::time::Instant::now() });
    let (mut parts, body) = req.into_parts();
    let query = parts.uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let on_api_origin = matches!(via, Via::Path);
    let Target { stream, path, host, key, owner } = connect(route, &id, port, rest, &query, via).await?;
    // No answer from an owning node is its failure or its link's (503); an
    // answer that came and cannot be read, or a misuse of ours, is not.
    let hop_failed = |what: &str, e: &hyper::Error| match &owner {
        Some(o) if !e.is_parse() && !e.is_user() => o.unavailable(&id, what, chain(e)),
        _ => bad_gateway(&id, what, e),
    };
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| hop_failed("handshake", &e))?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let client_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    let caller = parts.extensions.get::<Principal>().cloned();
    parts.uri = path.parse().map_err(|_| ApiError::bad_request(format!("bad proxied path {path:?}")))?;
    strip_hop_by_hop(&mut parts.headers, NOT_FORWARDED);
    if on_api_origin {
        // The API host's cookies are every sandbox's path's (and the API
        // user's): none of them is this sandbox's to read.
        parts.headers.remove(header::COOKIE);
    }
    parts.headers.insert(header::HOST, host);
    if let Some(key) = key.and_then(|k| HeaderValue::from_str(&k).ok()) {
        parts.headers.insert(crate::middleware::API_KEY_HEADER, key);
    }
    let out = hyper::Request::from_parts(parts, body);
    // The agent's answer (its headers): for an exec, the command started.
    let span = match timer {
        Some(_) => tracing::info_span!("exec", sandbox = %id),
        None => tracing::info_span!("agent_proxy", sandbox = %id, port),
    };
    let sent = tracing::Instrument::instrument(sender.send_request(out), span).await;
    let mut resp = sent.map_err(|e| hop_failed("request", &e))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let agent_upgrade = hyper::upgrade::on(&mut resp);
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::bad_request("the sandbox switched protocols for a request that was no upgrade"));
        };
        let st = st.clone();
        tokio::spawn(async move {
            if let (Ok(a), Ok(b)) = (client_upgrade.await, agent_upgrade.await) {
                let (mut a, mut b) = (TokioIo::new(a), TokioIo::new(b));
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut a, &mut b) => {}
                    // Both sides dropped: the terminal closes with its key.
                    () = key_revoked(&st, caller) => {}
                }
            }
        });
    }
    let (mut rparts, rbody) = resp.into_parts();
    strip_hop_by_hop(&mut rparts.headers, NOT_FORWARDED);
    let body = match timer {
        // The timer goes with the streamed body: dropped at its end (or the
        // client's hang-up), it observes the command's whole time.
        Some(timer) => Body::new(http_body_util::BodyExt::map_frame(rbody, move |f| {
            let _held = &timer;
            f
        })),
        None => Body::new(rbody),
    };
    Ok(Response::from_parts(rparts, body))
}

/// Ends once the tenant key that opened a spliced connection (a terminal's
/// WebSocket, say) is revoked or its tenant removed, looking each second; a
/// request checks its key once, a connection that outlives it would keep
/// the key's access. Never, for the admin and scoped tokens (a token's
/// sandbox ending closes the agent's side).
async fn key_revoked(st: &ApiState, caller: Option<Principal>) {
    let Some(Principal::Tenant { name, key }) = caller else { return std::future::pending().await };
    while st.tenants.holds_key(&name, &key) {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Observes `ember_exec_seconds` when dropped.
struct ExecTimer {
    st: ApiState,
    t0: std::time::Instant,
}

impl Drop for ExecTimer {
    fn drop(&mut self) {
        self.st.engine.observe_exec(self.t0.elapsed());
    }
}

fn bad_gateway(id: &str, what: &str, e: &dyn std::error::Error) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "SANDBOX::AGENT_UNREACHABLE",
        format!("sandbox {id} agent {what}: {}", chain(e)),
    )
}

/// Where a proxied request goes, connected: the agent on this host, or the
/// owning node's own proxy route (which then takes the agent branch there),
/// with the path, `Host` and API key for that hop.
struct Target {
    stream: Either<tokio::net::UnixStream, tokio::net::TcpStream>,
    path: String,
    host: HeaderValue,
    key: Option<String>,
    /// The owning node, when the hop is to another node.
    owner: Option<Owner>,
}

/// The node a proxied request is sent on to.
struct Owner {
    node: String,
    authority: axum::http::uri::Authority,
}

impl Owner {
    /// The owning node failed the hop before its answer began: it does not
    /// accept the connection, or it accepted and then reset it (a node
    /// killed while its listener still queued connections, a cut link). It
    /// is down or cut off, its death not noticed yet: a 503 the retry policy
    /// rides out, as for a forwarded call, not a 502 for the agent (no
    /// client retries one; the drill counted them as user-visible errors).
    /// A load balancer answers a reset before the headers the same way.
    fn unavailable(&self, id: &str, what: &str, why: String) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "CLUSTER::NODE_UNAVAILABLE",
            format!("sandbox {id}: node {} ({}) {what}: {why}", self.node, self.authority),
        )
    }
}

async fn connect(
    route: AgentRoute,
    id: &str,
    port: u16,
    rest: String,
    query: &str,
    via: Via,
) -> Result<Target, ApiError> {
    match route {
        AgentRoute::Local { socket } => {
            let s = ember_engine::connect_agent(&socket).await.map_err(|e| bad_gateway(id, "connect", &e))?;
            let rest = match (port, rest.is_empty()) {
                (EXECD_PORT, _) => rest,
                (_, true) => format!("proxy/{port}"),
                (_, false) => format!("proxy/{port}/{rest}"),
            };
            let host = HeaderValue::from_static("agent");
            Ok(Target { stream: Either::Left(s), path: format!("/{rest}{query}"), host, key: None, owner: None })
        }
        AgentRoute::Remote { node, base_url, api_key } => {
            let authority = remote_authority(&base_url).ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "SANDBOX::AGENT_UNREACHABLE",
                    format!("sandbox {id}: node {node} advertises {base_url:?}, not http://host:port"),
                )
            })?;
            // The owning node does not answer: it is down or cut off (its
            // death not noticed yet), which a retry rides out as the
            // forwarded calls do (503), not the agent's fault (502).
            // A bounded connect: a node whose link is cut drops the SYN, and
            // the kernel's own retries last two minutes.
            let connect = tokio::time::timeout(NODE_CONNECT, tokio::net::TcpStream::connect(authority.as_str()));
            let owner = Owner { node, authority: authority.clone() };
            let s = connect
                .await
                .map_err(|_| owner.unavailable(id, "connect", format!("no answer within {NODE_CONNECT:?}")))?
                .map_err(|e| owner.unavailable(id, "connect", chain(&e)))?;
            // The same way in on the owner: its path route (which sets the
            // same policy), or the same sandbox name (the nodes of a cluster
            // share `--sandbox-domain`).
            let (path, host) = match via {
                Via::Path => {
                    let tail = if rest.is_empty() { String::new() } else { format!("/{rest}") };
                    let host = HeaderValue::from_str(authority.as_str())
                        .map_err(|_| ApiError::bad_request(format!("bad node address {authority}")))?;
                    (format!("/v1/sandboxes/{id}/proxy/{port}{tail}{query}"), host)
                }
                Via::Host(host) => (format!("/{rest}{query}"), host),
            };
            Ok(Target { stream: Either::Right(s), path, host, key: api_key, owner: Some(owner) })
        }
    }
}

/// `host:port` of a node's advertised `http://host:port[/]` URL.
fn remote_authority(base_url: &str) -> Option<axum::http::uri::Authority> {
    let uri: axum::http::Uri = base_url.parse().ok()?;
    if uri.scheme_str() != Some("http") || !matches!(uri.path(), "" | "/") {
        return None;
    }
    let a = uri.authority()?.clone();
    a.port_u16().map(|_| a)
}
