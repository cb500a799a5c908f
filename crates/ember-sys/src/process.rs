//! Process control for the in-sandbox agent: reaping, signalling, the child
//! subreaper bit, credentials of spawned commands and inherited fds.
//!
//! The agent is `#![forbid(unsafe_code)]`; every libc call it needs is here,
//! behind a safe function whose contract makes the call sound.
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

pub use libc::{SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM};

/// How a reaped child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    /// Returned from main or called exit with this code.
    Exited(i32),
    /// Terminated by this signal.
    Signaled(i32),
}

impl ExitKind {
    /// The shell convention: the exit code, or 128 + the signal number.
    pub fn code(self) -> i32 {
        match self {
            ExitKind::Exited(c) => c,
            ExitKind::Signaled(s) => 128 + s,
        }
    }

    fn from_raw(status: libc::c_int) -> Self {
        if libc::WIFSIGNALED(status) {
            ExitKind::Signaled(libc::WTERMSIG(status))
        } else {
            ExitKind::Exited(libc::WEXITSTATUS(status))
        }
    }
}

/// The result of one non-blocking `waitpid(-1)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reaped {
    /// A child ended and is now fully reaped.
    Child { pid: i32, exit: ExitKind },
    /// Children exist but none has ended yet.
    NoneReady,
    /// This process has no children at all (`ECHILD`).
    NoChildren,
}

/// Reaps one ended child of this process, if any, without blocking.
///
/// Only one owner in the process may call this (the agent's reaper), since it
/// takes the status that any other `wait` would have wanted.
pub fn reap_any() -> io::Result<Reaped> {
    let mut status: libc::c_int = 0;
    // SAFETY: `status` is a valid, writable c_int for the duration of the call;
    // waitpid with WNOHANG does not retain the pointer.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    match pid {
        0 => Ok(Reaped::NoneReady),
        p if p > 0 => Ok(Reaped::Child { pid: p, exit: ExitKind::from_raw(status) }),
        _ => {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ECHILD) {
                Ok(Reaped::NoChildren)
            } else {
                Err(err)
            }
        }
    }
}

/// Sends `sig` to one process. `pid` must be positive: the group and
/// broadcast forms of kill(2) have their own functions so they cannot be hit
/// by accident with a zero or negative id.
pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    if pid <= 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "kill: pid must be positive"));
    }
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    cvt(unsafe { libc::kill(pid, sig) })
}

/// Sends `sig` to every process of the process group `pgid` (> 1).
pub fn killpg(pgid: i32, sig: i32) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "killpg: pgid must be > 1"));
    }
    // SAFETY: killpg(2) takes plain integers and touches no memory of ours.
    cvt(unsafe { libc::killpg(pgid, sig) })
}

/// Sends `sig` to every process this one may signal, except itself.
///
/// Refuses unless this process is PID 1, where "every process" means the
/// processes of its own pid namespace; on a host it would mean the whole
/// machine.
pub fn kill_all(sig: i32) -> io::Result<()> {
    if std::process::id() != 1 {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, "kill(-1) only as PID 1"));
    }
    // SAFETY: kill(2) takes plain integers; we are PID 1 of a pid namespace,
    // so -1 reaches only that namespace.
    match cvt(unsafe { libc::kill(-1, sig) }) {
        // ESRCH: nobody else is left, which is what we wanted.
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
        r => r,
    }
}

/// Makes this process adopt orphaned descendants (PR_SET_CHILD_SUBREAPER), so
/// that when it is not PID 1 it still reaps what its commands leave behind.
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes integers only.
    cvt(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) })
}

/// The real uid of this process.
/// Marks this process non-dumpable: no process without CAP_SYS_PTRACE (none in a
/// sandbox has it) can ptrace it or read its memory, even one running as the
/// same uid. The agent calls this so a command running as root inside cannot
/// stop or inject into PID 1. Children get the flag reset by `execve`.
pub fn set_non_dumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub fn getuid() -> u32 {
    // SAFETY: getuid(2) cannot fail and touches no memory.
    unsafe { libc::getuid() }
}

/// The real gid of this process.
pub fn getgid() -> u32 {
    // SAFETY: getgid(2) cannot fail and touches no memory.
    unsafe { libc::getgid() }
}

/// Clock ticks per second, the unit of the times in `/proc/<pid>/stat`.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf takes an integer name and touches no memory.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Takes ownership of a file descriptor inherited from the parent (the
/// runtime passes the listening socket this way) and marks it close-on-exec
/// so commands do not inherit it.
///
/// Fails if `fd` is not open. The caller must not call this twice for the
/// same fd, nor use the number otherwise: the returned `OwnedFd` closes it.
pub fn take_inherited_fd(fd: i32) -> io::Result<OwnedFd> {
    if fd < 3 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "inherited fd must be >= 3"));
    }
    // SAFETY: fcntl(F_GETFD/F_SETFD) on an integer fd touches no memory of
    // ours; an invalid fd yields EBADF, which we report.
    let flags = cvt_int(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) })?;
    // SAFETY: the fd is open (F_GETFD succeeded) and, by the contract above,
    // nothing else in this process owns it, so the OwnedFd is its only owner.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes `fd` descriptor `target` of the command's process, open across its
/// exec: the inverse of [`take_inherited_fd`], for handing a listening socket
/// to a program that passes it on (`crun create --preserve-fds 1` gives fds
/// 3.. to the container's init, as ember's native class gives its agent fd 3).
/// `fd` stays open in this process until `cmd` is dropped. `target` must be
/// >= 3: stdio is configured through `Command` itself.
pub fn pass_fd(cmd: &mut Command, fd: OwnedFd, target: i32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if target < 3 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "target fd must be >= 3"));
    }
    let hook = move || -> io::Result<()> {
        let raw = fd.as_raw_fd();
        if raw == target {
            // dup2 onto itself would keep close-on-exec: clear it instead.
            // SAFETY: fcntl on an fd this closure owns; no memory is touched.
            let flags = cvt_int(unsafe { libc::fcntl(raw, libc::F_GETFD) })?;
            // SAFETY: as above.
            return cvt(unsafe { libc::fcntl(raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC) });
        }
        // SAFETY: dup2 between integer fds (the new one has no close-on-exec);
        // async-signal-safe, no allocation, nothing of ours is aliased.
        cvt_int(unsafe { libc::dup2(raw, target) }).map(|_| ())
    };
    // SAFETY: the hook runs between fork and exec and only makes raw syscalls
    // on an fd captured before the fork.
    unsafe {
        cmd.pre_exec(hook);
    }
    Ok(())
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit, and returns
/// it: a shell's soft limit is often 1,024, a few hundred sandboxes' worth to
/// the daemon, while the hard one allows what it was given. (Sandboxes do
/// not inherit it: each gets its own, `LaunchPlan::open_files`.)
pub fn raise_open_files() -> io::Result<u64> {
    let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into a live, properly aligned struct.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut cur) })?;
    if cur.rlim_cur < cur.rlim_max {
        let new = libc::rlimit { rlim_cur: cur.rlim_max, rlim_max: cur.rlim_max };
        // SAFETY: setrlimit reads a live struct; raising the soft limit up to
        // the hard one needs no capability.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) })?;
    }
    Ok(cur.rlim_max)
}

/// This process's hard `RLIMIT_NOFILE`.
pub fn open_files_hard_limit() -> io::Result<u64> {
    let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into a live, properly aligned struct.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut cur) })?;
    Ok(cur.rlim_max)
}

/// Lowers the command's `RLIMIT_NOFILE` to at most `n` (soft and hard)
/// before it runs, so its children inherit the limit. Lowering a limit needs
/// no capability, unlike runc 1.1's prlimit of a container's init from the
/// host side, which needs CAP_SYS_RESOURCE over the init's user namespace.
pub fn limit_open_files(cmd: &mut Command, n: u64) -> io::Result<()> {
    let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into a live, properly aligned struct.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut cur) })?;
    let max = cur.rlim_max.min(n as libc::rlim_t);
    let new = libc::rlimit { rlim_cur: max, rlim_max: max };
    let hook = move || -> io::Result<()> {
        // SAFETY: setrlimit reads a struct copied into the closure before the
        // fork; async-signal-safe, no allocation.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) })
    };
    // SAFETY: the hook runs between fork and exec and only makes one raw
    // syscall on memory captured before the fork.
    unsafe {
        cmd.pre_exec(hook);
    }
    Ok(())
}

/// The identity a command runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups. Left unchanged if the kernel refuses
    /// setgroups (a user namespace with `setgroups` denied).
    pub groups: Vec<u32>,
}

/// Configures `cmd` to switch to `creds` and then change to `cwd` in the
/// child, in that order, so the directory is entered with the command's own
/// permissions. Errors (EPERM, ENOENT...) surface from `Command::spawn`.
pub fn set_credentials(cmd: &mut Command, creds: Credentials, cwd: PathBuf) {
    use std::os::unix::ffi::OsStrExt;
    // Allocated here, before fork: the child may not allocate.
    let cwd = std::ffi::CString::new(cwd.as_os_str().as_bytes()).unwrap_or_else(|_| c"/".to_owned());
    let groups: Vec<libc::gid_t> = creds.groups.clone();
    let hook = move || -> io::Result<()> {
        // SAFETY: raw syscalls only (async-signal-safe, no allocation): the
        // child of fork has one thread, so the per-thread credential change
        // of the raw syscall is the whole process's; `groups` outlives the call.
        unsafe {
            let r = libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
            if r != 0 {
                let err = io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EPERM) {
                    return Err(err);
                }
            }
            cvt_long(libc::syscall(libc::SYS_setgid, creds.gid as libc::c_long))?;
            cvt_long(libc::syscall(libc::SYS_setuid, creds.uid as libc::c_long))?;
            cvt(libc::chdir(cwd.as_ptr()))
        }
    };
    // SAFETY: the hook runs between fork and exec and only makes raw
    // syscalls on memory captured before the fork (see above).
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// The calling thread's filesystem identity (fsuid, fsgid, supplementary
/// groups), switched by [`ThreadFsIdentity::enter`] and restored on drop.
///
/// Per thread: raw syscalls, not glibc's wrappers (glibc's setgroups is
/// broadcast to every thread of the process). While fsuid is not 0 the kernel
/// drops the thread's effective file capabilities (DAC override, chown,
/// fowner...), so file operations are checked exactly as for that user; going
/// back to fsuid 0 gives them back. Meant for a blocking worker thread that
/// runs one file operation and then drops the guard.
pub struct ThreadFsIdentity {
    uid: u32,
    gid: u32,
    groups: Vec<libc::gid_t>,
}

impl ThreadFsIdentity {
    pub fn enter(uid: u32, gid: u32, groups: &[u32]) -> io::Result<ThreadFsIdentity> {
        let mut prev = vec![0 as libc::gid_t; 256];
        // SAFETY: `prev` has room for 256 entries and its length is passed.
        let n = unsafe { libc::syscall(libc::SYS_getgroups, prev.len() as libc::c_long, prev.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        prev.truncate(n as usize);
        // SAFETY: raw per-thread credential syscalls on plain integers; `groups`
        // lives across the call. setfsuid/setfsgid return the previous value
        // and cannot fail in a way that leaves memory unsafe.
        let (old_uid, old_gid) = unsafe {
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0 {
                let err = io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EPERM) {
                    return Err(err);
                }
            }
            let g = libc::syscall(libc::SYS_setfsgid, gid as libc::c_long) as u32;
            let u = libc::syscall(libc::SYS_setfsuid, uid as libc::c_long) as u32;
            (u, g)
        };
        let guard = ThreadFsIdentity { uid: old_uid, gid: old_gid, groups: prev };
        // setfsuid reports no error: read the value back to know it took.
        // SAFETY: as above; -1 (as u32::MAX) only queries.
        let now = unsafe { libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long) as u32 };
        if now != uid {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("setfsuid({uid}) did not take")));
        }
        Ok(guard)
    }
}

impl Drop for ThreadFsIdentity {
    fn drop(&mut self) {
        // SAFETY: the same raw per-thread syscalls, in reverse order: fsuid
        // first so the capabilities needed for setgroups come back.
        unsafe {
            libc::syscall(libc::SYS_setfsuid, self.uid as libc::c_long);
            libc::syscall(libc::SYS_setfsgid, self.gid as libc::c_long);
            libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr());
        }
    }
}

fn cvt(r: libc::c_int) -> io::Result<()> {
    cvt_int(r).map(|_| ())
}

fn cvt_int(r: libc::c_int) -> io::Result<libc::c_int> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_long(r: libc::c_long) -> io::Result<()> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The passed socket is fd 3 of the exec'd program (a shell reads the link).
    #[test]
    fn pass_fd_gives_the_command_the_socket_as_fd_3() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let path = std::env::temp_dir().join(format!("ember-pass-fd-{}", std::process::id()));
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let ino = std::fs::metadata(format!("/proc/self/fd/{}", l.as_raw_fd())).unwrap().ino();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "readlink /proc/self/fd/3"]);
        pass_fd(&mut cmd, OwnedFd::from(l), 3).unwrap();
        let out = cmd.output().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("socket:[{ino}]"));
    }

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(ExitKind::Exited(3).code(), 3);
        assert_eq!(ExitKind::Signaled(9).code(), 137);
    }

    #[test]
    fn guards_reject_broadcast_and_group_forms() {
        assert!(kill(0, 0).is_err());
        assert!(kill(-1, 0).is_err());
        assert!(killpg(1, 0).is_err());
        if std::process::id() != 1 {
            assert!(kill_all(0).is_err());
        }
    }

    #[test]
    fn take_inherited_fd_rejects_closed_fds() {
        assert!(take_inherited_fd(1_000_000).is_err());
        assert!(take_inherited_fd(1).is_err());
    }
}
