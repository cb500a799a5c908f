//! eventfd and small descriptor helpers.
use crate::SysError;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// A non-blocking, close-on-exec eventfd (used for cgroup v1 OOM notifications).
pub fn eventfd() -> Result<OwnedFd, SysError> {
    // SAFETY: eventfd takes no pointers; a non-negative return is a fresh fd we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(SysError::last("eventfd", ""));
    }
    // SAFETY: fd was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads an eventfd counter; `Ok(None)` when it would block.
pub fn eventfd_read(fd: &OwnedFd) -> Result<Option<u64>, SysError> {
    let mut v: u64 = 0;
    // SAFETY: we pass a pointer to a live u64 and its exact size.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    if n == 8 {
        return Ok(Some(v));
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::WouldBlock {
        Ok(None)
    } else {
        Err(SysError::new("read eventfd", "", e))
    }
}

/// Duplicates `fd` to a number >= `min`, close-on-exec.
pub(crate) fn dup_above(fd: RawFd, min: RawFd) -> Result<OwnedFd, SysError> {
    // SAFETY: F_DUPFD_CLOEXEC takes an integer argument and returns a new fd we own.
    let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) };
    if n < 0 {
        return Err(SysError::last("dup", fd.to_string()));
    }
    // SAFETY: n is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// A close-on-exec pipe: (read end, write end).
pub(crate) fn pipe() -> Result<(OwnedFd, OwnedFd), SysError> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a 2-element array as pipe2 requires.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(SysError::last("pipe2", ""));
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A new inotify instance, non-blocking and close-on-exec.
pub fn inotify() -> Result<OwnedFd, SysError> {
    // SAFETY: inotify_init1 takes flags only; a non-negative result is a new fd.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(SysError::last("inotify_init1", ""));
    }
    // SAFETY: fd is fresh and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds a watch for modification of `path` to the inotify instance `fd`
/// (cgroup v2 posts OOM kills by modifying `memory.events`).
pub fn inotify_watch_modify(fd: BorrowedFd<'_>, path: &str) -> Result<(), SysError> {
    let c = std::ffi::CString::new(path)
        .map_err(|_| SysError::new("inotify_add_watch", path, std::io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: c is a valid NUL-terminated path for the duration of the call;
    // fd is borrowed, so open for it.
    if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), libc::IN_MODIFY) } < 0 {
        return Err(SysError::last("inotify_add_watch", path));
    }
    Ok(())
}

/// Drains whatever is readable from a non-blocking descriptor (inotify events).
pub fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 512];
    // SAFETY: reads into a live stack buffer of the given size.
    while unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}
