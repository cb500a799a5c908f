//! Runtime classes: how a sandbox is started, re-adopted, inspected and destroyed.
//!
//! [`Runtime`] is the trait the engine drives; [`native::NativeRuntime`] is ember's
//! default class (its own namespaces, cgroups, seccomp and rootfs, no external
//! binary). OCI runtime classes (runsc, crun, runc) implement the same trait.
//! Everything here is synchronous; the engine calls it from blocking threads.
#![forbid(unsafe_code)]

pub mod idrange;
pub mod native;
pub mod oci;
pub mod oom;
mod registry;

pub use native::idmapped::attach_shifted;
pub use registry::{ClassInfo, Runtimes};

pub use ember_agent_client::pin_agent_socket;
pub use ember_sys::pidfd::ExitStatus as ExitKind;
pub use ember_sys::process::raise_open_files;

/// `GET /ping` to the agent within `timeout` (readiness at launch and after a
/// restore), through the one agent client: pinned socket, capped reply.
pub fn ping_agent(socket: &std::path::Path, timeout: std::time::Duration) -> Result<(), String> {
    ember_agent_client::blocking::ping(socket, timeout).map_err(|e| e.report())
}

/// A bodiless `POST path` to the agent within `timeout` (the gVisor quiesce),
/// and its capped reply whatever its status.
pub fn post_agent(
    socket: &std::path::Path,
    path: &str,
    timeout: std::time::Duration,
) -> Result<ember_agent_client::Reply, ember_agent_client::AgentError> {
    ember_agent_client::blocking::post(socket, path, timeout)
}

/// A pool's refill, behind the claims (`ember_sys::nice`): `launch` runs on
/// this thread niced to `ember_sys::nice::BACKGROUND` (its clone and the new
/// sandbox's setup with it), then the thread and the sandbox it started are
/// set back to the thread's value before. Unniced when it cannot be set.
///
/// A nice value weighs a thread only against the others of its cgroup, and
/// the new init's own setup, its exec and its agent's start run in the
/// sandbox's group, which weighed as much as the claimed agent a claim
/// waits for: a native launch made here also starts its group at the least
/// CPU weight and sets it back to its limit's once the agent is up
/// ([`launching_in_background`]).
pub fn in_background<E>(launch: impl FnOnce() -> Result<Launched, E>) -> Result<Launched, E> {
    let _flag = BackgroundFlag::set();
    let Some(bg) = ember_sys::nice::Background::enter() else { return launch() };
    let launched = launch()?;
    if let Err(e) = ember_sys::nice::set_process(launched.pid, bg.before()) {
        tracing::warn!(pid = launched.pid, error = %e, "setting a refilled sandbox back to its priority");
    }
    Ok(launched)
}

thread_local! {
    static IN_BACKGROUND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Set on this thread for the duration of [`in_background`]'s launch.
struct BackgroundFlag(bool);

impl BackgroundFlag {
    fn set() -> BackgroundFlag {
        BackgroundFlag(IN_BACKGROUND.replace(true))
    }
}

impl Drop for BackgroundFlag {
    fn drop(&mut self) {
        IN_BACKGROUND.set(self.0);
    }
}

/// Whether the launch running on this thread is a pool's refill
/// ([`in_background`]). A thread-local rather than an argument: the
/// [`Runtime`] launch methods stay those of every class, and only the native
/// one, whose sandbox groups ember makes itself, acts on it.
pub(crate) fn launching_in_background() -> bool {
    IN_BACKGROUND.get()
}

/// Every thread of this process at nice value `nice`; threads started
/// later inherit it from the one that starts them (`ember chaos run`, whose
/// sessions stand for clients on other machines).
pub fn nice_self(nice: i32) -> std::io::Result<()> {
    ember_sys::nice::set_process(std::process::id().cast_signed(), nice)
}

/// Makes the daemon the subreaper of the OCI runtimes' orphans (runsc's
/// Sentry and gofer, crun's and runc's container init): they become its
/// children when the runtime's `create` exits, and the OCI classes hand them
/// to a reaper that reaps each as it exits (`ember_sys::adopt`), instead of
/// leaving zombies for a PID 1 that may reap late.
pub fn become_subreaper() -> Result<(), ember_sys::SysError> {
    ember_sys::adopt::become_subreaper()
}

/// Whether the init behind `pidfd` has exited, without reaping it.
pub fn has_exited(pidfd: &OwnedFd) -> bool {
    ember_sys::pidfd::wait_exited(pidfd, Duration::ZERO).unwrap_or(false)
}

/// Reaps the sandbox init behind `pidfd` if it has exited.
pub fn try_wait(pidfd: &OwnedFd) -> Option<ExitKind> {
    ember_sys::pidfd::pidfd_try_wait(pidfd).ok().flatten()
}

/// Whether the init behind `pidfd` is gone: reaped here if it is our child
/// (native), or dead if an OCI runtime started it. Such an init is not our
/// child: it may stay a zombie until its own parent reaps it, and a zombie still
/// answers signal 0, so its state is read from `/proc`.
pub fn wait_done(pidfd: &OwnedFd) -> bool {
    match ember_sys::pidfd::pidfd_try_wait(pidfd) {
        Ok(Some(_)) | Err(_) => true,
        // No pid any more (fdinfo says -1 once it is reaped): gone.
        Ok(None) => ember_sys::pidfd::pid_of(pidfd).is_none_or(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next());
            matches!(state, None | Some("Z") | Some("X"))
        }),
    }
}

/// Empties a notification descriptor (OOM eventfd or inotify) after it fired.
pub fn drain_fd(fd: &OwnedFd) {
    ember_sys::fd::drain(fd)
}

use ember_types::{BoundaryReport, SandboxId, SandboxSpec};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("preparing {what} at {path}")]
    Prepare {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A writable layer (restored from a snapshot, or left by a checkpoint)
    /// where a path the host prepares is, or goes through, a symlink: refused
    /// content, not a fault (a 422 at the API).
    #[error("refusing writable layer: {} is or goes through a symlink (/etc, /proc, /dev, /tmp and mount points must not be symlinks)", path.display())]
    UnsafeLayer { path: PathBuf },
    #[error("cgroups of sandbox {id}")]
    Cgroup {
        id: SandboxId,
        #[source]
        source: ember_cgroups::CgroupError,
    },
    #[error("starting sandbox {id}")]
    Spawn {
        id: SandboxId,
        #[source]
        source: ember_sys::spawn::SpawnError,
    },
    #[error("agent of sandbox {id} did not become ready: {message}")]
    AgentNotReady { id: SandboxId, message: String },
    #[error("sandbox {id} is gone: {message}")]
    Gone { id: SandboxId, message: String },
    #[error("agent binary {path}: {message}")]
    Agent { path: PathBuf, message: String },
    #[error("OCI runtime, sandbox {id}")]
    Oci {
        id: SandboxId,
        #[source]
        source: oci::cli::OciCliError,
    },
    #[error(transparent)]
    Bundle(#[from] oci::bundle::BundleError),
    #[error("the {class} class does not support {what}")]
    Unsupported { class: &'static str, what: &'static str },
    #[error(transparent)]
    Sys(#[from] ember_sys::SysError),
    #[error(transparent)]
    Seccomp(#[from] ember_sys::seccomp::SeccompError),
    #[error("id ranges: {message}")]
    IdRanges { message: String },
    #[error("runtime class {0} cannot join a prepared network namespace")]
    NetworkUnsupported(&'static str),
    /// The sandbox refused to be interrupted (an exec stream or a terminal is open).
    #[error("sandbox {id} is busy: {message}")]
    Busy { id: SandboxId, message: String },
}

/// A prepared network namespace (a network slot) that a sandbox joins instead
/// of getting a fresh one with only `lo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetJoin {
    /// The namespace file, e.g. `/run/netns/ember-3`.
    pub netns: PathBuf,
    /// Written to the sandbox's `/etc/resolv.conf`.
    pub resolver: std::net::Ipv4Addr,
}

/// Where each part of a launch went, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchTiming {
    pub cgroup_us: u64,
    pub spawn_us: u64,
    pub ready_us: u64,
    pub total_us: u64,
}

impl LaunchTiming {
    /// From the launch's marks, each measured from its start: cgroups made at
    /// `cgroup`, init spawned at `spawn`, agent ready at `total`.
    pub fn from_marks(cgroup: std::time::Duration, spawn: std::time::Duration, total: std::time::Duration) -> Self {
        LaunchTiming {
            cgroup_us: cgroup.as_micros() as u64,
            spawn_us: spawn.saturating_sub(cgroup).as_micros() as u64,
            ready_us: total.saturating_sub(spawn).as_micros() as u64,
            total_us: total.as_micros() as u64,
        }
    }
}

/// A running sandbox init, as the runtime hands it to the engine.
#[derive(Debug)]
pub struct Launched {
    pub pid: i32,
    pub pidfd: OwnedFd,
    /// Start time of the init in clock ticks since boot (from `/proc/<pid>/stat`);
    /// with the pid it identifies the process across daemon restarts.
    pub start_time: u64,
    /// The host-side unix socket the agent serves execd on.
    pub agent_socket: PathBuf,
    /// Readable when the OOM killer fires in the sandbox or in another of
    /// its class that shares the descriptor ([`oom::OomSources`]); its
    /// [`Runtime::oom_kills`] tells which.
    pub oom: Option<std::sync::Arc<OwnedFd>>,
    pub timing: LaunchTiming,
}

/// One runtime class.
pub trait Runtime: Send + Sync {
    /// The class name templates and requests use ("native", "runsc", ...).
    fn class(&self) -> &'static str;
    /// Starts a sandbox and returns once its agent answers `/ping`.
    fn launch(&self, id: &SandboxId, spec: &SandboxSpec) -> Result<Launched, RuntimeError>;
    /// An idle sandbox (a pool's member, a rebind's standby) is being handed
    /// to a caller, who waits on its first calls as on a launch's. Native:
    /// while the node recovers, it weighs as a launch until the recovery
    /// ends and for a while after (`native/weight.rs`); otherwise, and for
    /// the other classes, nothing.
    fn claimed(&self, _id: &SandboxId, _spec: &SandboxSpec) -> Result<(), RuntimeError> {
        Ok(())
    }
    /// Like [`Runtime::launch`], but the sandbox joins the network namespace
    /// `net` (egress networking) instead of getting one with only `lo`.
    fn launch_in_network(&self, id: &SandboxId, spec: &SandboxSpec, net: &NetJoin) -> Result<Launched, RuntimeError> {
        let _ = (id, spec, net);
        Err(RuntimeError::NetworkUnsupported(self.class()))
    }
    /// Re-attaches to a sandbox started by an earlier daemon process.
    fn adopt(&self, id: &SandboxId, pid: i32, start_time: u64) -> Result<Launched, RuntimeError>;
    /// Kills everything in the sandbox and removes its cgroups and host files.
    /// Idempotent.
    fn destroy(&self, id: &SandboxId, init: Option<&OwnedFd>) -> Result<(), RuntimeError>;
    /// Freezes or thaws every process of the sandbox.
    fn freeze(&self, id: &SandboxId, frozen: bool) -> Result<(), RuntimeError>;
    /// Kills every process of the sandbox but its init (`init_pid`, the
    /// agent) and returns once they are gone: what is left between two tasks
    /// that share a sandbox. The writable layer is kept.
    fn reset(&self, id: &SandboxId, init_pid: i32) -> Result<(), RuntimeError> {
        let _ = (id, init_pid);
        Err(RuntimeError::Unsupported { class: self.class(), what: "reset between tasks" })
    }
    /// How many OOM kills the sandbox has seen.
    fn oom_kills(&self, id: &SandboxId) -> Result<u64, RuntimeError>;
    /// Mounts a host directory into the running sandbox (workspaces), without
    /// restarting it.
    fn inject_mount(
        &self,
        id: &SandboxId,
        pid: i32,
        source: &std::path::Path,
        target: &str,
        readonly: bool,
    ) -> Result<(), RuntimeError>;
    /// Whether [`Runtime::inject_mount`] can work for this class (workspaces).
    fn can_inject_mounts(&self) -> bool {
        true
    }
    /// The host uid/gid a sandbox uid/gid maps to in the storage range (the
    /// owner of workspaces and layers on disk).
    fn host_ids(&self, uid: u32, gid: u32) -> (u32, u32);
    /// How many mounts the table a launch copies holds (a clone with a new
    /// mount namespace copies them all); `None` for a class that does not
    /// clone its sandboxes itself.
    fn launch_table_mounts(&self) -> Option<usize> {
        None
    }
    /// The first host id of the range `id`'s ids map to, and the host id a
    /// snapshot's recorded owner becomes in it (classes with one range per
    /// sandbox; `None`: the storage range, ids kept as recorded).
    fn id_range(&self, id: &SandboxId) -> Option<(u32, std::sync::Arc<crate::idrange::IdRanges>)> {
        let _ = id;
        None
    }
    /// Memory charged to the sandbox's cgroup, in bytes.
    fn memory_usage(&self, id: &SandboxId) -> Result<u64, RuntimeError>;
    /// Live cpu, memory, pids and io figures of the sandbox's cgroup, with
    /// its limits (`ember stats`).
    fn stats(&self, id: &SandboxId) -> Result<ember_types::SandboxStats, RuntimeError>;
    /// What is enforced on the running sandbox, read back from the kernel.
    fn boundary(&self, id: &SandboxId, pid: i32) -> Result<BoundaryReport, RuntimeError>;
    /// Ids of sandboxes that have host resources (cgroups, dirs) left.
    fn leftovers(&self) -> Result<Vec<String>, RuntimeError>;
    /// Removes the host resources of a sandbox the engine has no record of.
    fn reap_leftover(&self, name: &str) -> Result<(), RuntimeError>;
    /// The exit code of a sandbox whose init has exited, when the class cannot
    /// `waitid` it (an OCI runtime's init is not the daemon's child). `None`:
    /// unknown (killed, or the class reaps its init itself).
    fn exit_code(&self, _id: &SandboxId) -> Option<i32> {
        None
    }
    /// The file the sandbox's agent writes its own log to, if the class keeps one.
    fn log_path(&self, _id: &SandboxId) -> Option<PathBuf> {
        None
    }
    /// The host path of a sandbox's writable (overlay upper) layer, for sandbox
    /// snapshots. `None`: this class keeps it out of the host's reach.
    fn writable_layer(&self, _id: &SandboxId) -> Option<WritableLayer> {
        None
    }
    /// Makes the writable layer of a sandbox about to be launched, so a restore
    /// can fill its upper dir before [`Runtime::launch`], which then uses it as
    /// it is. `None`: the class cannot (sandbox snapshots are unsupported).
    fn prepare_writable_layer(
        &self,
        _id: &SandboxId,
        _spec: &SandboxSpec,
    ) -> Result<Option<WritableLayer>, RuntimeError> {
        Ok(None)
    }
    /// Whether [`Runtime::checkpoint`] can work for this class.
    fn can_checkpoint(&self) -> bool {
        false
    }
    /// Saves the running sandbox's processes and memory to disk and stops it;
    /// its cgroups, rootfs and dirs stay for [`Runtime::restore`].
    fn checkpoint(&self, _id: &SandboxId) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported { class: self.class(), what: "checkpoint and restore" })
    }
    /// Starts a checkpointed sandbox again from its image and returns once its
    /// agent answers `/ping`. The image stays until [`Runtime::drop_checkpoint`]
    /// (so a crash before the engine records the new init loses nothing).
    fn restore(&self, _id: &SandboxId, _spec: &SandboxSpec) -> Result<Launched, RuntimeError> {
        Err(RuntimeError::Unsupported { class: self.class(), what: "checkpoint and restore" })
    }
    /// Removes a checkpoint image that is no longer needed. Idempotent.
    fn drop_checkpoint(&self, _id: &SandboxId) -> Result<(), RuntimeError> {
        Ok(())
    }
    /// Keeps a copy of checkpointed sandbox `src`'s image (its spec bounds
    /// the copy) as the starting point `key` of a golden pool's members.
    fn save_golden_image(&self, _src: &SandboxId, _spec: &SandboxSpec, _key: &str) -> Result<(), RuntimeError> {
        Err(RuntimeError::Unsupported { class: self.class(), what: "golden pools from a checkpoint" })
    }
    /// Starts a new sandbox by restoring golden image `key` into it (its own
    /// rootfs, prepared beforehand as a launch's) and returns once its agent
    /// answers `/ping`.
    fn launch_from_golden(&self, _id: &SandboxId, _spec: &SandboxSpec, _key: &str) -> Result<Launched, RuntimeError> {
        Err(RuntimeError::Unsupported { class: self.class(), what: "golden pools from a checkpoint" })
    }
    /// Removes golden image `key`. Idempotent.
    fn drop_golden_image(&self, _key: &str) -> Result<(), RuntimeError> {
        Ok(())
    }
    /// The host path of the sandbox's agent socket, when the class has one per
    /// sandbox (a checkpointed sandbox re-adopted after a restart has no
    /// [`Launched`] to say it).
    fn agent_socket_path(&self, _id: &SandboxId) -> Option<PathBuf> {
        None
    }
}

/// A sandbox's overlay upper dir as the host sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritableLayer {
    pub upper: PathBuf,
    /// The xattr that marks an opaque directory in this overlay
    /// (`user.overlay.opaque` with `userxattr`, else `trusted.overlay.opaque`).
    pub opaque_xattr: &'static str,
}

/// Default time a sandbox init gets from release to exec, and the agent to answer.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the microVM class (Firecracker / Cloud Hypervisor, see docs/microvm.md)
/// cannot run on this host. It is designed, not built: even where `/dev/kvm`
/// opens, the KVM on these machines is a paravirtual nested one on which guest
/// kernels hang, so the class is always reported unavailable, with what was found.
pub fn microvm_unavailable_reason() -> String {
    let kvm = match std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        Ok(_) => "/dev/kvm opens, but guest kernels do not boot on this nested paravirtual KVM".to_string(),
        Err(e) => format!("/dev/kvm: {e}"),
    };
    let vmm = ["firecracker", "cloud-hypervisor"]
        .iter()
        .any(|b| std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).any(|d| d.join(b).is_file()));
    format!("microVM class designed, not built (docs/microvm.md); {kvm}; VMM binary on PATH: {vmm}")
}

/// [`Runtime::stats`] of a sandbox whose cgroup is `id` under `cgroups`.
pub(crate) fn cgroup_stats(
    cgroups: &dyn ember_cgroups::Cgroups,
    id: &SandboxId,
) -> Result<ember_types::SandboxStats, ember_cgroups::CgroupError> {
    let u = cgroups.usage(id.as_str())?;
    let l = cgroups.read_limits(id.as_str())?;
    Ok(ember_types::SandboxStats {
        id: id.to_string(),
        cgroup_version: cgroups.version().to_string(),
        cpu_usage_micros: u.cpu_usage_micros,
        cpu_limit_millis: l.cpu_millis,
        memory_bytes: u.memory_bytes,
        memory_limit_bytes: l.memory_bytes,
        pids: u.pids,
        pids_limit: l.pids,
        io_read_bytes: u.io_read_bytes,
        io_write_bytes: u.io_write_bytes,
    })
}
