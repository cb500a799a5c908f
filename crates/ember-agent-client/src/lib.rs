//! The daemon's one HTTP client of the in-sandbox agent (`ember-agent`).
//!
//! Everything the engine and the runtime ask an agent goes through here: the
//! readiness ping, the pool claim, the gVisor quiesce, a task's streamed
//! `POST /command`. The agent runs inside the sandbox, and on an OCI class
//! root inside can replace its socket with a server of its own, so every reply
//! is untrusted:
//!
//! - the socket is pinned `O_PATH | O_NOFOLLOW` and checked to be a socket
//!   before the connect ([`pin_agent_socket`]);
//! - hyper parses the reply with its read buffer capped at [`MAX_HEAD`], so a
//!   larger head fails;
//! - a plain reply body is read up to [`MAX_BODY`], a streamed event line up
//!   to [`MAX_FRAME`];
//! - every exchange has a deadline, so a peer that trickles bytes (a slow
//!   loris) ends too, and the connection task dies with the exchange.
//!
//! Every failure is an [`AgentError`] naming the socket and the cap or step
//! that failed. Async (tokio); [`blocking`] wraps it for the sync runtime.
//!
//! Layout: `lib.rs` (caps, errors, connect, request/reply), `stream.rs` (the
//! execd event stream), `blocking.rs` (one exchange from a sync thread).
#![forbid(unsafe_code)]

pub mod blocking;
mod stream;

pub use stream::CommandEnd;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::UnixStream;

/// The largest reply head (status line and headers) read from an agent:
/// hyper's read buffer, so a head that does not fit fails the exchange.
pub const MAX_HEAD: usize = 16 << 10;
/// The largest plain reply body read from an agent (ping, claim, quiesce and
/// error replies are a few hundred bytes).
pub const MAX_BODY: usize = 64 << 10;
/// The largest event line of an execd stream. The agent splits a command's
/// output into events of at most a few KiB; a line with no end is a peer that
/// is not our agent.
pub const MAX_FRAME: usize = 1 << 20;
/// The default deadline of one request/reply exchange, and of a stream's head.
pub const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// `O_PATH` and `O_NOFOLLOW` (x86-64 / aarch64 values; this crate has no libc).
const O_PATH: i32 = 0o10_000_000;
const O_NOFOLLOW: i32 = 0o400_000;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("agent socket {path}: connect")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("agent socket {path}: {step}")]
    Http {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: hyper::Error,
    },
    #[error("agent socket {path}: the reply head exceeds the {MAX_HEAD}-byte cap")]
    HeadTooLarge { path: PathBuf },
    #[error("agent socket {path}: the reply body exceeds the {MAX_BODY}-byte cap")]
    BodyTooLarge { path: PathBuf },
    #[error("agent socket {path}: an event line exceeds the {MAX_FRAME}-byte cap")]
    FrameTooLarge { path: PathBuf },
    #[error("agent socket {path}: malformed event")]
    BadEvent {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("agent socket {path}: no complete {step} within {timeout:?}")]
    Timeout { path: PathBuf, step: &'static str, timeout: Duration },
    #[error("agent socket {path}: answered {status}: {message}")]
    Status { path: PathBuf, status: u16, message: String },
    #[error("agent socket {path}: the request cannot be encoded")]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("agent socket {path}: bad request")]
    Request {
        path: PathBuf,
        #[source]
        source: hyper::http::Error,
    },
    #[error("agent socket {path}: no runtime for a blocking exchange")]
    Runtime {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl AgentError {
    /// The error and its sources on one line, for reasons and logs that keep
    /// only a string (a task's failure reason, a sandbox's termination reason).
    pub fn report(&self) -> String {
        let mut s = self.to_string();
        let mut cur = std::error::Error::source(self);
        while let Some(c) = cur {
            s.push_str(": ");
            s.push_str(&c.to_string());
            cur = c.source();
        }
        s
    }
}

/// The agent's socket, pinned without following a symlink in its last
/// component, and the `/proc/self/fd/N` path to `connect` to it through.
///
/// OCI classes bind the socket's host dir into the sandbox (an OCI runtime
/// cannot pass a listening fd), so root inside can replace `agent.sock` with a
/// symlink to any other socket on the host, another sandbox's agent included.
/// Connecting by path would follow it; connecting through an `O_PATH` fd of the
/// inode that was checked to be a socket cannot. Keep the fd alive until the
/// connect returns.
pub fn pin_agent_socket(socket: &Path) -> std::io::Result<(OwnedFd, PathBuf)> {
    let f = std::fs::OpenOptions::new().read(true).custom_flags(O_PATH | O_NOFOLLOW).open(socket)?;
    if !f.metadata()?.file_type().is_socket() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("{} is not a socket (replaced from inside the sandbox?)", socket.display()),
        ));
    }
    let fd = OwnedFd::from(f);
    let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
    Ok((fd, path))
}

/// Connects to an agent's socket through [`pin_agent_socket`]: every daemon →
/// agent connection goes through here (the API's proxy included).
pub async fn connect_agent(socket: &Path) -> std::io::Result<UnixStream> {
    let (_pin, path) = pin_agent_socket(socket)?;
    UnixStream::connect(path).await
}

/// A plain (non-streamed) reply: its status and at most [`MAX_BODY`] bytes.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
}

impl Reply {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The `message` of the agent's JSON error reply, or the body as text
    /// (at most 512 bytes of it: it goes into error messages).
    pub fn message(&self) -> String {
        let json = serde_json::from_slice::<serde_json::Value>(&self.body).ok();
        if let Some(m) = json.as_ref().and_then(|v| v.get("message")).and_then(|m| m.as_str()) {
            return m.to_string();
        }
        String::from_utf8_lossy(&self.body[..self.body.len().min(512)]).trim().to_string()
    }
}

/// Aborts the connection's task when the exchange is over (or dropped), so a
/// peer that never closes holds no task, buffer or fd.
struct ConnGuard(tokio::task::AbortHandle);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The client of one agent, by its socket on the host.
#[derive(Debug, Clone)]
pub struct AgentClient {
    socket: PathBuf,
    timeout: Duration,
}

impl AgentClient {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self { socket: socket.into(), timeout: EXCHANGE_TIMEOUT }
    }

    /// The deadline of one request/reply exchange, and of a stream's head.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `GET /ping`; any 2xx is ready.
    pub async fn ping(&self) -> Result<(), AgentError> {
        let reply = self.request(Method::GET, "/ping", None).await?;
        self.expect_success(reply).map(drop)
    }

    /// `POST path` with `body` as JSON; the reply, whatever its status.
    pub async fn post_json(&self, path: &str, body: &impl serde::Serialize) -> Result<Reply, AgentError> {
        let bytes = serde_json::to_vec(body).map_err(|source| self.err_encode(source))?;
        self.request(Method::POST, path, Some(bytes)).await
    }

    /// One request and its capped reply, within the client's deadline.
    pub async fn request(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> Result<Reply, AgentError> {
        let exchange = async {
            let (resp, _conn) = self.send(method, path, body).await?;
            let status = resp.status().as_u16();
            let body = self.read_body(resp.into_body()).await?;
            Ok(Reply { status, body })
        };
        tokio::time::timeout(self.timeout, exchange).await.map_err(|_| self.err_timeout("reply"))?
    }

    /// A 2xx reply, or [`AgentError::Status`] carrying the agent's message.
    pub fn expect_success(&self, reply: Reply) -> Result<Reply, AgentError> {
        if reply.is_success() {
            return Ok(reply);
        }
        Err(AgentError::Status { path: self.socket.clone(), status: reply.status, message: reply.message() })
    }

    /// Connects, sends, and returns the reply's head; the body streams from
    /// the returned guard's connection. No deadline here: callers set theirs.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(Response<Incoming>, ConnGuard), AgentError> {
        let stream = connect_agent(&self.socket)
            .await
            .map_err(|source| AgentError::Connect { path: self.socket.clone(), source })?;
        let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
            .max_buf_size(MAX_HEAD)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.err_http("handshake", e))?;
        let guard = ConnGuard(tokio::spawn(conn).abort_handle());
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "agent")
            .header(hyper::header::CONNECTION, "close");
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|source| AgentError::Request { path: self.socket.clone(), source })?;
        let resp = sender.send_request(req).await.map_err(|e| self.err_http("reply head", e))?;
        Ok((resp, guard))
    }

    /// The whole body, refused past [`MAX_BODY`].
    async fn read_body(&self, mut body: Incoming) -> Result<Bytes, AgentError> {
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.err_http("reply body", e))?;
            if let Ok(data) = frame.into_data() {
                if out.len() + data.len() > MAX_BODY {
                    return Err(AgentError::BodyTooLarge { path: self.socket.clone() });
                }
                out.extend_from_slice(&data);
            }
        }
        Ok(out.into())
    }

    fn err_http(&self, step: &'static str, source: hyper::Error) -> AgentError {
        if source.is_parse_too_large() {
            return AgentError::HeadTooLarge { path: self.socket.clone() };
        }
        AgentError::Http { path: self.socket.clone(), step, source }
    }

    fn err_timeout(&self, step: &'static str) -> AgentError {
        AgentError::Timeout { path: self.socket.clone(), step, timeout: self.timeout }
    }

    fn err_encode(&self, source: serde_json::Error) -> AgentError {
        AgentError::Encode { path: self.socket.clone(), source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    #[test]
    fn a_socket_is_pinned_and_a_symlink_in_its_place_is_refused() {
        let dir = std::env::temp_dir().join(format!("ember-pin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (real, link) = (dir.join("real.sock"), dir.join("agent.sock"));
        let _l = UnixListener::bind(&real).unwrap();
        let (_fd, path) = pin_agent_socket(&real).expect("a socket pins");
        UnixStream::connect(path).expect("connect through the pinned fd");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = pin_agent_socket(&link).expect_err("a symlink is not followed");
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        std::fs::write(dir.join("file"), b"x").unwrap();
        assert!(pin_agent_socket(&dir.join("file")).is_err(), "a regular file is not a socket");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_agents_error_message_is_taken_from_its_json_reply() {
        let json = Reply { status: 409, body: Bytes::from_static(b"{\"code\":\"CONFLICT\",\"message\":\"1 open\"}") };
        assert_eq!(json.message(), "1 open");
        assert_eq!(Reply { status: 500, body: Bytes::from_static(b"plain\n") }.message(), "plain");
    }
}
