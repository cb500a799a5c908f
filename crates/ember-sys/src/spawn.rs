//! Starting a process in fresh namespaces: clone, the parent/child handshake and
//! the error channel.
//!
//! The protocol, in steps:
//! 1. The parent prepares everything the child will need (C strings, pointer
//!    arrays, BPF programs), because the child runs in the memory of a
//!    multi-threaded process and must not allocate.
//! 2. `clone(CLONE_VM)` on a stack of its own (vmclone.rs: no copy of the
//!    daemon's page tables) with new user, mount, pid, uts, ipc and net
//!    namespaces and a pidfd.
//! 3. The child closes every descriptor but its own (its copy of the daemon's
//!    table holds other launches' pipe ends), then blocks on the sync pipe; the
//!    parent writes the uid/gid maps and runs the caller's setup (cgroup
//!    attach), then releases the child.
//! 4. The child assembles the rootfs, pivots, drops privileges, loads seccomp and
//!    execs the agent. A failure is reported as `(step, errno)` on the error pipe;
//!    the pipe is close-on-exec, so EOF tells the parent the exec succeeded.
use crate::fd::{dup_above, pipe};
use crate::pidfd::{pidfd_signal, pidfd_try_wait};
use crate::vmclone::{clone_vm, clone_vm_into, SignalsBlocked, Stack};
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
    /// The sandbox's `RLIMIT_NOFILE`, soft and hard, at most the daemon's
    /// hard limit (the daemon's own soft limit is raised to its hard one).
    pub open_files: u64,
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
    #[error("moving the spawning thread into the sandbox's cgroups failed: {0}")]
    EnterCgroups(String),
    #[error("sandbox init did not exec within {0:?}")]
    Timeout(Duration),
}

/// Descriptor numbers the child uses; all are >= 10 so the dup2s onto 0-3 cannot
/// clobber them.
pub(crate) struct ChildFds {
    pub sync_r: RawFd,
    pub err_w: RawFd,
    pub exe: RawFd,
    pub listen: RawFd,
    pub log: RawFd,
    /// The `tasks` file of its cpu cgroup, or -1 (`SpawnFrom::cpu_tasks`).
    pub cpu_tasks: RawFd,
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
    /// The spawning thread's signal mask, restored by the child just before exec.
    pub sigmask: libc::sigset_t,
    /// The descriptors the child keeps, ascending: its own ends of the pipes,
    /// the exec, socket and log fds, and the detached trees it attaches.
    pub keep_fds: Vec<RawFd>,
}

const NS_FLAGS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWNET) as u64;

/// The namespaces a sandbox init is cloned from, other than the daemon's.
#[derive(Clone, Copy, Default)]
pub struct SpawnFrom<'a> {
    /// A mount namespace to copy instead of the host's
    /// ([`crate::mountns::LaunchNs`]): what the plan mounts from the host's
    /// later mounts must come as detached trees ([`FsOp::Attach`]).
    pub mounts: Option<BorrowedFd<'a>>,
    /// A network namespace to join instead of a fresh one (a prepared slot).
    pub netns: Option<BorrowedFd<'a>>,
    /// Run on the spawning thread right before the clone, to move that
    /// thread into the sandbox's cgroups so the init is born in them
    /// (`ember_cgroups::Cgroups::enter_thread`). Given one, the spawn always
    /// runs on a short-lived thread of its own, which ends with the spawn:
    /// no other thread of the daemon ever leaves the daemon's cgroups.
    pub enter_cgroups: Option<&'a (dyn Fn() -> Result<(), String> + Sync)>,
    /// The v1 `tasks` file of the sandbox's cpu cgroup, opened for writing,
    /// when the spawning thread left that hierarchy out of the cgroups it
    /// entered: the child does its setup at the daemon's CPU weight, then
    /// moves itself in before exec (`ember_cgroups::Cgroups::enter_thread_but_cpu`).
    pub cpu_tasks: Option<BorrowedFd<'a>>,
    /// A cgroup v2 directory to clone the init into (`CLONE_INTO_CGROUP`),
    /// so it is born there; the parent's setup is told whether it was.
    pub cgroup_dir: Option<BorrowedFd<'a>>,
}

/// Starts the sandbox init from the namespaces `from` names. `parent_setup`
/// runs once the child exists and before it continues, with its pid and
/// whether it was born in `from.cgroup_dir` (attach it to its cgroups there
/// otherwise, unless `from.enter_cgroups` had it born in them).
///
/// A process can only enter a network namespace with CAP_SYS_ADMIN over the
/// user namespace that owns it, which the child loses the moment it enters its
/// new user namespace. So the parent enters first: a short-lived thread calls
/// `setns` (which changes only that thread) and runs the clone from there
/// (without CLONE_NEWNET when it joined a network namespace, so the child
/// inherits it; its new mount namespace is a copy of the one the thread is
/// in). The thread then exits and the daemon's other threads never leave the
/// host's namespaces. The child is reparented to another thread of this
/// process; its pidfd and wait status are the process's, as before.
pub fn spawn_sandbox_from(
    from: SpawnFrom<'_>,
    plan: &LaunchPlan,
    fds: LaunchFds<'_>,
    parent_setup: impl FnOnce(i32, bool) -> Result<(), String> + Send,
) -> Result<Spawned, SpawnError> {
    let cgroup = from.cgroup_dir.map(|f| f.as_raw_fd());
    let cpu_tasks = from.cpu_tasks;
    if from.mounts.is_none() && from.netns.is_none() && from.enter_cgroups.is_none() {
        return spawn_inner(plan, fds, parent_setup, NS_FLAGS, cgroup, cpu_tasks);
    }
    let flags = match from.netns {
        Some(_) => NS_FLAGS & !(libc::CLONE_NEWNET as u64),
        None => NS_FLAGS,
    };
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            if let Some(m) = from.mounts {
                crate::mountns::enter(m)?;
            }
            if let Some(n) = from.netns {
                crate::netns::enter(n)?;
            }
            if let Some(enter) = from.enter_cgroups {
                enter().map_err(SpawnError::EnterCgroups)?;
            }
            spawn_inner(plan, fds, parent_setup, flags, cgroup, cpu_tasks)
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
    parent_setup: impl FnOnce(i32, bool) -> Result<(), String>,
    ns_flags: u64,
    cgroup: Option<RawFd>,
    cpu_tasks: Option<BorrowedFd<'_>>,
) -> Result<Spawned, SpawnError> {
    let (sync_r, sync_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    // The child's ends (the parent's are closed in the child with the rest).
    let keep = [
        dup_above(sync_r.as_raw_fd(), 10)?,
        dup_above(err_w.as_raw_fd(), 10)?,
        dup_above(fds.exe.as_raw_fd(), 10)?,
        dup_above(fds.listen.as_raw_fd(), 10)?,
        dup_above(fds.log.as_raw_fd(), 10)?,
    ];
    drop((sync_r, err_w));
    let [sync_r, err_w, exe, listen, log] = keep;
    let cpu_tasks = cpu_tasks.map(|f| dup_above(f.as_raw_fd(), 10)).transpose()?;
    let cfds = ChildFds {
        sync_r: sync_r.as_raw_fd(),
        err_w: err_w.as_raw_fd(),
        exe: exe.as_raw_fd(),
        listen: listen.as_raw_fd(),
        log: log.as_raw_fd(),
        cpu_tasks: cpu_tasks.as_ref().map_or(-1, |f| f.as_raw_fd()),
    };
    // Blocked from the clone until the child's report is read: no handler
    // runs on the child's stack, and this thread, whose errno the child
    // shares, makes no syscall that fails meanwhile (vmclone.rs).
    let blocked = SignalsBlocked::new();
    let args = ExecArgs {
        argv: ptr_array(&plan.argv),
        envp: ptr_array(&plan.env),
        cap_last: cap_last_cap(),
        lo_up: ns_flags & libc::CLONE_NEWNET as u64 != 0,
        sigmask: blocked.old,
        keep_fds: keep_fds(&cfds, plan),
    };
    let stack = Stack::new(CHILD_STACK)?;
    let ctx = InitCtx { plan, fds: &cfds, args: &args };
    let mut pidfd: RawFd = -1;
    let (flags, entry, arg) = (ns_flags as libc::c_int, init_entry, &ctx as *const InitCtx as *mut _);
    let born_in = match cgroup {
        // SAFETY: `init_entry` runs `child_main`, which keeps vmclone.rs's
        // rules (raw syscalls on data prepared here, no allocation); `ctx`
        // and what it points to live on this frame until the child has
        // exec'd or been reaped (below); signals are blocked.
        Some(cg) => unsafe { clone_vm_into(flags, plan.ns_owner, &stack, entry, arg, &mut pidfd, cg) }?,
        None => None,
    };
    let pid = match born_in {
        Some(pid) => pid,
        // SAFETY: as for `clone_vm_into` just above.
        None => unsafe { clone_vm(flags, plan.ns_owner, &stack, entry, arg, Some(&mut pidfd)) }?,
    };
    // SAFETY: CLONE_PIDFD stored a fresh descriptor that we now own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop((sync_r, err_w, exe, listen, log, cpu_tasks));
    let spawned = Spawned { pid, pidfd };
    let res = release_child(plan, &spawned, sync_w, &err_r, |pid| parent_setup(pid, born_in.is_some()));
    drop(blocked);
    match res {
        // EOF on the error pipe: the child exec'd (its memory is a new one
        // before its close-on-exec fds close) or exited; the stack is free.
        Ok(()) => Ok(spawned),
        Err(e) => {
            let _ = pidfd_signal(&spawned.pidfd, libc::SIGKILL);
            if !wait_blocking(&spawned.pidfd) {
                stack.leak();
            }
            Err(e)
        }
    }
}

fn keep_fds(c: &ChildFds, plan: &LaunchPlan) -> Vec<RawFd> {
    let trees = plan.fs_ops.iter().filter_map(|op| match op {
        FsOp::Attach { tree, .. } => Some(*tree),
        _ => None,
    });
    let cpu = (c.cpu_tasks >= 0).then_some(c.cpu_tasks);
    let mut keep: Vec<RawFd> =
        [c.sync_r, c.err_w, c.exe, c.listen, c.log].into_iter().chain(cpu).chain(trees).collect();
    keep.sort_unstable();
    keep.dedup();
    keep
}

/// The child's stack: `child_main`'s frames are small; pages never touched
/// are never backed.
const CHILD_STACK: usize = 256 << 10;

/// What the child gets from the parent's frame.
struct InitCtx<'a> {
    plan: &'a LaunchPlan,
    fds: &'a ChildFds,
    args: &'a ExecArgs,
}

extern "C" fn init_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `InitCtx` on `spawn_inner`'s frame, alive until
    // this child has exec'd or been reaped.
    let ctx = unsafe { &*(arg as *const InitCtx) };
    crate::child::child_main(ctx.plan, ctx.fds, ctx.args)
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
        let e = SysError::last("release sandbox init", s.pid.to_string());
        // The child exits before the release only after a failed step,
        // which it reported.
        return Err(match read_child_report(err_r, Duration::ZERO) {
            Err(reported @ SpawnError::Child { .. }) => reported,
            _ => e.into(),
        });
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

/// Waits up to 2 s until the child behind `pidfd` is reaped (used only on
/// failed spawns); whether it was.
fn wait_blocking(pidfd: &OwnedFd) -> bool {
    for _ in 0..2000 {
        match pidfd_try_wait(pidfd) {
            Ok(None) => std::thread::sleep(Duration::from_millis(1)),
            Ok(Some(_)) => return true,
            Err(_) => return false,
        }
    }
    false
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
