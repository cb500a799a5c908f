//! Cross-cutting request handling: `X-Request-ID` echo, the `Host` check and
//! API-key auth.
use crate::error::ApiError;
use crate::tenancy::Principal;
use crate::ApiState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ember_engine::tenants::TOKEN_PREFIX;

pub const API_KEY_HEADER: &str = "open-sandbox-api-key";
/// Where OpenSandbox's SDKs send a `secureAccess` sandbox's token (the
/// endpoint answer's headers): a scoped token here (`tokens.rs`).
pub const SECURE_ACCESS_HEADER: &str = "opensandbox-secure-access";

/// Echoes the client's `X-Request-ID`, or generates one, on every response.
pub async fn request_id(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_str(&random_hex()).unwrap_or(HeaderValue::from_static("0")));
    // The audit log (`tenancy.rs`) names the request by it too.
    req.headers_mut().insert("x-request-id", id.clone());
    // The request's span: every log line of its handling carries the id.
    let span = tracing::info_span!(
        "request",
        request_id = %String::from_utf8_lossy(id.as_bytes()),
        method = %req.method(),
        path = %req.uri().path(),
        status = tracing::field::Empty,
    );
    let mut resp = tracing::Instrument::instrument(next.run(req), span.clone()).await;
    span.record("status", resp.status().as_u16());
    resp.headers_mut().insert("x-request-id", id);
    resp
}

/// Runs a call that may change something (any method but GET, HEAD and
/// OPTIONS) to its end whoever waits for it, in a task of its own: hyper
/// drops a handler whose client disconnects, and a call dropped between two
/// of its steps left them half done. A workspace checkpoint dropped between
/// its writer's freeze and thaw left the sandbox frozen for good (the chaos
/// drill's runs CD and CQ; the engine's snapshots now detach themselves
/// too); a create dropped during its launch left a running sandbox nobody
/// published, or one without its tenant's owner record. Its answer, if
/// nobody reads it, is dropped; a streamed body is still the client's to
/// read or drop.
pub async fn run_to_end(req: Request, next: Next) -> Response {
    use axum::http::Method;
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let call = tracing::Instrument::instrument(next.run(req), tracing::Span::current());
    match tokio::spawn(call).await {
        Ok(resp) => resp,
        Err(e) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "GENERAL::UNKNOWN_ERROR",
            format!("the call ended abnormally: {e}"),
        )
        .into_response(),
    }
}

/// 128 random bits, hex: one `getrandom(2)`, no file opened per request.
fn random_hex() -> String {
    use std::fmt::Write;
    let mut b = [0u8; 16];
    // Failure leaves zeros: an id for logs, not a secret.
    let _ = getrandom::fill(&mut b);
    b.iter().fold(String::with_capacity(32), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// Against DNS rebinding: a web page on a name its owner re-points at this
/// host reaches the API with that name in `Host`, and, on loopback without a
/// key, could drive it. Only names this server answers to pass: IP literals
/// (rebinding needs a name), `localhost`, and the configured names
/// ([`crate::ApiConfig::allowed_hosts`]), and the sandbox origins' names under
/// `--sandbox-domain` (those reach one sandbox port, never the API's routes:
/// `origin.rs`). A request without `Host` (HTTP/1.0;
/// browsers always send one) passes. Anything else is a 421.
pub async fn host_check(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    match request_host(&req) {
        Some(h) if !host_allowed(&h, &st.cfg) => ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "GENERAL::MISDIRECTED_HOST",
            format!("Host {h:?} is not a name this server answers to (ember serve --allowed-host)"),
        )
        .into_response(),
        _ => next.run(req).await,
    }
}

/// The request's `Host` (or, in HTTP/2, the URI's authority); a value that is
/// not text is `""`, which no check accepts.
pub(crate) fn request_host(req: &Request) -> Option<String> {
    match req.headers().get(header::HOST) {
        None => req.uri().host().map(str::to_string),
        Some(v) => Some(v.to_str().map(str::to_string).unwrap_or_default()),
    }
}

/// The name (or address) of a `Host` value, lowercase, without port or final dot.
pub(crate) fn host_name(host: &str) -> Option<String> {
    let auth = host.parse::<axum::http::uri::Authority>().ok()?;
    let name = auth.host().trim_start_matches('[').trim_end_matches(']');
    Some(name.trim_end_matches('.').to_ascii_lowercase())
}

/// `host` is a `Host` header value: a name or address, maybe with a port.
fn host_allowed(host: &str, cfg: &crate::ApiConfig) -> bool {
    let Some(name) = host_name(host) else { return false };
    let public = cfg.public_host.as_deref().and_then(host_name);
    name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || public.is_some_and(|p| p == name)
        || cfg.allowed_hosts.iter().any(|a| host_name(a).is_some_and(|a| a == name))
        || cfg.sandbox_domain.as_deref().is_some_and(|d| crate::origin::parse(&name, d).is_some())
}

/// When an API key is configured, every route but `/health` and `/version` needs
/// it, in `OPEN-SANDBOX-API-KEY` or `Authorization: Bearer`. A tenant's key
/// (`ember tenant key create`) passes too, as that tenant. The caller goes
/// into the request's extensions as a [`Principal`] for `tenancy::guard`.
pub async fn auth(State(st): State<ApiState>, mut req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path == "/health" || path == "/version" {
        return next.run(req).await;
    }
    // The dashboard checks its session cookie (or the key) itself (`ui/`);
    // the caller it finds goes on to the tenancy guard like any other.
    if st.cfg.ui.is_some() && (path == "/ui" || path.starts_with("/ui/")) {
        if let Some(p) = crate::ui::principal(&st, req.headers()) {
            req.extensions_mut().insert(p);
        }
        return next.run(req).await;
    }
    match principal(&st, req.headers()) {
        Err(refused) => crate::tenancy::unauthorized(&st, req, *refused).await,
        Ok(p) => {
            req.extensions_mut().insert(p);
            next.run(req).await
        }
    }
}

fn given_key(h: &axum::http::HeaderMap) -> Option<&str> {
    h.get(API_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .or_else(|| h.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")))
}

/// Who presents the request's key: a tenant whose key it is, else the admin
/// when it is the configured key (or none is configured); else the 401.
pub(crate) fn principal(st: &ApiState, h: &axum::http::HeaderMap) -> Result<Principal, Box<Response>> {
    // A scoped token, as a key or in OpenSandbox's secure-access header.
    let secure = h.get(SECURE_ACCESS_HEADER).and_then(|v| v.to_str().ok());
    // A key given is the credential; the header counts only without one.
    let token = match given_key(h) {
        Some(k) => Some(k).filter(|k| k.starts_with(TOKEN_PREFIX)),
        None => secure,
    };
    if let Some(t) = token {
        return match st.tenants.token(t) {
            Some(g) => Ok(Principal::Scoped(g)),
            None => Err(Box::new(
                ApiError::new(StatusCode::UNAUTHORIZED, "INVALID_API_KEY", "the token is unknown or expired")
                    .into_response(),
            )),
        };
    }
    if let Some((name, key)) = given_key(h).and_then(|k| st.tenants.resolve(k)) {
        return Ok(Principal::Tenant { name, key });
    }
    match key_refusal(&st.cfg, h) {
        Some(refused) => Err(Box::new(refused)),
        None if st.cfg.api_key.is_some() => Ok(Principal::Admin { key: "admin" }),
        None => Ok(Principal::Admin { key: "none" }),
    }
}

/// The 401 of a request without the configured key; `None` when it may pass
/// (the key is right, or none is configured): the admin's check, which
/// [`principal`] makes after a tenant's key and a token.
pub(crate) fn key_refusal(cfg: &crate::ApiConfig, h: &axum::http::HeaderMap) -> Option<Response> {
    let key = cfg.api_key.as_deref()?;
    match given_key(h) {
        None => Some(
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "MISSING_API_KEY",
                "this server needs an API key in OPEN-SANDBOX-API-KEY",
            )
            .into_response(),
        ),
        Some(g) if !constant_time_eq(g.as_bytes(), key.as_bytes()) => {
            Some(ApiError::new(StatusCode::UNAUTHORIZED, "INVALID_API_KEY", "the API key is not valid").into_response())
        }
        Some(_) => None,
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use axum::routing::post;
    use tokio::io::AsyncWriteExt;

    /// A handler whose client went away runs to its end: it is released
    /// only after the client's connection is closed, and its end is seen.
    /// Without the layer hyper drops it, and the end's sender with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_changing_call_runs_to_its_end_after_its_client_goes_away() {
        let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
        let (ended_tx, ended) = tokio::sync::oneshot::channel::<()>();
        let release = std::sync::Arc::new(tokio::sync::Notify::new());
        let slots = std::sync::Arc::new(std::sync::Mutex::new((Some(started_tx), Some(ended_tx))));
        let (r, s) = (release.clone(), slots.clone());
        let handler = move || async move {
            let (start, end) = {
                let mut g = s.lock().expect("slots");
                (g.0.take(), g.1.take())
            };
            start.expect("one call").send(()).expect("the test waits");
            r.notified().await;
            end.expect("one call").send(()).expect("the test waits");
            "done"
        };
        let app =
            axum::Router::new().route("/change", post(handler)).layer(axum::middleware::from_fn(super::run_to_end));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let req = format!("POST /change HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\n\r\n");
        conn.write_all(req.as_bytes()).await.expect("send");
        started.await.expect("the handler started");
        drop(conn);
        // Without the layer the server, seeing the close, drops the handler
        // and the end's sender with it: the wait ends at once, in an error.
        let mut ended = ended;
        let early = tokio::time::timeout(std::time::Duration::from_secs(2), &mut ended).await;
        assert!(early.is_err(), "the handler was dropped when its client went away: {early:?}");
        release.notify_one();
        ended.await.expect("the handler ran to its end");
    }

    #[test]
    fn only_served_names_pass_the_host_check() {
        let cfg = crate::ApiConfig {
            allowed_hosts: vec!["ember.example".into()],
            public_host: Some("pub.example:9000".into()),
            sandbox_domain: Some("sb.example".into()),
            ..Default::default()
        };
        let ok = [
            "127.0.0.1:8080",
            "[::1]:8080",
            "localhost:1",
            "LOCALHOST",
            "10.0.0.5",
            "ember.example.:80",
            "pub.example",
            "8080-abc-1.sb.example:9000",
        ];
        for h in ok {
            assert!(super::host_allowed(h, &cfg), "{h}");
        }
        for h in [
            "evil.example:8080",
            "localhost.evil.example",
            "ember.example.evil",
            "",
            "a b",
            "127.0.0.1.nip.io",
            "sb.example",
            "x-abc.sb.example",
        ] {
            assert!(!super::host_allowed(h, &cfg), "{h}");
        }
    }
}
