//! Quiesce for a checkpoint: `POST /ember/v1/quiesce`.
//!
//! gVisor cannot save a socket bound to, or connected through, a host endpoint,
//! and the agent's listener is one (`--host-uds=create`). So before the daemon
//! runs `runsc checkpoint` the agent stops accepting, lets every connection
//! finish, drops its listener and writes [`QUIESCED`] beside its socket; then it
//! waits for the daemon to create [`RESUME`] (after `runsc restore`, or to call
//! the checkpoint off) and binds again. Its other listener (the TCP readiness
//! port, which gVisor cannot save either) closes and reopens around it too. A quiesce while an event stream or a
//! PTY WebSocket is open is refused with 409: cutting it would lose output
//! silently.
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::server::App;
use axum::extract::State;
use axum::http::StatusCode;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::{watch, Notify, RwLock, RwLockReadGuard};

/// Written by the agent once its listener is gone (`ember_runtime::oci` waits for it).
pub const QUIESCED: &str = "quiesced";
/// Written by the daemon when the agent may listen again.
pub const RESUME: &str = "resume";
/// Where [`QUIESCED`] is written before it is renamed into place.
const QUIESCED_ASIDE: &str = ".quiesced";

/// Streaming responses and attached PTYs open right now.
static OPEN_STREAMS: AtomicUsize = AtomicUsize::new(0);

/// Held by every open stream; the count drops with it.
pub struct StreamGuard(());

impl StreamGuard {
    pub fn new() -> StreamGuard {
        OPEN_STREAMS.fetch_add(1, Ordering::SeqCst);
        StreamGuard(())
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        OPEN_STREAMS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// True from an accepted quiesce until the daemon's `resume`.
fn quiescing() -> &'static watch::Sender<bool> {
    static W: OnceLock<watch::Sender<bool>> = OnceLock::new();
    W.get_or_init(|| watch::Sender::new(false))
}

/// Held (shared) by every other listener of the agent while it is open; a
/// quiesce takes it exclusively, so it waits for them to close, and they
/// cannot open again until the resume.
fn gate() -> &'static RwLock<()> {
    static G: OnceLock<RwLock<()>> = OnceLock::new();
    G.get_or_init(|| RwLock::new(()))
}

/// For a listener besides the HTTP one (gVisor cannot save the agent's TCP
/// readiness listener either): hold the guard while the listener is open and
/// close it when [`quiesce_requested`] resolves.
pub async fn listener_guard() -> RwLockReadGuard<'static, ()> {
    gate().read().await
}

/// Resolves once a quiesce has started (immediately if one is under way).
pub async fn quiesce_requested() {
    let _ = quiescing().subscribe().wait_for(|q| *q).await;
}

/// Resolves once no quiesce is under way.
pub async fn quiesce_over() {
    let _ = quiescing().subscribe().wait_for(|q| !*q).await;
}

fn requests() -> &'static Notify {
    static N: OnceLock<Notify> = OnceLock::new();
    N.get_or_init(Notify::new)
}

/// Resolves when a quiesce was accepted: the server's graceful-shutdown signal.
pub async fn requested() {
    requests().notified().await
}

/// `POST /ember/v1/quiesce`: 200 and the listener goes once this reply is sent.
pub async fn quiesce(State(app): State<App>) -> ApiResult<StatusCode> {
    if !matches!(app.config.listen, crate::config::ListenAddr::Unix(_)) {
        return Err(ApiError::new(ErrorCode::NotSupported, "quiesce needs an agent listening on a socket path"));
    }
    let open = OPEN_STREAMS.load(Ordering::SeqCst);
    if open > 0 {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("{open} command stream(s) or terminal(s) are open; close them before a checkpoint"),
        ));
    }
    // notify_one keeps a permit if the server is not waiting yet.
    requests().notify_one();
    Ok(StatusCode::OK)
}

/// After the server drained: say so, wait for [`RESUME`], consume it. The
/// stale socket path is the daemon's to remove (gVisor refuses to unlink a
/// host-bound socket from inside).
pub async fn hold(socket: &Path) -> std::io::Result<()> {
    let dir = socket.parent().unwrap_or(Path::new("/"));
    quiescing().send_replace(true);
    let _closed = gate().write().await;
    let _ = std::fs::remove_file(socket);
    // Written aside, closed, then renamed: the daemon checkpoints as soon as
    // it sees the name (and removes it), and a current gVisor cannot restore
    // an fd still open on a host file removed meanwhile: the restored agent's
    // pending write failed with ENOENT and it exited.
    let aside = dir.join(QUIESCED_ASIDE);
    std::fs::write(&aside, b"1\n")?;
    std::fs::rename(&aside, dir.join(QUIESCED))?;
    let resume = dir.join(RESUME);
    // Blocking on purpose: the agent's runtime is single-threaded, so this
    // parks all of it in `nanosleep` rather than in `epoll_wait` while gVisor
    // saves and restores it: an agent whose `epoll_wait` was in flight across
    // a save was once seen never to wake after the restore (docs/
    // gvisor-checkpoint.md, Limits). Nothing else of the agent may run during
    // a checkpoint anyway.
    while !resume.exists() {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = std::fs::remove_file(&resume);
    let _ = std::fs::remove_file(dir.join(QUIESCED));
    quiescing().send_replace(false);
    Ok(())
}
