//! Cross-cutting request handling: `X-Request-ID` echo and API-key auth.
use crate::error::ApiError;
use crate::ApiState;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
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
