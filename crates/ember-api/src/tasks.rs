//! `/v1/tasks`: queued work pulled by the node's workers.
use crate::error::ApiError;
use crate::{ApiJson, ApiPath, ApiState};
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::HeaderName;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_engine::tasks::{TaskFilter, TaskState, LOG_READ_CHUNK};
use ember_types::task::{SubmitTaskRequest, TaskList, Tier};
use std::time::Duration;

const ATTEMPT_HEADER: HeaderName = HeaderName::from_static("x-ember-attempt");

fn query(q: Option<String>) -> Vec<(String, String)> {
    form_urlencoded::parse(q.unwrap_or_default().as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect()
}

/// 201 with a new task, 200 with the existing one when the key was known.
pub async fn submit(
    State(st): State<ApiState>,
    axum::Extension(p): axum::Extension<crate::Principal>,
    ApiJson(mut req): ApiJson<SubmitTaskRequest>,
) -> Result<Response, ApiError> {
    // A tenant key's tasks are its tenant's whatever the body says (the
    // queue's per-tenant cap counts them there); the admin names any.
    if let Some(t) = p.tenant_key() {
        req.tenant = Some(t.to_string());
    }
    let (rec, created) = st.engine.submit_task(req).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(rec)).into_response())
}

pub async fn list(
    State(st): State<ApiState>,
    axum::Extension(p): axum::Extension<crate::Principal>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let mut f = TaskFilter::default();
    for (k, v) in query(q) {
        match k.as_str() {
            "state" => f.states.push(
                TaskState::parse(&v)
                    .ok_or_else(|| ApiError::bad_request(format!("state {v:?} is not a task state")))?,
            ),
            "tier" => f.tiers.push(Tier::parse(&v).ok_or_else(|| {
                ApiError::bad_request(format!("tier {v:?}: expected interactive, standard or batch"))
            })?),
            "workspace" => f.workspace = Some(v),
            _ => {}
        }
    }
    let items =
        crate::tenancy::visible(&st, &p, ember_engine::tenants::Kind::Task, st.engine.list_tasks(&f).await?, |t| &t.id);
    Ok(Json(TaskList { items }).into_response())
}

pub async fn get_one(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(st.engine.task(&id).await?).into_response())
}

pub async fn cancel(State(st): State<ApiState>, ApiPath(id): ApiPath<String>) -> Result<Response, ApiError> {
    Ok(Json(st.engine.cancel_task(&id).await?).into_response())
}

/// The attempt's output as text from `offset` (default 0), read from the
/// file in pieces of at most `LOG_READ_CHUNK` bytes, never whole; with
/// `follow=true` the reply keeps following the file by offset until the
/// attempt ends. `X-Ember-Attempt` says which attempt it is.
pub async fn logs(
    State(st): State<ApiState>,
    ApiPath(id): ApiPath<String>,
    RawQuery(q): RawQuery,
) -> Result<Response, ApiError> {
    let (mut follow, mut attempt, mut offset) = (false, None, 0u64);
    for (k, v) in query(q) {
        match k.as_str() {
            "follow" => follow = v == "true" || v == "1",
            "attempt" => {
                attempt = Some(v.parse::<u32>().map_err(|_| ApiError::bad_request("attempt must be a number"))?)
            }
            "offset" => offset = v.parse().map_err(|_| ApiError::bad_request("offset must be a byte count"))?,
            _ => {}
        }
    }
    let (first, ended, n) = st.engine.task_log(&id, attempt, offset).await?;
    let head = [(header::CONTENT_TYPE, "text/plain; charset=utf-8".to_string()), (ATTEMPT_HEADER, n.to_string())];
    if (!follow || ended) && (first.len() as u64) < LOG_READ_CHUNK {
        // The rest of the log fit in one read.
        return Ok((head, first).into_response());
    }
    let engine = st.engine.clone();
    let offset = offset + first.len() as u64;
    let stream = futures_util::stream::unfold((Some(first), offset, false), move |(pending, offset, done)| {
        let engine = engine.clone();
        let id = id.clone();
        async move {
            if let Some(p) = pending.filter(|p| !p.is_empty()) {
                return Some((Ok::<_, std::io::Error>(p), (None, offset, done)));
            }
            let mut done = done;
            loop {
                if done {
                    return None;
                }
                match engine.task_log(&id, Some(n), offset).await {
                    Ok((data, _, _)) if !data.is_empty() => {
                        let next = offset + data.len() as u64;
                        return Some((Ok(data), (None, next, false)));
                    }
                    // Nothing past `offset`: the end, unless following a live attempt.
                    Ok((_, ended, _)) => done = ended || !follow,
                    Err(_) => return None,
                }
                if !done {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    Ok((head, Body::from_stream(stream)).into_response())
}
