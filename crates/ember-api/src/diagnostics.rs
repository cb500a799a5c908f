//! Diagnostics (`/v1/sandboxes/{id}/diagnostics/{logs,events}`).
use crate::convert::rfc3339;
use crate::error::ApiError;
use crate::{ApiPath, ApiState};
use axum::extract::{RawQuery, State};
use axum::Json;
use ember_types::api::DiagnosticContentResponse;

/// The most log bytes one answer carries (the tail is kept).
const MAX_LOG: u64 = 256 << 10;

fn scope_of(q: Option<String>) -> String {
    form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "scope")
        .map(|(_, v)| v.into_owned())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "all".into())
}

fn answer(id: String, kind: &str, scope: String, content: String, truncated: bool) -> DiagnosticContentResponse {
    let mut warnings = Vec::new();
    if !["all", "container", "runtime", "lifecycle", "process"].contains(&scope.as_str()) {
        warnings.push(format!("scope {scope:?} is not distinguished by ember; showing everything"));
    }
    DiagnosticContentResponse {
        sandbox_id: id,
        kind: kind.into(),
        scope,
        delivery: "inline".into(),
        content_type: "text/plain; charset=utf-8".into(),
        truncated,
        content,
        warnings,
    }
}

/// `GET .../diagnostics/logs?scope=`: the tail of the sandbox agent's own log
/// (its startup, the entrypoint's failures, anything it reports).
pub async fn logs(
    State(st): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    RawQuery(q): RawQuery,
) -> Result<Json<DiagnosticContentResponse>, ApiError> {
    let (content, truncated) = st.engine.agent_log(&id, MAX_LOG).await?;
    Ok(Json(answer(id, "logs", scope_of(q), content, truncated)))
}

/// `GET .../diagnostics/events?scope=`: the lifecycle events ember recorded.
pub async fn events(
    State(st): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    RawQuery(q): RawQuery,
) -> Result<Json<DiagnosticContentResponse>, ApiError> {
    let rec = st.engine.get(&id).await?;
    let content: String = rec.events.iter().map(|(ms, text)| format!("{} {text}\n", rfc3339(*ms))).collect();
    Ok(Json(answer(id, "events", scope_of(q), content, false)))
}
