//! OCI runtime classes: `crun`, `runc` and `runsc` (gVisor), driven through
//! their command line ([`cli::OciCli`]) with a bundle ember generates
//! ([`bundle`]) over a rootfs the daemon assembles ([`rootfs`]).
//!
//! Launch, in steps: create the cgroups (ember's own manager, so OOM events,
//! usage, freeze and the leftover sweep work as for native; the runtime joins
//! them through `cgroupsPath`); assemble the rootfs; write `config.json`;
//! `<rt> run --detach`, the init's pid in its `--pid-file`; poll the
//! agent's socket in the bound host dir until `GET /ping` answers.
//!
//! Layout under `<data-dir>/oci/<class>/`: `state/` (the runtime's `--root`),
//! `sandboxes/<id>/{bundle/config.json, init.pid, mnt/, sock/agent.sock, agent.log, checkpoint/}`,
//! for runsc `ws/`, the workspace slot (`slot.rs`), and `checkpoint/`, a runsc
//! checkpoint image ([`checkpoint`]); `golden/<key>/`, a golden pool's copy of
//! one ([`golden`]).
pub mod bundle;
mod checkpoint;
mod class;
pub mod cli;
mod exit;
mod golden;
pub mod prepare;
mod ready;
pub mod rootfs;
pub mod slot;

pub use class::{OciClass, RUNSC_PIDS_OVERHEAD, RUNSC_TASKS_PER_PROCESS};
use exit::read_exit_file;
pub use exit::EXIT_FILE;
pub use prepare::{prepare_bundle, BundlePlan, PreparedBundle};

use crate::idrange::IdRanges;
use crate::native::idmapped::{self, Trees};
use crate::native::rootfs::{ensure_host_template, ID_RANGE};
use crate::{LaunchTiming, Launched, Runtime, RuntimeError, WritableLayer};
use cli::{OciCli, OciCliError};
use ember_cgroups::{Cgroups, Limits};
use ember_types::{BoundaryReport, SandboxId, SandboxSpec};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A sandbox's `RLIMIT_NOFILE` (soft and hard), the kernel's default: in
/// the bundle for crun and runsc, inherited from the runtime for runc
/// ([`bundle::BundleInputs::inherit_rlimits`]).
pub const OPEN_FILES: u64 = 1024;

/// Where `<rt> create` writes the init's host pid, in the sandbox's dir.
const PID_FILE: &str = "init.pid";

/// Configuration of one OCI class, fixed at daemon start.
#[derive(Clone, Debug)]
pub struct OciConfig {
    pub class: OciClass,
    pub binary: PathBuf,
    /// The daemon's `<data-dir>` (the host template is shared with native).
    pub data_dir: PathBuf,
    pub agent_path: PathBuf,
    /// The storage range's first host id (what the host template is owned by).
    pub uid_base: u32,
    /// The daemon's id ranges, shared with the native class: each crun or
    /// runc sandbox gets one of its own; runsc's stay in the storage range
    /// (docs/threat-model.md says why).
    pub ranges: Arc<IdRanges>,
    /// The cgroup group the class's sandboxes live in (`<parent>-<class>`).
    pub cgroup_group: String,
    /// How long the agent gets to answer after a start or a restore
    /// ([`crate::READY_TIMEOUT`] unless `ember serve --ready-timeout`).
    pub ready_timeout: Duration,
}

pub struct OciRuntime {
    cfg: OciConfig,
    cli: OciCli,
    cgroups: Arc<dyn Cgroups>,
    host_template: PathBuf,
    base: PathBuf,
    /// Where its sandboxes' OOM kills are reported, shared.
    oom: crate::oom::OomSources,
}

impl OciRuntime {
    pub fn new(cfg: OciConfig, cgroups: Arc<dyn Cgroups>) -> Result<OciRuntime, RuntimeError> {
        crate::native::check_static(&cfg.agent_path)?;
        let host_template = ensure_host_template(&cfg.data_dir.join("templates"), cfg.uid_base)?;
        let base = cfg.data_dir.join("oci").join(cfg.class.name());
        for d in [base.join("state"), base.join("sandboxes")] {
            std::fs::create_dir_all(&d).map_err(|source| RuntimeError::Prepare { what: "oci dir", path: d, source })?;
        }
        let mut cli = OciCli::new(&cfg.binary, base.join("state"), cfg.class.global_args());
        if cfg.class == OciClass::Runc {
            cli = cli.with_open_files(OPEN_FILES);
        }
        Ok(OciRuntime { cfg, cli, cgroups, host_template, base, oom: Default::default() })
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.base.join("sandboxes").join(id)
    }

    fn oci_err(id: &SandboxId) -> impl FnOnce(OciCliError) -> RuntimeError + '_ {
        move |source| RuntimeError::Oci { id: id.clone(), source }
    }

    fn cg_err(id: &SandboxId) -> impl FnOnce(ember_cgroups::CgroupError) -> RuntimeError + '_ {
        move |source| RuntimeError::Cgroup { id: id.clone(), source }
    }

    /// The cgroup limits of a sandbox of this class (runsc's pids scaled).
    fn limits(&self, spec: &SandboxSpec) -> Limits {
        let r = &spec.resources;
        Limits { memory_bytes: r.memory_bytes, cpu_millis: r.cpu_millis, pids: self.cfg.class.host_pids(r.pids) }
    }

    /// Assembles the rootfs and bundle, `<rt> run --detach` (the init's pid
    /// in its `--pid-file`), opens the init's pidfd: one run of the runtime,
    /// where `create`, `state` and `start` were three (for runsc ~15 ms each;
    /// docs/performance.md, "Fewer runs of the runtime"). The pid cannot name
    /// another process by the time the pidfd is opened, even if the init
    /// already exited: once the runtime has exited, the init is a child of the
    /// daemon, its subreaper (`ember serve`, [`crate::become_subreaper`]), and
    /// stays a zombie until the daemon's reaper, which it is handed to here,
    /// waits for it.
    fn start(&self, id: &SandboxId, spec: &SandboxSpec, dir: &Path) -> Result<(i32, OwnedFd, PathBuf), RuntimeError> {
        let (bundle_dir, sock_dir, userns) = self.bundle(id, spec, dir)?;
        let log = dir.join("agent.log");
        let pid_file = dir.join(PID_FILE);
        let _ = std::fs::remove_file(&pid_file);
        let pid = self.cli.run_detached(id.as_str(), &bundle_dir, &log, &pid_file).map_err(Self::oci_err(id))?;
        // The bundle names the namespace by this fd's /proc path: open until the runtime joined it.
        drop(userns);
        let pidfd = ember_sys::pidfd::pidfd_open(pid)?;
        self.adopt_container_procs(id, pid);
        Ok((pid, pidfd, sock_dir.join("agent.sock")))
    }

    /// Assembles the rootfs and writes the bundle; returns the bundle's and
    /// the agent socket's dirs, and the user namespace fd the bundle names
    /// by its `/proc/self/fd` path (crun, runc), which must stay open until
    /// the runtime has joined it.
    fn bundle(
        &self,
        id: &SandboxId,
        spec: &SandboxSpec,
        dir: &Path,
    ) -> Result<(PathBuf, PathBuf, Option<OwnedFd>), RuntimeError> {
        let slot = if self.cfg.class == OciClass::Runsc { Some(slot::prepare(dir)?) } else { None };
        let trees = self.trees(id, spec)?;
        // Owned by the range (as a native sandbox's): per-uid counts are its
        // own, not host root's. runsc keeps the storage range (see `trees`).
        let userns = match trees.base == self.cfg.ranges.storage_base() || self.cfg.class == OciClass::Runsc {
            true => None,
            false => Some(ember_sys::idmap::userns_fd_owned(&format!("0 {} {ID_RANGE}\n", trees.base), trees.base)?),
        };
        let prepared = prepare_bundle(&BundlePlan {
            id,
            spec,
            dir,
            host_template: &self.host_template,
            agent: &self.cfg.agent_path,
            cgroups_path: PathBuf::from("/").join(&self.cfg.cgroup_group).join(id.as_str()),
            uid_base: trees.base,
            lower_trees: &trees.lowers,
            volume_trees: &trees.volumes,
            userns: userns.as_ref().map(|u| u.as_fd()),
            class: self.cfg.class,
            workspace_slot: slot.as_deref(),
            cgroup_v2: self.cgroups.version() == "v2",
            listen_fd: false,
        })?;
        Ok((prepared.bundle_dir, prepared.socket_dir, userns))
    }

    /// Hands what `create` (or `restore`) left in the container's cgroup to
    /// the daemon's reaper, if the daemon adopted it as subreaper
    /// (`ember_sys::adopt`): runsc's Sentry and gofer, crun's and runc's init.
    /// Each is reaped the moment it exits, so `runsc delete`, which polls until
    /// they are gone, is not kept waiting by a zombie. Nothing else runs in
    /// that cgroup that the daemon spawned and waits for itself.
    pub(super) fn adopt_container_procs(&self, id: &SandboxId, init: i32) {
        let mut procs = self.cgroups.procs(id.as_str()).unwrap_or_default();
        if !procs.contains(&init) {
            procs.push(init);
        }
        for pid in procs {
            if let Err(e) = ember_sys::adopt::adopt_child(pid) {
                tracing::warn!(sandbox = %id, pid, error = %e, "adopting a container process failed");
            }
        }
    }

    /// The sandbox's id range and its layers and volumes idmapped onto it
    /// (as the native class's). runsc stays in the storage range: the
    /// workload's ids are the Sentry's own and never reach the host kernel,
    /// whose per-uid counts it does not use (inotify, processes, keys are
    /// implemented in the Sentry).
    fn trees(&self, id: &SandboxId, spec: &SandboxSpec) -> Result<Trees, RuntimeError> {
        if self.cfg.class == OciClass::Runsc {
            let base = self.cfg.ranges.use_storage(id.as_str());
            return Ok(Trees { base, lowers: Vec::new(), volumes: Vec::new(), layer: None });
        }
        idmapped::trees(&self.cfg.ranges, &self.host_template, id.as_str(), spec)
    }

    /// The sandbox's dir, made 0711: its bundle holds the sandbox's env; host
    /// users may pass, not list.
    fn make_dir(&self, id: &SandboxId) -> Result<PathBuf, RuntimeError> {
        let dir = self.dir(id.as_str());
        let made = std::fs::DirBuilder::new().recursive(true).mode(0o711).create(&dir);
        made.and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)))
            .map_err(|source| RuntimeError::Prepare { what: "sandbox dir", path: dir.clone(), source })?;
        Ok(dir)
    }
}

/// A running init as the engine gets it, from a launch or a restore.
fn launched(pid: i32, pidfd: OwnedFd, agent_socket: PathBuf, oom: Arc<OwnedFd>, timing: LaunchTiming) -> Launched {
    let start_time = crate::native::boundary::start_time(pid).unwrap_or(0);
    Launched { pid, pidfd, start_time, agent_socket, oom: Some(oom), timing }
}

impl Runtime for OciRuntime {
    fn class(&self) -> &'static str {
        self.cfg.class.name()
    }

    fn launch(&self, id: &SandboxId, spec: &SandboxSpec) -> Result<Launched, RuntimeError> {
        let t0 = Instant::now();
        let dir = self.make_dir(id)?;
        self.cgroups.create(id.as_str(), &self.limits(spec)).map_err(Self::cg_err(id))?;
        let oom = self.oom.watch(&*self.cgroups, id.as_str()).map_err(Self::cg_err(id))?;
        let t_cg = t0.elapsed();
        let (pid, pidfd, sock) = self.start(id, spec, &dir)?;
        let t_spawn = t0.elapsed();
        self.wait_ready(id, &sock, Some(&pidfd), Some(spec))?;
        Ok(launched(pid, pidfd, sock, oom, LaunchTiming::from_marks(t_cg, t_spawn, t0.elapsed())))
    }

    fn adopt(&self, id: &SandboxId, pid: i32, start_time: u64) -> Result<Launched, RuntimeError> {
        let gone = |m: String| RuntimeError::Gone { id: id.clone(), message: m };
        let state = self.cli.state(id.as_str()).map_err(|e| gone(e.to_string()))?;
        if state.status != "running" || state.pid != pid {
            return Err(gone(format!("the runtime reports it {} with pid {}", state.status, state.pid)));
        }
        let pidfd = ember_sys::pidfd::pidfd_open(pid).map_err(|e| gone(e.to_string()))?;
        if crate::native::boundary::start_time(pid) != Some(start_time) {
            return Err(gone("its init process was replaced".into()));
        }
        // The range is the kernel's record: the init's uid_map (gVisor's
        // sandboxes share the storage range).
        match self.cfg.class {
            OciClass::Runsc => _ = self.cfg.ranges.use_storage(id.as_str()),
            _ => {
                let base = crate::native::boundary::root_host_id(pid).ok_or_else(|| gone("no uid_map".into()))?;
                self.cfg.ranges.adopt(id.as_str(), base)?;
            }
        }
        self.wake_quiesced_agent(id)?;
        Ok(Launched {
            pid,
            pidfd,
            start_time,
            agent_socket: self.dir(id.as_str()).join("sock/agent.sock"),
            oom: self.oom.watch(&*self.cgroups, id.as_str()).ok(),
            timing: LaunchTiming::default(),
        })
    }

    fn destroy(&self, id: &SandboxId, _init: Option<&OwnedFd>) -> Result<(), RuntimeError> {
        self.reap_leftover(id.as_str())
    }

    fn freeze(&self, id: &SandboxId, frozen: bool) -> Result<(), RuntimeError> {
        self.cgroups.freeze(id.as_str(), frozen).map_err(Self::cg_err(id))
    }

    fn oom_kills(&self, id: &SandboxId) -> Result<u64, RuntimeError> {
        self.cgroups.oom_kills(id.as_str()).map_err(Self::cg_err(id))
    }

    fn inject_mount(
        &self,
        id: &SandboxId,
        pid: i32,
        source: &Path,
        target: &str,
        readonly: bool,
    ) -> Result<(), RuntimeError> {
        if self.cfg.class == OciClass::Runsc {
            // The Sentry has its own mount table; a host setns cannot reach it.
            let dir = self.dir(id.as_str());
            return slot::attach(&self.cli, id, &dir, source, target, readonly);
        }
        idmapped::inject(&self.cfg.ranges, id, pid, source, target, readonly)
    }

    fn can_inject_mounts(&self) -> bool {
        // crun/runc: setns into the container's mount namespace; runsc: the
        // slot bound at launch (slot.rs).
        true
    }

    fn host_ids(&self, uid: u32, gid: u32) -> (u32, u32) {
        (self.cfg.uid_base + uid.min(ID_RANGE - 1), self.cfg.uid_base + gid.min(ID_RANGE - 1))
    }

    fn id_range(&self, id: &SandboxId) -> Option<(u32, Arc<IdRanges>)> {
        Some((self.cfg.ranges.of(id.as_str())?, self.cfg.ranges.clone()))
    }

    fn memory_usage(&self, id: &SandboxId) -> Result<u64, RuntimeError> {
        self.cgroups.memory_bytes(id.as_str()).map_err(Self::cg_err(id))
    }

    fn stats(&self, id: &SandboxId) -> Result<ember_types::SandboxStats, RuntimeError> {
        crate::cgroup_stats(self.cgroups.as_ref(), id).map_err(Self::cg_err(id))
    }

    fn boundary(&self, id: &SandboxId, pid: i32) -> Result<BoundaryReport, RuntimeError> {
        let mut r = crate::native::boundary::report(self.class(), pid, self.cgroups.as_ref(), id)?;
        r.kernel_boundary = self.cfg.class.kernel_boundary().to_string();
        // Read from the host-side init: the container's own process for
        // crun/runc; for runsc the Sentry, whose seccomp filter and capabilities
        // are gVisor's own (the workload's syscalls never reach the host).
        if r.seccomp.starts_with("filter") {
            r.seccomp = match self.cfg.class {
                OciClass::Runsc => "filter: gVisor Sentry host-syscall filter".to_string(),
                _ => format!("filter: {}", bundle::PROFILE_NAME),
            };
        }
        Ok(r)
    }

    fn leftovers(&self) -> Result<Vec<String>, RuntimeError> {
        let mut out = self
            .cgroups
            .list()
            .map_err(|source| RuntimeError::Cgroup { id: SandboxId::from_random([0; 16]), source })?;
        if let Ok(rd) = std::fs::read_dir(self.base.join("sandboxes")) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        Ok(out)
    }

    fn reap_leftover(&self, name: &str) -> Result<(), RuntimeError> {
        self.oom.forget(name);
        // Each step tolerates "already gone": destroy is idempotent. `delete
        // --force` kills the container itself (its init, in a pid namespace of
        // its own: everything in it; for runsc the whole sandbox), so no `kill`
        // before it: each run of runsc is ~15 ms on a removal's path.
        let deleted = self.cli.delete(name).is_ok();
        let dir = self.dir(name);
        rootfs::unmount(&dir)?;
        slot::unmount(&dir)?;
        let id = SandboxId::try_from(name.to_string()).unwrap_or_else(|_| SandboxId::from_random([0; 16]));
        self.cgroups.destroy(name).map_err(|source| RuntimeError::Cgroup { id: id.clone(), source })?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(RuntimeError::Prepare { what: "remove sandbox dir", path: dir, source }),
        }
        // A runtime that still lists the container after delete -f is an
        // error. Asked only when the delete failed: one that succeeded is gone.
        if !deleted {
            if let Ok(s) = self.cli.state(name) {
                let message = format!("still known to {} as {}", self.class(), s.status);
                return Err(RuntimeError::Gone { id, message });
            }
        }
        // Freed last: a range is reused only once nothing of its sandbox is left.
        self.cfg.ranges.free(name);
        Ok(())
    }

    fn exit_code(&self, id: &SandboxId) -> Option<i32> {
        read_exit_file(&self.dir(id.as_str()).join("sock").join(EXIT_FILE))
    }

    fn log_path(&self, id: &SandboxId) -> Option<PathBuf> {
        Some(self.dir(id.as_str()).join("agent.log"))
    }

    /// Every OCI class runs on the host overlay ember assembles, so its upper
    /// dir holds the sandbox's writes. gVisor included: ember does not pass
    /// `--overlay2`, the gofer writes through to the host files, and shared
    /// mappings are backed by the host file (both checked in
    /// bins/ember/tests/sandbox_snapshots.rs).
    fn writable_layer(&self, id: &SandboxId) -> Option<WritableLayer> {
        let upper = self.dir(id.as_str()).join("mnt/upper");
        upper.is_dir().then_some(WritableLayer { upper, opaque_xattr: rootfs::OPAQUE_XATTR })
    }

    fn prepare_writable_layer(
        &self,
        id: &SandboxId,
        spec: &SandboxSpec,
    ) -> Result<Option<WritableLayer>, RuntimeError> {
        // The range first: a restore shifts the layer's owners into it.
        match self.cfg.class {
            OciClass::Runsc => _ = self.cfg.ranges.use_storage(id.as_str()),
            _ => _ = self.cfg.ranges.allocate(id.as_str())?,
        }
        let upper = rootfs::prepare_layer(&self.dir(id.as_str()), spec.resources.disk_bytes)?;
        Ok(Some(WritableLayer { upper, opaque_xattr: rootfs::OPAQUE_XATTR }))
    }

    fn can_checkpoint(&self) -> bool {
        self.cfg.class == OciClass::Runsc
    }

    fn checkpoint(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.checkpoint_sandbox(id)
    }

    fn restore(&self, id: &SandboxId, spec: &SandboxSpec) -> Result<Launched, RuntimeError> {
        self.restore_sandbox(id, spec)
    }

    fn drop_checkpoint(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.drop_checkpoint_image(id)
    }

    fn save_golden_image(&self, src: &SandboxId, spec: &SandboxSpec, key: &str) -> Result<(), RuntimeError> {
        self.save_golden(src, spec, key)
    }

    fn launch_from_golden(&self, id: &SandboxId, spec: &SandboxSpec, key: &str) -> Result<Launched, RuntimeError> {
        self.launch_golden(id, spec, key)
    }

    fn drop_golden_image(&self, key: &str) -> Result<(), RuntimeError> {
        self.drop_golden(key)
    }

    fn agent_socket_path(&self, id: &SandboxId) -> Option<PathBuf> {
        Some(self.dir(id.as_str()).join("sock/agent.sock"))
    }
}
