//! Health, version, Prometheus metrics, SDK telemetry, and the structured 404/405.
use crate::error::ApiError;
use crate::ApiState;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

pub async fn health() -> Response {
    Json(serde_json::json!({ "status": "healthy" })).into_response()
}

pub async fn version() -> Response {
    Json(serde_json::json!({ "version": env!("CARGO_PKG_VERSION") })).into_response()
}

/// `GET /v1/runtimes`: every runtime class and whether it can run here.
pub async fn runtimes(State(st): State<ApiState>) -> Response {
    Json(ember_types::api::RuntimeClassList { items: st.engine.runtime_classes() }).into_response()
}

pub async fn metrics(State(st): State<ApiState>) -> Response {
    let mut body = metrics_text(&st).await;
    let tenants = crate::tenants::metrics_text(&st).await;
    // Before OpenMetrics' closing `# EOF`.
    match body.rfind("# EOF") {
        Some(at) => body.insert_str(at, &tenants),
        None => body.push_str(&tenants),
    }
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body).into_response()
}

/// The engine's metrics, gathered on the blocking pool: on a cluster the
/// task queue's figures are requests to JetStream, which wait through a
/// stream leader's election and must not hold an async worker meanwhile.
pub(crate) async fn metrics_text(st: &ApiState) -> String {
    let engine = st.engine.clone();
    tokio::task::spawn_blocking(move || engine.metrics_text()).await.unwrap_or_default()
}

/// The SDK's fire-and-forget create telemetry: accepted and dropped.
pub async fn metrics_event() -> StatusCode {
    StatusCode::NO_CONTENT
}

pub async fn not_found(_body: axum::body::Bytes) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "GENERAL::NOT_FOUND", "no such route")
}

pub async fn method_not_allowed(_body: axum::body::Bytes) -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "GENERAL::METHOD_NOT_ALLOWED", "method not allowed on this route")
}
