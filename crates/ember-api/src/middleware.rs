//! Cross-cutting request handling: `X-Request-ID` echo, the `Host` check and
//! API-key auth.
use crate::error::ApiError;
use crate::ApiState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

pub const API_KEY_HEADER: &str = "open-sandbox-api-key";

/// Echoes the client's `X-Request-ID`, or generates one, on every response.
pub async fn request_id(req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_str(&random_hex()).unwrap_or(HeaderValue::from_static("0")));
    let mut resp = next.run(req).await;
    resp.headers_mut().insert("x-request-id", id);
    resp
}

fn random_hex() -> String {
    use std::io::Read;
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Against DNS rebinding: a web page on a name its owner re-points at this
/// host reaches the API with that name in `Host`, and, on loopback without a
/// key, could drive it. Only names this server answers to pass: IP literals
/// (rebinding needs a name), `localhost`, and the configured names
/// ([`crate::ApiConfig::allowed_hosts`]). A request without `Host` (HTTP/1.0;
/// browsers always send one) passes. Anything else is a 421.
pub async fn host_check(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    let host = match req.headers().get(header::HOST) {
        None => req.uri().host().map(str::to_string),
        Some(v) => Some(v.to_str().map(str::to_string).unwrap_or_default()),
    };
    match host {
        Some(h) if !host_allowed(&h, &st.cfg) => ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "GENERAL::MISDIRECTED_HOST",
            format!("Host {h:?} is not a name this server answers to (ember serve --allowed-host)"),
        )
        .into_response(),
        _ => next.run(req).await,
    }
}

/// The name (or address) of a `Host` value, lowercase, without port or final dot.
fn host_name(host: &str) -> Option<String> {
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
}

/// When an API key is configured, every route but `/health` and `/version` needs
/// it, in `OPEN-SANDBOX-API-KEY` or `Authorization: Bearer`.
pub async fn auth(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    let Some(key) = st.cfg.api_key.as_deref() else { return next.run(req).await };
    let path = req.uri().path();
    if path == "/health" || path == "/version" {
        return next.run(req).await;
    }
    let h = req.headers();
    let given = h
        .get(API_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .or_else(|| h.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")));
    match given {
        None => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "MISSING_API_KEY",
            "this server needs an API key in OPEN-SANDBOX-API-KEY",
        )
        .into_response(),
        Some(g) if !constant_time_eq(g.as_bytes(), key.as_bytes()) => {
            ApiError::new(StatusCode::UNAUTHORIZED, "INVALID_API_KEY", "the API key is not valid").into_response()
        }
        Some(_) => next.run(req).await,
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_served_names_pass_the_host_check() {
        let cfg = crate::ApiConfig {
            allowed_hosts: vec!["ember.example".into()],
            public_host: Some("pub.example:9000".into()),
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
        ];
        for h in ok {
            assert!(super::host_allowed(h, &cfg), "{h}");
        }
        for h in ["evil.example:8080", "localhost.evil.example", "ember.example.evil", "", "a b", "127.0.0.1.nip.io"] {
            assert!(!super::host_allowed(h, &cfg), "{h}");
        }
    }
}
