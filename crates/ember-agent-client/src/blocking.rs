//! One exchange from a sync thread (the runtime crate: launch, restore and
//! checkpoint run in `spawn_blocking` or on plain threads).
//!
//! The exchange runs on one small tokio runtime of this crate's own (one
//! worker thread, started on first use) and the caller waits on a std
//! channel: `block_on` would panic on a thread that is already inside a
//! runtime, and a sync caller cannot know whether it is. A runtime (or a
//! thread) per call cost ~0.3 ms a ping; this costs a thread hop.
use crate::{AgentClient, AgentError, Reply};
use hyper::Method;
use std::future::Future;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

/// `GET /ping` within `timeout`; any 2xx is ready.
pub fn ping(socket: &Path, timeout: Duration) -> Result<(), AgentError> {
    let client = AgentClient::new(socket).with_timeout(timeout);
    run(socket, async move { client.ping().await })
}

/// A bodiless `POST path` within `timeout`, and its reply whatever its status.
pub fn post(socket: &Path, path: &str, timeout: Duration) -> Result<Reply, AgentError> {
    let client = AgentClient::new(socket).with_timeout(timeout);
    let path = path.to_string();
    run(socket, async move { client.request(Method::POST, &path, None).await })
}

/// The runtime the blocking exchanges run on, or why it could not start.
fn io_runtime() -> Result<&'static tokio::runtime::Runtime, String> {
    static RT: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    let rt = RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ember-agent-io")
            .enable_all()
            .build()
            .map_err(|e| e.to_string())
    });
    rt.as_ref().map_err(Clone::clone)
}

fn run<T: Send + 'static>(
    socket: &Path,
    exchange: impl Future<Output = Result<T, AgentError>> + Send + 'static,
) -> Result<T, AgentError> {
    let runtime_err =
        |message: String| AgentError::Runtime { path: socket.to_path_buf(), source: std::io::Error::other(message) };
    let rt = io_runtime().map_err(runtime_err)?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(exchange.await);
    });
    rx.recv().unwrap_or_else(|_| Err(runtime_err("the exchange's task ended without an answer".into())))
}
