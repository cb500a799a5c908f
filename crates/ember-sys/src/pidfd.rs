//! pidfds: handles on processes that cannot be confused by pid reuse.
use crate::SysError;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Opens a pidfd for `pid` (used to re-adopt sandboxes after a daemon restart).
pub fn pidfd_open(pid: i32) -> Result<OwnedFd, SysError> {
    // SAFETY: pidfd_open takes two integers; a non-negative result is a new fd.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, libc::PIDFD_NONBLOCK) };
    if fd < 0 {
        return Err(SysError::last("pidfd_open", pid.to_string()));
    }
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends `sig` to the process behind `pidfd`. A process that already exited is not
/// an error (ESRCH is swallowed): the caller wanted it gone.
pub fn pidfd_signal(pidfd: &OwnedFd, sig: i32) -> Result<(), SysError> {
    // SAFETY: a null siginfo is allowed; the fd is borrowed for the call only.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), sig, std::ptr::null::<u8>(), 0) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(SysError::new("pidfd_send_signal", sig.to_string(), e));
        }
    }
    Ok(())
}

/// How a reaped child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
    /// Not our child (re-adopted after a restart): it is gone, the status is not ours to read.
    Unknown,
}

/// Reaps the child behind `pidfd` without blocking. `Ok(None)` while it runs.
pub fn pidfd_try_wait(pidfd: &OwnedFd) -> Result<Option<ExitStatus>, SysError> {
    // SAFETY: siginfo_t is plain data; zeroed is a valid initial value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: info points to a live siginfo_t; P_PIDFD takes the fd as the id.
    let r = unsafe {
        libc::waitid(libc::P_PIDFD, pidfd.as_raw_fd() as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG)
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ECHILD) {
            return Ok(if is_alive(pidfd) { None } else { Some(ExitStatus::Unknown) });
        }
        return Err(SysError::new("waitid", "pidfd", e));
    }
    // SAFETY: waitid filled info; si_pid/si_status are valid for CLD_* codes.
    let (pid, status, code) = unsafe { (info.si_pid(), info.si_status(), info.si_code) };
    if pid == 0 {
        return Ok(None);
    }
    Ok(Some(if code == libc::CLD_EXITED { ExitStatus::Code(status) } else { ExitStatus::Signal(status) }))
}

/// Waits up to `timeout` for the process behind `pidfd` to exit, without
/// reaping it (a pidfd polls readable once its process is a zombie or gone), so
/// the exit status stays for whoever reaps it later.
pub fn wait_exited(pidfd: &OwnedFd, timeout: std::time::Duration) -> Result<bool, SysError> {
    let mut pfd = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    loop {
        // SAFETY: pfd is one live pollfd and nfds says one; the fd is borrowed for the call.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r >= 0 {
            return Ok(r > 0);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(SysError::new("poll", "pidfd", e));
        }
    }
}

/// The pid behind a pidfd (`Pid:` in its fdinfo); `None` once the process
/// has been reaped (the kernel then reports -1).
pub fn pid_of(pidfd: &OwnedFd) -> Option<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    info.lines().find_map(|l| l.strip_prefix("Pid:")).and_then(|p| p.trim().parse().ok()).filter(|p| *p > 0)
}

/// Whether the process behind the pidfd still exists (signal 0 probe).
pub fn is_alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: signal 0 only checks existence; null siginfo is allowed.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), 0, std::ptr::null::<u8>(), 0) };
    r == 0
}

/// Sends a signal to a plain pid (for processes found in a cgroup's procs list).
pub fn kill(pid: i32, sig: i32) -> Result<(), SysError> {
    // SAFETY: kill takes two integers.
    if unsafe { libc::kill(pid, sig) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            return Err(SysError::new("kill", pid.to_string(), e));
        }
    }
    Ok(())
}
