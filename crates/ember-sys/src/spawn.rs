//! Starting a process in fresh namespaces: clone3, the parent/child handshake and
//! the error channel.
//!
//! The protocol, in steps:
//! 1. The parent prepares everything the child will need (C strings, pointer
//!    arrays, BPF programs), because the child runs in a copy of a multi-threaded
//!    process and must not allocate (another thread may have held the allocator
//!    lock at clone time).
//! 2. `clone3` with new user, mount, pid, uts, ipc and net namespaces and a pidfd.
//! 3. The child blocks on the sync pipe; the parent writes the uid/gid maps and
//!    runs the caller's setup (cgroup attach), then releases the child.
//! 4. The child assembles the rootfs, pivots, drops privileges, loads seccomp and
//!    execs the agent. A failure is reported as `(step, errno)` on the error pipe;
//!    the pipe is close-on-exec, so EOF tells the parent the exec succeeded.
use crate::fd::{dup_above, pipe};
use crate::pidfd::{pidfd_signal, pidfd_try_wait};
use crate::SysError;
use seccompiler::BpfProgram;
use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A filesystem operation run by the child before `pivot_root`, in its own mount
/// namespace, with paths as seen from the host's root.
#[derive(Debug, Clone)]
pub enum FsOp {
    Mount {
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: u64,
        data: Option<CString>,
    },
    /// Recursive bind, then read-only, nosuid and nodev on the whole subtree.
    BindReadOnly {
        source: CString,
        target: CString,
    },
    /// Plain bind (device nodes that cannot be created inside a user namespace).
    Bind {
        source: CString,
        target: CString,
    },
    Mkdir {
        path: CString,
        mode: u32,
    },
    Symlink {
        target: CString,
        link: CString,
    },
    WriteFile {
        path: CString,
        contents: Vec<u8>,
        mode: u32,
    },
    Chown {
        path: CString,
        uid: u32,
        gid: u32,
    },
    /// Moves a detached mount (an fd from [`crate::idmap::idmapped_tree`], kept
    /// open by the parent until the spawn returns) onto `target`.
    Attach {
        tree: RawFd,
        target: CString,
    },
}

/// Everything the child needs, computed before clone.
pub struct LaunchPlan {
    pub hostname: CString,
    pub fs_ops: Vec<FsOp>,
    pub new_root: CString,
    /// Bitmask of capabilities kept in the bounding set.
    pub keep_caps: u64,
    pub seccomp: Vec<BpfProgram>,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    /// `/proc/<pid>/uid_map` content, e.g. "0 1000000000 65536\n".
    pub uid_map: String,
    pub gid_map: String,
    /// The host uid that owns the new user namespace (the euid of the clone).
    /// Per-uid kernel counts of everything inside (inotify instances, user
    /// namespaces, ...) are charged to it in the host's user namespace: the
    /// sandbox's own range base, never host root, which they would exhaust.
    pub ns_owner: u32,
    /// How long the child may take from release to exec.
    pub exec_timeout: Duration,
}

/// Descriptors handed to the child: the agent binary (exec'd by fd, so nothing of
/// it needs to be in the sandbox's tree), its listening socket (becomes fd 3) and
/// the log file (becomes stdout and stderr).
pub struct LaunchFds<'a> {
    pub exe: BorrowedFd<'a>,
    pub listen: BorrowedFd<'a>,
    pub log: BorrowedFd<'a>,
}

/// A started sandbox init process.
#[derive(Debug)]
pub struct Spawned {
    pub pid: i32,
    pub pidfd: OwnedFd,
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error(transparent)]
    Sys(#[from] SysError),
    #[error("sandbox setup failed at step '{step}': {source}")]
    Child { step: &'static str, source: std::io::Error },
    #[error("parent-side setup of pid {pid} failed: {message}")]
    ParentSetup { pid: i32, message: String },
    #[error("sandbox init did not exec within {0:?}")]
    Timeout(Duration),
}

/// Descriptor numbers the child uses; all are >= 10 so the dup2s onto 0-3 cannot
/// clobber them.
pub(crate) struct ChildFds {
    pub sync_r: RawFd,
    pub sync_w: RawFd,
    pub err_r: RawFd,
    pub err_w: RawFd,
    pub exe: RawFd,
    pub listen: RawFd,
    pub log: RawFd,
}

/// Pointer arrays built in the parent so the child never allocates.
pub(crate) struct ExecArgs {
    pub argv: Vec<*const libc::c_char>,
    pub envp: Vec<*const libc::c_char>,
    pub cap_last: u32,
    /// False when the child joins a prepared network namespace: `lo` is up
    /// already, and the child has no CAP_NET_ADMIN over a namespace its user
    /// namespace does not own.
    pub lo_up: bool,
}

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const NS_FLAGS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWNET) as u64;

/// Starts the sandbox init. `parent_setup` runs once the child exists and before it
/// continues (attach it to its cgroups there).
pub fn spawn_sandbox(
    plan: &LaunchPlan,
    fds: LaunchFds<'_>,
    parent_setup: impl FnOnce(i32) -> Result<(), String>,
) -> Result<Spawned, SpawnError> {
    spawn_inner(plan, fds, parent_setup, NS_FLAGS)
}

/// Like [`spawn_sandbox`], but the sandbox joins the network namespace `netns`
/// (a pre-created network slot) instead of getting a fresh one.
///
/// A process can only enter a network namespace with CAP_SYS_ADMIN over the
/// user namespace that owns it, which the child loses the moment it enters its
/// new user namespace. So the parent enters first: a short-lived thread calls
/// `setns(netns)` (which changes only that thread) and runs the clone from
/// there, without CLONE_NEWNET, so the child inherits the slot's namespace. The
/// thread then exits and the daemon's other threads never leave the host's
/// namespace. The child is reparented to another thread of this process; its
/// pidfd and wait status are the process's, as before.
pub fn spawn_sandbox_in_netns(
    netns: BorrowedFd<'_>,
    plan: &LaunchPlan,
    fds: LaunchFds<'_>,
    parent_setup: impl FnOnce(i32) -> Result<(), String> + Send,
) -> Result<Spawned, SpawnError> {
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            crate::netns::enter(netns)?;
            spawn_inner(plan, fds, parent_setup, NS_FLAGS & !(libc::CLONE_NEWNET as u64))
        });
        t.join().unwrap_or_else(|_| {
            Err(SysError::new("spawn thread", "sandbox init", std::io::Error::other("the spawn thread panicked"))
                .into())
        })
    })
}

fn spawn_inner(
    plan: &LaunchPlan,
    fds: LaunchFds<'_>,
    parent_setup: impl FnOnce(i32) -> Result<(), String>,
    ns_flags: u64,
) -> Result<Spawned, SpawnError> {
    let (sync_r, sync_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let keep = [
        dup_above(sync_r.as_raw_fd(), 10)?,
        dup_above(sync_w.as_raw_fd(), 10)?,
        dup_above(err_r.as_raw_fd(), 10)?,
        dup_above(err_w.as_raw_fd(), 10)?,
        dup_above(fds.exe.as_raw_fd(), 10)?,
        dup_above(fds.listen.as_raw_fd(), 10)?,
        dup_above(fds.log.as_raw_fd(), 10)?,
    ];
    drop((sync_r, sync_w, err_r, err_w));
    let [sync_r, sync_w, err_r, err_w, exe, listen, log] = keep;
    let cfds = ChildFds {
        sync_r: sync_r.as_raw_fd(),
        sync_w: sync_w.as_raw_fd(),
        err_r: err_r.as_raw_fd(),
        err_w: err_w.as_raw_fd(),
        exe: exe.as_raw_fd(),
        listen: listen.as_raw_fd(),
        log: log.as_raw_fd(),
    };
    let args = ExecArgs {
        argv: ptr_array(&plan.argv),
        envp: ptr_array(&plan.env),
        cap_last: cap_last_cap(),
        lo_up: ns_flags & libc::CLONE_NEWNET as u64 != 0,
    };

    let mut pidfd: RawFd = -1;
    let mut cl = CloneArgs {
        flags: ns_flags | libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    let pid = clone_as(plan.ns_owner, &mut cl)?;
    if pid == 0 {
        // In the child. This never returns.
        crate::child::child_main(plan, &cfds, &args);
    }
    let pid = pid as i32;
    // SAFETY: CLONE_PIDFD stored a fresh descriptor that we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop((sync_r, err_w, exe, listen, log));
    let spawned = Spawned { pid, pidfd };
    match release_child(plan, &spawned, sync_w, &err_r, parent_setup) {
        Ok(()) => Ok(spawned),
        Err(e) => {
            let _ = pidfd_signal(&spawned.pidfd, libc::SIGKILL);
            wait_blocking(&spawned.pidfd);
            Err(e)
        }
    }
}

/// clone3 with `owner` as this thread's euid, so that it owns the new user
/// namespace ([`LaunchPlan::ns_owner`]). Raw setresuid changes only the
/// calling thread (glibc's wrapper would change every thread); the real and
/// saved uids stay 0, so the effective root comes back right after.
fn clone_as(owner: u32, cl: &mut CloneArgs) -> Result<libc::c_long, SysError> {
    let keep = -1 as libc::c_int;
    // SAFETY: raw setresuid of this thread's effective uid only.
    if unsafe { libc::syscall(libc::SYS_setresuid, keep, owner as libc::c_uint, keep) } < 0 {
        return Err(SysError::last("seteuid", owner.to_string()));
    }
    // SAFETY: cl is a valid clone_args of the size we pass; stack 0 gives fork
    // semantics, so the child continues on a private copy of this stack.
    let pid = unsafe { libc::syscall(libc::SYS_clone3, cl as *mut CloneArgs, std::mem::size_of::<CloneArgs>()) };
    let clone_err = (pid < 0).then(|| SysError::last("clone3", "sandbox init"));
    if pid == 0 {
        return Ok(0);
    }
    // SAFETY: as above; back to effective root (the saved uid is 0).
    if unsafe { libc::syscall(libc::SYS_setresuid, keep, 0 as libc::c_uint, keep) } < 0 {
        return Err(SysError::last("seteuid", "0"));
    }
    clone_err.map_or(Ok(pid), Err)
}

fn release_child(
    plan: &LaunchPlan,
    s: &Spawned,
    sync_w: OwnedFd,
    err_r: &OwnedFd,
    parent_setup: impl FnOnce(i32) -> Result<(), String>,
) -> Result<(), SpawnError> {
    write_file(&format!("/proc/{}/uid_map", s.pid), plan.uid_map.as_bytes())?;
    write_file(&format!("/proc/{}/gid_map", s.pid), plan.gid_map.as_bytes())?;
    parent_setup(s.pid).map_err(|message| SpawnError::ParentSetup { pid: s.pid, message })?;
    // SAFETY: writes one byte from a live buffer to a pipe we own.
    if unsafe { libc::write(sync_w.as_raw_fd(), b"g".as_ptr().cast(), 1) } != 1 {
        return Err(SysError::last("release sandbox init", s.pid.to_string()).into());
    }
    drop(sync_w);
    read_child_report(err_r, plan.exec_timeout)
}

/// Waits for EOF (exec succeeded) or an 8-byte `(step, errno)` report.
fn read_child_report(err_r: &OwnedFd, timeout: Duration) -> Result<(), SpawnError> {
    let mut pfd = libc::pollfd { fd: err_r.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: pfd is one live pollfd.
    let r = unsafe { libc::poll(&mut pfd, 1, ms) };
    if r == 0 {
        return Err(SpawnError::Timeout(timeout));
    }
    let mut buf = [0u8; 8];
    // SAFETY: reads at most 8 bytes into an 8-byte buffer.
    let n = unsafe { libc::read(err_r.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
    if n <= 0 {
        return Ok(());
    }
    let step = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
    Err(SpawnError::Child { step: crate::child::step_name(step), source: std::io::Error::from_raw_os_error(errno) })
}

/// Blocks until the child behind `pidfd` is reaped (used only on failed spawns).
fn wait_blocking(pidfd: &OwnedFd) {
    for _ in 0..2000 {
        match pidfd_try_wait(pidfd) {
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            _ => return,
        }
    }
}

fn write_file(path: &str, data: &[u8]) -> Result<(), SysError> {
    std::fs::write(path, data).map_err(|e| SysError::new("write", path, e))
}

fn ptr_array(v: &[CString]) -> Vec<*const libc::c_char> {
    v.iter().map(|c| c.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}

fn cap_last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse().ok()).unwrap_or(40)
}
