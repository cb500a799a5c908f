//! One exchange from a sync thread (the runtime crate: launch, restore and
//! checkpoint run in `spawn_blocking` or on plain threads).
//!
//! The exchange runs on a current-thread tokio runtime of its own, built on a
//! short-lived scoped thread: `block_on` would panic on a thread that is
//! already inside a runtime, and a sync caller cannot know whether it is.
use crate::{AgentClient, AgentError, Reply};
use hyper::Method;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

/// `GET /ping` within `timeout`; any 2xx is ready.
pub fn ping(socket: &Path, timeout: Duration) -> Result<(), AgentError> {
    let client = AgentClient::new(socket).with_timeout(timeout);
    run(socket, client.ping())
}

/// A bodiless `POST path` within `timeout`, and its reply whatever its status.
pub fn post(socket: &Path, path: &str, timeout: Duration) -> Result<Reply, AgentError> {
    let client = AgentClient::new(socket).with_timeout(timeout);
    run(socket, client.request(Method::POST, path, None))
}

fn run<T: Send>(socket: &Path, exchange: impl Future<Output = Result<T, AgentError>> + Send) -> Result<T, AgentError> {
    let runtime_err = |source| AgentError::Runtime { path: socket.to_path_buf(), source };
    std::thread::scope(|s| {
        let thread = s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(runtime_err)?;
            rt.block_on(exchange)
        });
        thread.join().unwrap_or_else(|_| Err(runtime_err(std::io::Error::other("the exchange's thread panicked"))))
    })
}
