//! The HTTP front door: the route table and the listener loop. Handlers only
//! parse requests and call into `commands`, `files` and `metrics`.
use crate::commands::registry::Registry;
use crate::config::{AgentConfig, ListenAddr};
use crate::error::{ApiError, ErrorCode};
use crate::metrics::Sampler;
use crate::reaper::Reaper;
use crate::{code, commands, files, metrics, proxy, pty, sessions};
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::routing::{any, delete, get, post};
use axum::Router;
use std::io;
use std::sync::Arc;

/// Shared state of every handler. Cheap to clone: all `Arc`s.
#[derive(Clone)]
pub struct App {
    pub config: Arc<AgentConfig>,
    pub reaper: Arc<Reaper>,
    pub registry: Arc<Registry>,
    pub sampler: Arc<Sampler>,
    pub sessions: Arc<sessions::Sessions>,
    pub contexts: Arc<code::Contexts>,
    pub ptys: Arc<pty::PtySessions>,
}

pub fn router(app: App) -> Router {
    Router::new()
        .route("/ping", get(|| async {}))
        .route("/command", post(commands::run_command).delete(commands::interrupt))
        .route("/command/status/{id}", get(commands::status))
        .route("/command/{id}/logs", get(commands::logs))
        .route("/session", post(sessions::create))
        .route("/session/{id}/run", post(sessions::run))
        .route("/session/{id}", delete(sessions::delete))
        .route("/pty", post(pty::create))
        .route("/pty/{id}", get(pty::status).delete(pty::delete))
        .route("/pty/{id}/ws", get(pty::websocket))
        .route("/code/context", post(code::create_context))
        .route("/code/contexts", get(code::list_contexts).delete(code::delete_contexts))
        .route("/code/contexts/{id}", get(code::get_context).delete(code::delete_context))
        .route("/code", post(code::run_code).delete(code::interrupt))
        .route("/metrics", get(metrics::get))
        .route("/metrics/watch", get(metrics::watch))
        .route("/proxy/{port}", any(proxy::proxy_root))
        .route("/proxy/{port}/{*rest}", any(proxy::proxy))
        .route("/ember/v1/claim", post(crate::claim::claim))
        .route("/ember/v1/secrets", post(crate::secrets::deliver))
        .route("/ember/v1/quiesce", post(crate::quiesce::quiesce))
        .merge(file_routes())
        // The same file routes with a filesystem identity (protocol §3.4):
        // every operation is checked by the kernel as that uid/gid.
        .nest("/v1/filesystem/{uid}/{gid}", file_routes().layer(axum::middleware::from_fn(files::identity_scope)))
        .fallback(not_supported)
        .method_not_allowed_fallback(not_supported)
        .with_state(app)
}

/// The file and directory routes, served bare and under `/v1/filesystem/{uid}/{gid}`.
fn file_routes() -> Router<App> {
    Router::new()
        .route("/files", delete(files::ops::remove_files))
        .route("/files/info", get(files::info))
        .route("/files/permissions", post(files::ops::chmod))
        .route("/files/mv", post(files::ops::rename))
        .route("/files/replace", post(files::ops::replace))
        .route("/files/search", get(files::walk::search))
        // Uploads stream to disk, so no body limit applies to them.
        .route(
            "/files/upload",
            post(files::upload::upload)
                .layer(DefaultBodyLimit::disable())
                .layer(axum::middleware::from_fn(files::upload::read_to_end)),
        )
        .route("/files/download", get(files::download::download))
        .route("/directories/list", get(files::walk::list))
        .route("/directories", post(files::ops::mkdir).delete(files::ops::remove_dirs))
}

async fn not_supported(method: Method, uri: Uri) -> ApiError {
    ApiError::new(ErrorCode::NotSupported, format!("{method} {} is not supported", uri.path()))
}

/// Binds the configured address (or adopts the inherited socket) and serves
/// forever (on a socket path, with pauses for checkpoints: `quiesce`). With
/// TCP, prints `listening on ADDR` first so tests learn the port.
///
/// Each connection gets a clone of the one router (an `Arc`, through
/// `into_make_service`): `axum::serve` given the `Router` itself re-runs
/// `with_state` on every connection, cloning all ~40 routes, a quarter of an
/// agent's CPU per claim (docs/performance.md, session 31).
pub async fn serve(config: &AgentConfig, app: Router) -> io::Result<()> {
    use axum::serve::ListenerExt;
    match &config.listen {
        ListenAddr::Tcp(addr) => {
            let l = tokio::net::TcpListener::bind(addr).await?;
            println!("listening on {}", l.local_addr()?);
            // Small event frames must not wait for Nagle's algorithm.
            let l = l.tap_io(|s| {
                let _ = s.set_nodelay(true);
            });
            axum::serve(l, app.into_make_service()).await
        }
        // Serves until a quiesce (checkpoint), holds, binds again.
        ListenAddr::Unix(path) => loop {
            // A stale socket file from an earlier run would make bind fail.
            let _ = std::fs::remove_file(path);
            let l = tokio::net::UnixListener::bind(path)?;
            axum::serve(l, app.clone().into_make_service()).with_graceful_shutdown(crate::quiesce::requested()).await?;
            crate::quiesce::hold(path).await?;
        },
        ListenAddr::Fd(fd) => {
            let fd = ember_sys::process::take_inherited_fd(*fd)?;
            let std_listener = std::os::unix::net::UnixListener::from(fd);
            std_listener.set_nonblocking(true)?;
            axum::serve(tokio::net::UnixListener::from_std(std_listener)?, app.into_make_service()).await
        }
    }
}
