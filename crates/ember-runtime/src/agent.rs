//! The readiness probe: one `GET /ping` over the agent's unix socket.
//!
//! Hand-written on purpose: it is one request on the create path, and the
//! runtime stays free of an HTTP stack. The reply is untrusted; only the status
//! line is read.
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `O_PATH` and `O_NOFOLLOW` (x86-64 / aarch64 values; this crate has no libc).
const O_PATH: i32 = 0o10_000_000;
const O_NOFOLLOW: i32 = 0o400_000;

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

/// Sends `GET /ping` and waits for a 2xx status line. The daemon created the
/// listening socket before the agent started, so `connect` succeeds at once and
/// the request waits in the backlog until the agent begins to serve.
pub fn ping_agent(socket: &Path, timeout: Duration) -> Result<(), String> {
    match request(socket, "GET /ping", timeout)? {
        (code, _) if (200..300).contains(&code) => Ok(()),
        (code, body) => Err(format!("unexpected reply {code}: {body}")),
    }
}

/// Sends a bodiless `POST path` and returns the status and up to 4 KiB of the
/// reply (headers included: only for error messages).
pub fn post_agent(socket: &Path, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    request(socket, &format!("POST {path}"), timeout)
}

/// One request with `Connection: close`, read to the end (at most 4 KiB).
fn request(socket: &Path, line: &str, timeout: Duration) -> Result<(u16, String), String> {
    let connect = || {
        let (_pin, path) = pin_agent_socket(socket)?;
        UnixStream::connect(path)
    };
    let mut s = connect().map_err(|e| format!("connect {}: {e}", socket.display()))?;
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let req = format!("{line} HTTP/1.1\r\nHost: agent\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    s.take(4096).read_to_end(&mut buf).map_err(|e| format!("read: {e}"))?;
    let reply = String::from_utf8_lossy(&buf).into_owned();
    match reply.split_whitespace().nth(1).and_then(|c| c.parse().ok()) {
        Some(code) => Ok((code, reply)),
        None => Err(format!("unexpected reply {reply:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

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
}
