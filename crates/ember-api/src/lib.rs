//! ember's HTTP API. One API, OpenSandbox-shaped from the start: the lifecycle
//! routes use OpenSandbox 1.1.1's paths, status codes and JSON (mounted under
//! `/v1` and bare, as upstream), with ember's own optional fields added. Exec and
//! file calls go to the agent through the proxy route, which speaks execd.
//!
//! Handlers only parse requests into [`ember_engine::ControlPlane`] calls (this
//! node's engine today; a cluster's router later: the API cannot tell); errors become
//! `{code, message}` in `error.rs`. Layout: `sandboxes.rs` (lifecycle),
//! `proxy.rs` (agent proxy, any port), `egress.rs` (port 18080's `/policy`),
//! `diagnostics.rs` (logs, events), `sandbox_snapshots.rs`
//! (OpenSandbox snapshots: `/v1/sandboxes/{id}/snapshots`, `/v1/snapshots`), `system.rs` (health, version, metrics),
//! `middleware.rs` (request id, `Host` check, API key), `origin.rs` (sandbox
//! ports on origins of their own, `--sandbox-domain`), `cluster.rs` (the
//! route a cluster's nodes forward calls through).
#![forbid(unsafe_code)]

mod agent_sandbox;
mod body;
mod cluster;
mod convert;
mod diagnostics;
mod egress;
pub mod error;
mod images;
mod middleware;
mod network;
pub mod origin;
mod paging;
mod pools;
mod proxy;
mod sandbox_snapshots;
mod sandboxes;
mod snapshots;
mod system;
mod tasks;
mod tenancy;
mod tenants;
mod tokens;
pub mod ui;
mod workspaces;

pub use tenancy::Principal;

use axum::extract::{FromRequest, Request};
use axum::middleware::map_response;
use axum::routing::{any, delete, get, patch, post};
use axum::Router;
use ember_engine::ControlPlane;
use error::ApiError;
use std::future::Future;
use std::sync::Arc;

/// API configuration, fixed at start.
#[derive(Clone, Debug, Default)]
pub struct ApiConfig {
    /// When set, every route but /health and /version requires it.
    pub api_key: Option<String>,
    /// `host:port` put in endpoint answers; defaults to the request's Host.
    pub public_host: Option<String>,
    /// Host names requests may name besides IP literals, `localhost` and
    /// `public_host`'s name (`--allowed-host`). Any other `Host` is refused
    /// (421), against DNS rebinding (`middleware::host_check`).
    pub allowed_hosts: Vec<String>,
    /// `--sandbox-domain`, normalized (`origin::normalize_domain`): a request
    /// whose `Host` is `<port>-<sandbox id>.<domain>` is proxied whole to that
    /// sandbox port, on a browser origin of its own (`origin.rs`).
    pub sandbox_domain: Option<String>,
    /// `--ui`: the dashboard's routes (`ui/`), its reports and sessions.
    pub ui: Option<ui::UiConfig>,
}

#[derive(Clone)]
pub struct ApiState {
    /// Everything the routes ask of the control plane; the API reaches the
    /// engine through this alone (`bins/ember/tests/architecture.rs`).
    pub engine: Arc<dyn ControlPlane>,
    pub cfg: Arc<ApiConfig>,
    /// Tenants, their keys and objects, quotas, the audit log (`tenancy.rs`).
    pub tenants: Arc<ember_engine::Tenants>,
}

/// A JSON body whose rejection is a `{code, message}` 400, not axum's plain text.
pub struct ApiJson<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        // axum checks the content type and parses; the decoding is ours
        // (`body.rs`: integral floats, the failing field named).
        match axum::Json::<serde_json::Value>::from_request(req, state).await {
            Ok(axum::Json(v)) => body::decode_value(v).map(ApiJson),
            Err(e) => Err(ApiError::bad_request(format!("invalid request body: {}", e.body_text()))),
        }
    }
}

/// Path parameters whose rejection (a port that is not a number, say) is a
/// `{code, message}` 400 like every other error.
pub struct ApiPath<T>(pub T);

impl<T: serde::de::DeserializeOwned + Send, S: Send + Sync> axum::extract::FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(ApiPath(v)),
            Err(e) => Err(ApiError::bad_request(format!("invalid path parameter: {}", e.body_text()))),
        }
    }
}

fn lifecycle() -> Router<ApiState> {
    Router::new()
        .route("/sandboxes", post(sandboxes::create).get(sandboxes::list))
        .route("/sandboxes/{id}", get(sandboxes::get_one).delete(sandboxes::remove))
        .route("/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{id}/resume", post(sandboxes::resume))
        .route("/sandboxes/{id}/checkpoint", post(sandboxes::checkpoint))
        .route("/sandboxes/{id}/renew-expiration", post(sandboxes::renew))
        .route("/sandboxes/{id}/metadata", patch(sandboxes::patch_metadata))
        .route("/sandboxes/{id}/endpoints/{port}", get(sandboxes::endpoint))
        .route("/sandboxes/{id}/boundary", get(sandboxes::boundary))
        .route("/sandboxes/{id}/stats", get(sandboxes::stats))
        .route("/sandboxes/{id}/diagnostics/logs", get(diagnostics::logs))
        .route("/sandboxes/{id}/diagnostics/events", get(diagnostics::events))
        .route("/sandboxes/{id}/snapshots", post(sandbox_snapshots::create))
        .route("/snapshots", get(sandbox_snapshots::list))
        .route("/snapshots/{snapshotId}", get(sandbox_snapshots::get_one).delete(sandbox_snapshots::remove))
        .route("/sandboxes/{id}/proxy/{port}", any(proxy::proxy_root).layer(map_response(proxy::on_api_origin)))
        .route("/sandboxes/{id}/proxy/{port}/{*rest}", any(proxy::proxy).layer(map_response(proxy::on_api_origin)))
}

pub fn router(state: ApiState) -> Router {
    let v1 = lifecycle()
        .route("/metrics/events", post(system::metrics_event))
        .route("/images", get(images::list))
        .route("/images/pull", post(images::pull))
        .route("/images/pulls", get(images::pulls))
        .route("/images/import", post(images::import))
        .route("/images/prune", post(images::prune))
        .route("/images/{name}", get(images::get_one).delete(images::remove))
        .route("/templates", post(images::create_template).get(images::list_templates))
        .route("/templates/{name}", get(images::get_template).delete(images::delete_template))
        .route("/runtimes", get(system::runtimes))
        .route("/pools", post(pools::create).get(pools::list))
        .route("/pools/{name}", get(pools::get_one).put(pools::resize).delete(pools::remove))
        .route("/workspaces", post(workspaces::create).get(workspaces::list))
        .route("/workspaces/{name}", get(workspaces::get_one).delete(workspaces::remove))
        .route("/workspaces/{name}/checkpoint", post(workspaces::checkpoint))
        .route("/tasks", post(tasks::submit).get(tasks::list))
        .route("/tasks/{id}", get(tasks::get_one))
        .route("/tasks/{id}/cancel", post(tasks::cancel))
        .route("/tasks/{id}/logs", get(tasks::logs))
        .route("/workspaces/{name}/snapshots", post(snapshots::create))
        .route("/workspace-snapshots", get(snapshots::list))
        .route("/workspace-snapshots/operations", get(snapshots::operations))
        .route("/workspace-snapshots/operations/{id}", get(snapshots::operation_one))
        .route("/workspace-snapshots/{id}", get(snapshots::get_one).delete(snapshots::remove))
        .route("/workspace-snapshots/{id}/restore", post(snapshots::restore))
        .route("/workspace-snapshots/{id}/fork", post(snapshots::fork))
        .route("/snapshot-store/gc", post(snapshots::gc))
        .route("/sandboxes/{id}/network", get(network::get_policy).put(network::put_policy))
        .route("/sandboxes/{id}/network/events", get(network::events))
        .route("/network", get(network::node))
        .route("/cluster/call", post(cluster::call))
        .route("/tenants", post(tenants::create).get(tenants::list))
        .route("/tenants/{name}", get(tenants::get_one).patch(tenants::update).delete(tenants::remove))
        .route("/tenants/{name}/keys", post(tenants::create_key).get(tenants::keys))
        .route("/tenants/{name}/keys/{prefix}", delete(tenants::revoke_key))
        .route("/audit", get(tenants::audit))
        .route("/sandboxes/{id}/tokens", post(tokens::create));
    Router::new()
        .nest("/v1", v1)
        .merge(lifecycle())
        .route("/health", get(system::health))
        .route("/version", get(system::version))
        .route("/metrics", get(system::metrics))
        .merge(if state.cfg.ui.is_some() { ui::routes() } else { Router::new() })
        .fallback(system::not_found)
        .method_not_allowed_fallback(system::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(state.clone(), tenancy::guard))
        .layer(axum::middleware::from_fn_with_state(state.clone(), middleware::auth))
        // A request with `X-Sandbox-ID` is agent-sandbox's router's, whatever
        // its path; it checks the API key itself, as the sandbox origins do.
        .layer(axum::middleware::from_fn_with_state(state.clone(), agent_sandbox::dispatch))
        // After the `Host` check, before the API-key rule that exempts
        // `/health`: under a sandbox's name every path is the sandbox's.
        .layer(axum::middleware::from_fn_with_state(state.clone(), origin::dispatch))
        .layer(axum::middleware::from_fn_with_state(state.clone(), middleware::host_check))
        // Inside the request's span, around everything else: a call that
        // changes something runs to its end if its client goes away.
        .layer(axum::middleware::from_fn(middleware::run_to_end))
        .layer(axum::middleware::from_fn(middleware::request_id))
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Streamed exec events are small writes: without TCP_NODELAY the last one
    // of a reply waits for the client's delayed ACK (~40 ms on loopback).
    let listener = listener.tap_io(|s| {
        let _ = s.set_nodelay(true);
    });
    // The peer's address goes into the audit log.
    let app = router(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}
