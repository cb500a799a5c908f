//! The audit record of one call: every call that changes something (any
//! method but GET, HEAD and OPTIONS), exec and file writes through the proxy
//! included. An exec's command line is read from its body (bounded); nothing
//! else of a body is kept, so env values and secrets of a create never reach
//! the log, and no answer body is read.
use super::route::Route;
use super::Principal;
use crate::ApiState;
use axum::body::{to_bytes, Body};
use axum::extract::{ConnectInfo, Request};
use axum::http::{header, Method, StatusCode};
use ember_types::tenant::AuditRecord;
use std::net::SocketAddr;

/// An exec body larger than this is passed on unread; its command is not logged.
const MAX_EXEC_BODY: u64 = 64 << 10;

/// The record of a call, its outcome not known yet; `None` for a read.
fn record(tenant: &str, key: &str, route: &Route, req: &Request) -> Option<AuditRecord> {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let h = req.headers();
    let request_id = h.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let source = req.extensions().get::<ConnectInfo<SocketAddr>>().map_or("unknown".into(), |c| c.0.to_string());
    Some(AuditRecord {
        ts_ms: ember_engine::record::now_ms(),
        tenant: tenant.to_string(),
        key: key.to_string(),
        source,
        request_id,
        method: req.method().to_string(),
        path: req.uri().path().to_string(),
        action: route.action.clone(),
        argv: None,
        status: 0,
        outcome: String::new(),
    })
}

/// The tenant a refused call is logged under: no key named one.
const UNKNOWN_TENANT: &str = "unknown";

/// The record of a call the key check refused (401): its tenant is
/// [`UNKNOWN_TENANT`]; its key the presented credential's public prefix
/// when it has a key's or token's shape (`emb_1a2b3c4d`), else `invalid`
/// (never the value: a mistyped admin key is still a secret), `none`
/// without one.
pub(super) fn unauthorized(route: &Route, req: &Request) -> Option<AuditRecord> {
    use crate::middleware::{API_KEY_HEADER, SECURE_ACCESS_HEADER};
    let h = req.headers();
    let text = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    let given = text(API_KEY_HEADER)
        .or_else(|| text("authorization").and_then(|v| v.strip_prefix("Bearer ")))
        .or_else(|| text(SECURE_ACCESS_HEADER));
    let key = match given {
        None => "none",
        Some(k) if (k.starts_with("emb_") || k.starts_with("est_")) && k.len() > 12 => {
            let prefix = &k[..12];
            match prefix[4..].bytes().all(|b| b.is_ascii_hexdigit()) {
                true => prefix,
                false => "invalid",
            }
        }
        Some(_) => "invalid",
    };
    record(UNKNOWN_TENANT, key, route, req)
}

pub(super) async fn start(p: &Principal, route: &Route, req: Request) -> (Request, Option<AuditRecord>) {
    let Some(mut rec) = record(p.tenant(), p.key(), route, &req) else { return (req, None) };
    let h = req.headers();
    if route.action != "exec" {
        return (req, Some(rec));
    }
    let len = h.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if len.is_none_or(|n| n > MAX_EXEC_BODY) {
        rec.argv = Some(format!("<not recorded: body not sized or over {MAX_EXEC_BODY} bytes>"));
        return (req, Some(rec));
    }
    let (parts, body) = req.into_parts();
    let bytes = to_bytes(body, MAX_EXEC_BODY as usize).await.unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    // `command` (a shell line) or `argv` (a vector, kept as JSON so its
    // word boundaries stay visible).
    rec.argv = Some(match (&v["command"], &v["argv"]) {
        (serde_json::Value::String(s), _) => s.clone(),
        (_, a @ serde_json::Value::Array(_)) => a.to_string(),
        _ => String::new(),
    });
    (Request::from_parts(parts, Body::from(bytes)), Some(rec))
}

pub(super) fn finish(st: &ApiState, rec: &mut AuditRecord, status: StatusCode) {
    rec.status = status.as_u16();
    rec.outcome = match status.as_u16() {
        s if s < 400 => "ok",
        401 | 403 | 429 => "denied",
        _ => "error",
    }
    .into();
    if let Err(e) = st.tenants.audit().append(rec) {
        tracing::warn!(error = %e, path = %rec.path, "audit log append failed");
    }
}
