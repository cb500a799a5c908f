//! Network namespaces entered from a thread of their own.
//!
//! `setns(CLONE_NEWNET)` moves only the calling thread, so ember never calls it
//! on a thread it keeps: each entry happens on a scoped thread that ends when
//! the work is done. Sockets keep the namespace they were created in, so a
//! socket made there can be used from any thread afterwards.
use crate::SysError;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

/// Moves the calling thread into the network namespace `fd`.
pub(crate) fn enter(fd: BorrowedFd<'_>) -> Result<(), SysError> {
    // SAFETY: setns on a descriptor the caller keeps open; it changes only
    // this thread's network namespace.
    if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(SysError::last("setns", format!("netns fd {}", fd.as_raw_fd())));
    }
    Ok(())
}

/// Opens a network namespace file (`/run/netns/NAME`, `/proc/PID/ns/net`).
pub fn open(path: &Path) -> Result<OwnedFd, SysError> {
    std::fs::File::open(path).map(OwnedFd::from).map_err(|e| SysError::new("open netns", path.display().to_string(), e))
}

/// Runs `f` on a short-lived thread inside the network namespace at `path`:
/// `/proc/sys/net` then shows that namespace's settings, and sockets `f`
/// creates belong to it.
pub fn run_in<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> Result<T, SysError> {
    let fd = open(path)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(fd.as_fd())?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| {
            Err(SysError::new("netns thread", path.display().to_string(), std::io::Error::other("panicked")))
        })
    })
}
