//! The readiness probe: one `GET /ping` over the agent's unix socket.
//!
//! Hand-written on purpose: it is one request on the create path, and the
//! runtime stays free of an HTTP stack. The reply is untrusted; only the status
//! line is read.
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Sends `GET /ping` and waits for a 2xx status line. The daemon created the
/// listening socket before the agent started, so `connect` succeeds at once and
/// the request waits in the backlog until the agent begins to serve.
pub fn ping_agent(socket: &Path, timeout: Duration) -> Result<(), String> {
    let mut s = UnixStream::connect(socket).map_err(|e| format!("connect {}: {e}", socket.display()))?;
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    s.write_all(b"GET /ping HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        let r = s.read(&mut buf[n..]).map_err(|e| format!("read: {e}"))?;
        if r == 0 {
            break;
        }
        n += r;
    }
    let head = String::from_utf8_lossy(&buf[..n]);
    match head.split_whitespace().nth(1) {
        Some(code) if code.starts_with('2') => Ok(()),
        _ => Err(format!("unexpected reply {head:?}")),
    }
}
