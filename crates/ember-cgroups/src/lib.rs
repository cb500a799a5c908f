//! cgroup management for sandboxes, on cgroup v1 (tested on this project's
//! machines) and v2 (what most hosts run), behind one [`Cgroups`] trait.
//!
//! Every sandbox gets `ember/<id>` in each hierarchy it uses. The engine only sees
//! the trait; [`detect`] picks the implementation from the host's mounts.
#![forbid(unsafe_code)]

mod v1;
mod v2;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

pub use v1::V1;
pub use v2::V2;

/// Limits applied to one sandbox's cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub cpu_millis: u64,
    pub pids: u64,
}

/// The sandbox's share of contended CPU, proportional to its cpu limit as
/// Kubernetes makes it proportional to a request: v1 `cpu.shares` of 1024 per
/// CPU (kernel range 2..=262144). Without it every sandbox weighs the same
/// whatever its limit (v1 1024, v2 100).
pub fn cpu_shares(cpu_millis: u64) -> u64 {
    (cpu_millis.saturating_mul(1024) / 1000).clamp(2, 262_144)
}

/// v2 `cpu.weight` (1..=10000) for v1 shares, by the conversion runc, crun and
/// the kubelet use, so a sandbox weighs the same on either version.
pub fn cpu_weight(cpu_millis: u64) -> u64 {
    weight_of_shares(cpu_shares(cpu_millis))
}

/// v2 `cpu.weight` for v1 `cpu.shares` (clamped to the kernel's range).
pub fn weight_of_shares(shares: u64) -> u64 {
    1 + (shares.clamp(2, 262_144) - 2) * 9999 / 262_142
}

/// A group's weight in contended CPU (v1 `cpu.shares`, v2 `cpu.weight`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuShare {
    /// Proportional to a cpu limit in millicores ([`cpu_shares`], [`cpu_weight`]).
    Limit(u64),
    /// The least the kernel takes (v1 2, v2 1): the group runs when nothing
    /// else wants the CPU. A pool's refill launches so (the new init's
    /// setup, its exec and the agent's start are charged to its group, where
    /// the spawning thread's nice value has no say against other groups),
    /// then is set back to its limit's share.
    Background,
    /// The most the kernel gives (v1 262144, v2 10000): a launch someone
    /// waits on (a cold create, a cluster's rebind) until its agent is up,
    /// so the new init's setup and the agent's start take their parent
    /// group's CPU ahead of the node's busy sandboxes (40 of them left a
    /// rebind's launch a fortieth of it), then it is set back to its
    /// limit's share.
    Foreground,
    /// Sixteen cores' share (v1 16384, v2 626): a session a recovering
    /// node re-created, up and kept ahead of the node's other sandboxes
    /// while the node recovers, yet behind the launches still starting
    /// there, which are at [`CpuShare::Foreground`]: kept at the launch's
    /// weight, the sessions rebound first (warm, from their standbys) left a
    /// later cold launch a twelfth of the group, and its agent was not up
    /// after 13 s (the 300-session drill, docs/chaos.md).
    Ahead,
}

impl CpuShare {
    /// v1 `cpu.shares`.
    pub fn shares(self) -> u64 {
        match self {
            CpuShare::Limit(m) => cpu_shares(m),
            CpuShare::Background => 2,
            CpuShare::Foreground => 262_144,
            CpuShare::Ahead => 16_384,
        }
    }

    /// v2 `cpu.weight`.
    pub fn weight(self) -> u64 {
        match self {
            CpuShare::Limit(m) => cpu_weight(m),
            CpuShare::Background => 1,
            CpuShare::Foreground => 10_000,
            CpuShare::Ahead => weight_of_shares(16_384),
        }
    }
}

/// An IO error with the cgroup file that failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Sys(#[from] ember_sys::SysError),
    #[error("no usable cgroup hierarchy: {0}")]
    NoHierarchy(String),
    #[error("cgroup {name} still has processes after {tries} kill rounds")]
    Busy { name: String, tries: u32 },
    #[error("cgroup {name} was not frozen {waited_ms} ms after the freeze")]
    FreezeTimeout { name: String, waited_ms: u64 },
}

/// Writes a freeze or thaw through `set` and, for a freeze, waits until the
/// kernel reports the group frozen. A freeze that does not complete is
/// undone: a group left freezing (v1 `FREEZING`) stops each of its tasks as
/// it leaves the wait that held the freeze up, so the sandbox would hang
/// half-frozen under a record that says it runs, and its removal with it.
pub(crate) fn freeze_with(
    cg: &dyn Cgroups,
    name: &str,
    frozen: bool,
    set: impl Fn(bool) -> Result<(), CgroupError>,
) -> Result<(), CgroupError> {
    set(frozen)?;
    if !frozen {
        return Ok(());
    }
    wait_frozen(cg, name).inspect_err(|_| {
        let _ = set(false);
    })
}

/// Polls until the kernel reports every task of `name` frozen: after the write
/// it freezes them asynchronously (v1 passes through FREEZING, v2 shows
/// `frozen 0` in cgroup.events until the last task stopped). Bounded: a task
/// stuck in the kernel (uninterruptible IO) can hold a freeze off for good.
fn wait_frozen(cg: &dyn Cgroups, name: &str) -> Result<(), CgroupError> {
    const STEP: std::time::Duration = std::time::Duration::from_micros(200);
    const TRIES: u32 = 25_000;
    for _ in 0..TRIES {
        if cg.is_frozen(name)? {
            return Ok(());
        }
        std::thread::sleep(STEP);
    }
    Err(CgroupError::FreezeTimeout { name: name.to_string(), waited_ms: (STEP * TRIES).as_millis() as u64 })
}

pub(crate) fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CgroupError {
    let path = path.to_path_buf();
    move |source| CgroupError::Io { op, path, source }
}

pub(crate) fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io_err("write", path))
}

pub(crate) fn read(path: &Path) -> Result<String, CgroupError> {
    std::fs::read_to_string(path).map_err(io_err("read", path))
}

/// Reads `key N` from a flat-keyed file such as `memory.events`.
pub(crate) fn read_key(path: &Path, key: &str) -> Result<u64, CgroupError> {
    Ok(read(path)?
        .lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0))
}

/// Usage figures for inspect and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub memory_bytes: u64,
    pub pids: u64,
    /// CPU time of every task ever in the group, µs (`None`: no cpu
    /// accounting here, e.g. v1 without a cpuacct hierarchy).
    pub cpu_usage_micros: Option<u64>,
    /// Block IO bytes read and written (`None`: no io accounting here, e.g.
    /// v2 without the io controller delegated). Writes to the sandbox's tmpfs
    /// layer are memory, not block IO.
    pub io_read_bytes: Option<u64>,
    pub io_write_bytes: Option<u64>,
}

/// Sums the `Read`/`Write` rows of v1's `blkio.throttle.io_service_bytes`
/// (`MAJ:MIN Read N`) or the `rbytes=`/`wbytes=` fields of v2's `io.stat`.
pub(crate) fn parse_io(s: &str) -> (u64, u64) {
    let (mut r, mut w) = (0u64, 0u64);
    for line in s.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [_, "Read", n] => r = r.saturating_add(n.parse().unwrap_or(0)),
            [_, "Write", n] => w = w.saturating_add(n.parse().unwrap_or(0)),
            _ => {
                for kv in &f {
                    match kv.split_once('=') {
                        Some(("rbytes", n)) => r = r.saturating_add(n.parse().unwrap_or(0)),
                        Some(("wbytes", n)) => w = w.saturating_add(n.parse().unwrap_or(0)),
                        _ => {}
                    }
                }
            }
        }
    }
    (r, w)
}

/// One cgroup version's implementation. Methods are synchronous: they are a few
/// small writes to cgroupfs, and the engine calls them from blocking threads.
pub trait Cgroups: Send + Sync + std::fmt::Debug {
    /// "v1" or "v2".
    fn version(&self) -> &'static str;
    /// Creates `ember/<name>` in every hierarchy and applies the limits.
    fn create(&self, name: &str, limits: &Limits) -> Result<(), CgroupError>;
    /// Sets the group's weight in contended CPU, its limits unchanged.
    fn set_cpu_share(&self, name: &str, share: CpuShare) -> Result<(), CgroupError>;
    /// Sets the weight in contended CPU of the parent group of every
    /// sandbox (v1 `cpu.shares`; v2 `cpu.weight`, converted as for a
    /// sandbox; `None`: the kernel's default, v1 1024, v2 100), making the
    /// group if it is not there yet: how much the daemon's sandboxes
    /// together weigh against what runs beside the group (the daemon
    /// itself, other daemons' groups).
    fn set_group_cpu_shares(&self, shares: Option<u64>) -> Result<(), CgroupError>;
    /// Moves `pid` into the sandbox's cgroups.
    fn attach(&self, name: &str, pid: i32) -> Result<(), CgroupError>;
    /// Moves the calling thread, and only it, into the sandbox's cgroups, so
    /// that a process it then clones is born in them and never has to be
    /// moved. `Ok(false)` where one thread cannot leave its process's
    /// cgroup (v2 outside threaded mode): the caller then attaches the child
    /// by pid ([`Cgroups::attach`]).
    ///
    /// Why: moving another process (a pid into `cgroup.procs`) takes the
    /// kernel's global threadgroup lock for writing, which waits for an RCU
    /// grace period whenever no other move ran within the last one (5-10 ms
    /// here, on every isolated cold create); moving the calling thread
    /// (`0` into a v1 `tasks` file) skips that lock.
    fn enter_thread(&self, name: &str) -> Result<bool, CgroupError> {
        let _ = name;
        Ok(false)
    }
    /// As [`Cgroups::enter_thread`], every hierarchy but the CPU one: the
    /// child the thread clones is born in the sandbox's other cgroups, at
    /// the caller's (the daemon's) CPU weight, and moves itself into its
    /// CPU cgroup through [`Cgroups::open_cpu_tasks`] once its setup is
    /// done. For a launch someone waits on while the sandboxes' group is
    /// lowered ([`Cgroups::group_lowered`]): in the group, its spawn waited
    /// on the group's weight (p50 262 ms, up to 3.8 s, on the 300-session
    /// drill). `Ok(false)` where the hierarchies are one (v2): the caller
    /// enters them all.
    fn enter_thread_but_cpu(&self, name: &str) -> Result<bool, CgroupError> {
        let _ = name;
        Ok(false)
    }
    /// The sandbox's CPU cgroup's v1 `tasks` file, opened for writing: a
    /// process that writes `0` to it moves its calling thread in, which
    /// takes no threadgroup lock (moving another process waits for the
    /// kernel's global one, and with it every fork on the host). `None`
    /// on v2.
    fn open_cpu_tasks(&self, name: &str) -> Result<Option<OwnedFd>, CgroupError> {
        let _ = name;
        Ok(None)
    }
    /// Whether the group's CPU weight is set below the kernel's default
    /// ([`Cgroups::set_group_cpu_shares`]).
    fn group_lowered(&self) -> bool {
        false
    }
    /// The sandbox's cgroup directory, opened, for a clone into it
    /// (`CLONE_INTO_CGROUP`, cgroup v2 only): its init is then born there,
    /// as [`Cgroups::enter_thread`] does on v1. `None` on v1.
    fn open_dir(&self, name: &str) -> Result<Option<OwnedFd>, CgroupError> {
        let _ = name;
        Ok(None)
    }
    /// A new descriptor that OOM events of any number of sandbox cgroups can
    /// be reported to ([`Cgroups::oom_report_to`]): v1 an eventfd, v2 an
    /// inotify instance.
    fn oom_source(&self) -> Result<OwnedFd, CgroupError>;
    /// Makes `source` (from [`Cgroups::oom_source`]) readable whenever the
    /// OOM killer fires in the cgroup (v2: whenever its `memory.events`
    /// changes, an OOM among other events). Which of the cgroups reported to
    /// one source it was, the caller learns from their [`Cgroups::oom_kills`].
    fn oom_report_to(&self, name: &str, source: BorrowedFd<'_>) -> Result<(), CgroupError>;
    /// A descriptor of the cgroup's own that becomes readable when the OOM
    /// killer fires in it.
    fn oom_notifier(&self, name: &str) -> Result<OwnedFd, CgroupError> {
        let source = self.oom_source()?;
        self.oom_report_to(name, source.as_fd())?;
        Ok(source)
    }
    /// How many processes the OOM killer has killed in the cgroup.
    fn oom_kills(&self, name: &str) -> Result<u64, CgroupError>;
    /// Freezes (or thaws) every process in the cgroup. Freezing returns once
    /// the kernel reports all of them frozen, so the caller can rely on none of
    /// them running, forking or exiting.
    fn freeze(&self, name: &str, frozen: bool) -> Result<(), CgroupError>;
    /// Whether the kernel reports every process of the cgroup frozen.
    fn is_frozen(&self, name: &str) -> Result<bool, CgroupError>;
    /// Pids currently in the cgroup.
    fn procs(&self, name: &str) -> Result<Vec<i32>, CgroupError>;
    fn usage(&self, name: &str) -> Result<Usage, CgroupError>;
    /// The group's memory in use, from its one file: what a pool's status
    /// sums over every idle member, where [`Cgroups::usage`]'s four opens
    /// (each a lookup in a directory of thousands) cost four times as much.
    fn memory_bytes(&self, name: &str) -> Result<u64, CgroupError>;
    /// Limits read back from the kernel (for the enforced-boundary report).
    fn read_limits(&self, name: &str) -> Result<Limits, CgroupError>;
    /// Kills every process in the cgroup and removes it from every hierarchy.
    /// Idempotent: a cgroup that does not exist is already destroyed.
    fn destroy(&self, name: &str) -> Result<(), CgroupError>;
    /// Names of the sandbox cgroups that exist (to find orphans after a crash).
    fn list(&self) -> Result<Vec<String>, CgroupError>;
    /// Whether the sandbox's cgroup exists in any hierarchy.
    fn exists(&self, name: &str) -> bool;
    /// Removes the (empty) parent group itself; used by tests and uninstall.
    fn remove_group(&self) -> Result<(), CgroupError>;
}

/// Picks v2 when the unified hierarchy has the controllers ember needs, else v1.
/// `group` is the parent of every sandbox cgroup (one per daemon; `ember` by
/// default).
pub fn detect(root: &Path, group: &str) -> Result<Box<dyn Cgroups>, CgroupError> {
    if group.is_empty() || group.contains("..") || group.starts_with('/') {
        return Err(CgroupError::NoHierarchy(format!("invalid cgroup parent {group:?}")));
    }
    if unified(root) {
        return Ok(Box::new(V2::new(root.to_path_buf(), group)?));
    }
    Ok(Box::new(V1::from_mountinfo(group)?))
}

/// Whether the unified (v2) hierarchy at `root` has the controllers ember
/// needs: the choice [`detect`] makes.
pub fn unified(root: &Path) -> bool {
    let c = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    ["memory", "pids", "cpu"].iter().all(|k| c.split_whitespace().any(|w| w == *k))
}

/// Retries `rmdir` briefly: a cgroup stays busy until its last task has exited,
/// which the kernel finishes asynchronously after SIGKILL.
pub(crate) fn rmdir_retry(path: &Path) -> Result<(), CgroupError> {
    for _ in 0..500 {
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(16) => std::thread::sleep(std::time::Duration::from_millis(2)),
            Err(e) => return Err(io_err("rmdir", path)(e)),
        }
    }
    Err(CgroupError::Busy { name: path.display().to_string(), tries: 500 })
}

pub(crate) fn parse_procs(s: &str) -> Vec<i32> {
    s.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[cfg(test)]
mod io_tests {
    #[test]
    fn io_figures_of_both_versions() {
        let v1 = "8:0 Read 4096\n8:0 Write 512\n8:0 Sync 0\n8:16 Read 1\nTotal 4609\n";
        assert_eq!(super::parse_io(v1), (4097, 512));
        let v2 = "8:0 rbytes=100 wbytes=20 rios=1 wios=1\n259:0 rbytes=1 wbytes=2 rios=1\n";
        assert_eq!(super::parse_io(v2), (101, 22));
    }
}
