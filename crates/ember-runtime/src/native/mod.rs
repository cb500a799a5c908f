//! The native runtime class: ember's own namespaces, cgroups, seccomp filter and
//! overlay rootfs, with the static agent exec'd as the sandbox's PID 1.
//!
//! Launch, in steps: create the cgroups; bind the agent's listening socket in the
//! sandbox's host dir; clone into new user/mount/pid/uts/ipc/net namespaces;
//! write the id maps and attach to the cgroups while the child waits; the child
//! builds its root, pivots, drops capabilities, loads seccomp and execs the agent
//! by fd; `GET /ping` over the socket marks it ready.
pub(crate) mod boundary;
mod dirs;
pub(crate) mod idmapped;
pub mod rootfs;
mod weight;
pub use weight::KEEP_AFTER_UP;

use crate::idrange::IdRanges;
use crate::{LaunchTiming, Launched, NetJoin, Runtime, RuntimeError, WritableLayer};
use ember_cgroups::{Cgroups, CpuShare, Limits};
use ember_sys::spawn::{spawn_sandbox_from, FsOp, LaunchFds, LaunchPlan, SpawnFrom};
use ember_types::{BoundaryReport, SandboxId, SandboxSpec};
use idmapped::Idmapped;
use rootfs::{cstr, RootfsPlan, ID_RANGE};
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Capabilities kept in the bounding set: what the agent needs to run commands
/// as other users, signal them and manage files for them. No CAP_SYS_ADMIN, no
/// CAP_NET_RAW (no raw sockets), no CAP_SYS_PTRACE, no CAP_MKNOD.
pub const KEEP_CAPS: &[(u32, &str)] = &[
    (0, "CAP_CHOWN"),
    (1, "CAP_DAC_OVERRIDE"),
    (3, "CAP_FOWNER"),
    (4, "CAP_FSETID"),
    (5, "CAP_KILL"),
    (6, "CAP_SETGID"),
    (7, "CAP_SETUID"),
    (8, "CAP_SETPCAP"),
    (10, "CAP_NET_BIND_SERVICE"),
    (29, "CAP_AUDIT_WRITE"),
    (31, "CAP_SETFCAP"),
];

/// Configuration of the native class, fixed at daemon start.
#[derive(Clone, Debug)]
pub struct NativeConfig {
    /// `<data-dir>`; sandboxes live under `sandboxes/<id>`, templates under `templates/`.
    pub data_dir: PathBuf,
    /// The static `ember-agent` binary.
    pub agent_path: PathBuf,
    /// First host uid/gid of the storage range (owner of layers on disk);
    /// sandboxes get the ranges after it ([`crate::idrange`]).
    pub uid_base: u32,
    /// How many sandbox ranges (`ember serve --id-ranges`): the cap on
    /// sandboxes of this class.
    pub id_ranges: u32,
    /// How long a sandbox init gets from release to exec, and the agent to
    /// answer ([`crate::READY_TIMEOUT`] unless `ember serve --ready-timeout`).
    pub ready_timeout: Duration,
}

pub struct NativeRuntime {
    cfg: NativeConfig,
    cgroups: Arc<dyn Cgroups>,
    /// The agent binary, opened once: every sandbox execs this exact file.
    agent_fd: OwnedFd,
    seccomp: Vec<ember_sys::seccomp::BpfProgram>,
    host_template: PathBuf,
    ranges: Arc<IdRanges>,
    /// The mount namespace sandboxes are cloned from (`None`: the host's,
    /// when it could not be made): its table does not grow with them.
    launch_ns: Option<ember_sys::mountns::LaunchNs>,
    /// Where its sandboxes' OOM kills are reported, shared.
    oom: crate::oom::OomSources,
    /// The node's recovery, and the sandboxes kept ahead through it.
    recovery: Arc<weight::Recovery>,
}

impl NativeRuntime {
    pub fn new(cfg: NativeConfig, cgroups: Arc<dyn Cgroups>) -> Result<NativeRuntime, RuntimeError> {
        let agent = std::fs::File::open(&cfg.agent_path)
            .map_err(|e| RuntimeError::Agent { path: cfg.agent_path.clone(), message: e.to_string() })?;
        check_static(&cfg.agent_path)?;
        let host_template = rootfs::ensure_host_template(&cfg.data_dir.join("templates"), cfg.uid_base)?;
        let sb = cfg.data_dir.join("sandboxes");
        std::fs::create_dir_all(&sb).map_err(|source| RuntimeError::Prepare {
            what: "sandboxes dir",
            path: sb.clone(),
            source,
        })?;
        // Before the launch namespace, which keeps this one mount of the data dir's.
        dirs::in_memory(&sb);
        Ok(NativeRuntime {
            launch_ns: launch_ns(&cfg.data_dir),
            ranges: Arc::new(IdRanges::new(cfg.uid_base, cfg.id_ranges)?),
            seccomp: ember_sys::seccomp::default_filters()?,
            agent_fd: agent.into(),
            cfg,
            cgroups,
            host_template,
            oom: Default::default(),
            recovery: Default::default(),
        })
    }

    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.cfg.data_dir.join("sandboxes").join(id)
    }

    /// The daemon's id ranges, which the OCI classes share with this one.
    pub fn id_ranges(&self) -> Arc<IdRanges> {
        self.ranges.clone()
    }

    pub fn cgroups(&self) -> &Arc<dyn Cgroups> {
        &self.cgroups
    }

    /// This node starts (`true`) or ends re-creating a dead node's
    /// sandboxes: meanwhile a launch someone waits on keeps its launch's
    /// weight once up, and after the end each is set back to its limit's
    /// share, [`KEEP_AFTER_UP`] after it was up at the earliest
    /// (`weight.rs`). The caller lowers and raises the group.
    pub fn recovering(&self, on: bool) {
        self.recovery.set(&self.cgroups, on);
    }

    fn plan(
        &self,
        id: &SandboxId,
        spec: &SandboxSpec,
        dir: &Path,
        net: Option<&NetJoin>,
        ids: &Idmapped,
    ) -> LaunchPlan {
        let hostname = format!("sbx-{}", id.short());
        // An image brings its own /usr; only the host template borrows the host's.
        let (lowers, binds) = if spec.lower_dirs.is_empty() {
            (vec![self.host_template.clone()], vec![PathBuf::from("/usr")])
        } else {
            (spec.lower_dirs.clone(), vec![])
        };
        let rootfs = RootfsPlan {
            sandbox_dir: dir,
            lower_dirs: &lowers,
            lower_trees: &ids.lowers,
            host_binds: &binds,
            volumes: &spec.volumes,
            volume_trees: &ids.volumes,
            layer_tree: ids.layer,
            disk_bytes: spec.resources.disk_bytes,
            hostname: &hostname,
        };
        let map = format!("0 {} {}\n", ids.base, ID_RANGE);
        let mut fs_ops = rootfs.ops();
        if let Some(n) = net {
            fs_ops.push(FsOp::WriteFile {
                path: cstr(rootfs.new_root().join("etc/resolv.conf")),
                contents: format!("nameserver {}\noptions timeout:2 attempts:2\n", n.resolver).into_bytes(),
                mode: 0o644,
            });
        }
        LaunchPlan {
            hostname: cstr(&hostname),
            fs_ops,
            new_root: cstr(rootfs.new_root()),
            keep_caps: KEEP_CAPS.iter().fold(0u64, |m, (c, _)| m | 1 << c),
            seccomp: self.seccomp.clone(),
            argv: vec![cstr("ember-agent")],
            env: agent_env(spec, &hostname),
            uid_map: map.clone(),
            gid_map: map,
            ns_owner: ids.base,
            exec_timeout: self.cfg.ready_timeout,
            open_files: crate::oci::OPEN_FILES.min(ember_sys::process::open_files_hard_limit().unwrap_or(u64::MAX)),
        }
    }

    fn launch_with(&self, id: &SandboxId, spec: &SandboxSpec, net: Option<&NetJoin>) -> Result<Launched, RuntimeError> {
        let t0 = Instant::now();
        let name = id.as_str();
        let dir = self.sandbox_dir(name);
        let prep = |what| {
            let path = dir.clone();
            move |source| RuntimeError::Prepare { what, path, source }
        };
        std::fs::create_dir_all(&dir).map_err(prep("sandbox dir"))?;
        let mut trees = idmapped::trees(&self.ranges, &self.host_template, name, spec)?;
        let base = trees.base;
        let upper = rootfs::prepare_layer(&dir.join("mnt"), spec.resources.disk_bytes, base)?;
        if self.launch_ns.is_some() {
            trees.for_launch_ns(&dir.join("mnt"), &spec.volumes)?;
        }
        // The child's mount plan walks these paths before `pivot_root`, where a
        // symlink in a restored layer would name a host path.
        let mounted: Vec<&str> = spec.volumes.iter().map(|v| v.mount_path.trim_start_matches('/')).collect();
        rootfs::check_layer_root(&upper, &[&["usr"], mounted.as_slice()].concat())?;
        let limits = Limits {
            memory_bytes: spec.resources.memory_bytes,
            cpu_millis: spec.resources.cpu_millis,
            pids: spec.resources.pids,
        };
        self.cgroups.create(name, &limits).map_err(Self::cg_err(id))?;
        // Until its agent is up a refill's group weighs the least
        // (crate::in_background), any other launch's the most: someone waits
        // on it, and a node's busy sandboxes left a rebind's launch a
        // fortieth of their group's CPU (docs/performance.md).
        let launch_share = match crate::launching_in_background() {
            true => CpuShare::Background,
            false => CpuShare::Foreground,
        };
        self.cgroups.set_cpu_share(name, launch_share).map_err(Self::cg_err(id))?;
        let oom = self.oom.watch(&*self.cgroups, name).map_err(Self::cg_err(id))?;
        let t_cg = t0.elapsed();

        let sock = dir.join("agent.sock");
        let _ = std::fs::remove_file(&sock);
        let listener = UnixListener::bind(&sock).map_err(prep("agent socket"))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("agent.log"))
            .map_err(prep("agent log"))?;
        rootfs::check_image_root(&spec.lower_dirs)?;
        let plan = self.plan(id, spec, &dir, net, &trees.raw());
        let fds = LaunchFds { exe: self.agent_fd.as_fd(), listen: listener.as_fd(), log: log.as_fd() };
        let cg = &self.cgroups;
        // The init is born in its cgroups: on v1 the spawning thread enters
        // them first, on v2 it is cloned into its directory; where neither
        // can be (a kernel before 5.7 on v2), it is attached by pid before it
        // goes on.
        let born_in = AtomicBool::new(false);
        // While the node rebinds its sandboxes' group is lowered: a launch
        // someone waits on is born out of its CPU cgroup, sets up at the
        // daemon's weight, and moves itself in before exec (v1).
        let but_cpu = launch_share == CpuShare::Foreground && cg.group_lowered();
        let cpu_tasks = if but_cpu { cg.open_cpu_tasks(name).map_err(Self::cg_err(id))? } else { None };
        let enter = || {
            let entered = match &cpu_tasks {
                Some(_) => cg.enter_thread_but_cpu(name),
                None => cg.enter_thread(name),
            };
            born_in.store(entered.map_err(|e| e.to_string())?, Ordering::Relaxed);
            Ok(())
        };
        let setup = |pid, cloned_into: bool| match cloned_into || born_in.load(Ordering::Relaxed) {
            true => Ok(()),
            false => cg.attach(name, pid).map_err(|e| e.to_string()),
        };
        let netns = net.map(|n| ember_sys::netns::open(&n.netns)).transpose()?;
        // v2: cloned into its cgroup (`CLONE_INTO_CGROUP`), where the kernel has it.
        let cg_dir = cg.open_dir(name).map_err(Self::cg_err(id))?;
        let from = SpawnFrom {
            // The namespaces launches clone from, if not the host's.
            mounts: self.launch_ns.as_ref().map(|n| n.as_fd()),
            netns: netns.as_ref().map(|f| f.as_fd()),
            enter_cgroups: Some(&enter),
            cpu_tasks: cpu_tasks.as_ref().map(|f| f.as_fd()),
            cgroup_dir: cg_dir.as_ref().map(|f| f.as_fd()),
        };
        let spawned = spawn_sandbox_from(from, &plan, fds, setup)
            .map_err(|source| RuntimeError::Spawn { id: id.clone(), source })?;
        drop((listener, trees));
        let t_spawn = t0.elapsed();
        crate::ping_agent(&sock, self.cfg.ready_timeout)
            .or_else(|message| ended_before_ready(&spawned.pidfd, spec, message))
            .map_err(|message| RuntimeError::AgentNotReady { id: id.clone(), message })?;
        // A sandbox left at the least weight would starve its user's
        // commands, at the most its neighbours' (but while the node
        // recovers, `weight.rs`): failing here fails the launch, which
        // reaps it.
        self.recovery.settle(&**cg, name, launch_share, limits.cpu_millis).map_err(Self::cg_err(id))?;
        let total = t0.elapsed();
        let start_time = boundary::start_time(spawned.pid).unwrap_or(0);
        Ok(Launched {
            pid: spawned.pid,
            pidfd: spawned.pidfd,
            start_time,
            agent_socket: sock,
            oom: Some(oom),
            timing: LaunchTiming::from_marks(t_cg, t_spawn, total),
        })
    }

    fn cg_err(id: &SandboxId) -> impl FnOnce(ember_cgroups::CgroupError) -> RuntimeError + '_ {
        move |source| RuntimeError::Cgroup { id: id.clone(), source }
    }
}

/// The launch namespace of a daemon whose data dir is `data_dir`
/// (`ember_sys::mountns`): what a launch reads by path (the data dir's
/// layers and templates, `/usr` for the host template, `/dev`, `/proc`,
/// `/sys` for the cgroups the spawning thread attaches the child to, and
/// the tmpfs of the sandboxes' dirs, where the child finds its layer's
/// mount point), none of the mounts ember makes in the data dir per
/// sandbox and workspace.
/// Without one (a kernel or host that refuses it) launches copy the host's
/// table, as before.
fn launch_ns(data_dir: &Path) -> Option<ember_sys::mountns::LaunchNs> {
    match ember_sys::mountns::LaunchNs::for_dir(data_dir, &["/sys"], &["sandboxes"]) {
        Ok(ns) => Some(ns),
        Err(e) => {
            tracing::warn!(error = %e, "no launch mount namespace: launches copy the host's mount table");
            None
        }
    }
}

/// A ping that failed because the init already exited. The agent ends with
/// its entrypoint, so an entrypoint that exits at once (`true`) can end the
/// sandbox before the first ping is answered: that is a launched sandbox that
/// ended, and the monitor records the exit code (`Exited(n)`) as its reason.
/// Without an entrypoint the agent has no reason to exit, so its exit stays a
/// readiness failure, named as such.
fn ended_before_ready(pidfd: &OwnedFd, spec: &SandboxSpec, message: String) -> Result<(), String> {
    // The listening socket closes as the agent exits, a moment before the
    // kernel marks it exited (a PID 1 first waits for its namespace to empty).
    match ember_sys::pidfd::wait_exited(pidfd, Duration::from_secs(2)) {
        Ok(true) if !spec.entrypoint.is_empty() => Ok(()),
        Ok(true) => Err(format!("the agent exited before it answered ({message}); see its agent.log")),
        _ => Err(message),
    }
}

/// The agent's environment: its control variables (`EMBER_AGENT_*`, stripped from
/// commands) and the sandbox's own env.
pub(crate) fn agent_env(spec: &SandboxSpec, hostname: &str) -> Vec<CString> {
    let mut env = vec![
        format!("HOSTNAME={hostname}"),
        "EMBER_AGENT_LISTEN_FD=3".to_string(),
        format!("EMBER_AGENT_UID={}", spec.user.uid),
        format!("EMBER_AGENT_GID={}", spec.user.gid),
        format!("EMBER_AGENT_MEMORY_LIMIT_BYTES={}", spec.resources.memory_bytes),
        format!("EMBER_AGENT_CPU_MILLIS={}", spec.resources.cpu_millis),
    ];
    if !spec.env.contains_key("PATH") {
        env.push("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    }
    if let Some(w) = &spec.workdir {
        env.push(format!("EMBER_AGENT_WORKDIR={w}"));
    }
    if !spec.entrypoint.is_empty() {
        let ep = serde_json::to_string(&spec.entrypoint).unwrap_or_default();
        env.push(format!("EMBER_AGENT_ENTRYPOINT={ep}"));
        if !spec.secret_names.is_empty() {
            // The names only: the values come over the socket once it is up.
            env.push("EMBER_AGENT_AWAIT_SECRETS=1".to_string());
        }
    }
    if !spec.env.contains_key("EXECD_ENVS") {
        // The file the SDK's `commands.set_env` appends to; the agent creates
        // it at boot, owned by the default user, and merges it into every command.
        env.push("EXECD_ENVS=/opt/opensandbox/.env".to_string());
    }
    for (k, v) in &spec.env {
        if !k.starts_with("EMBER_AGENT_") {
            env.push(format!("{k}={v}"));
        }
    }
    env.into_iter().filter_map(|s| CString::new(s).ok()).collect()
}

/// Refuses a dynamically linked agent: it could not run in an image without the
/// host's libc.
pub(crate) fn check_static(path: &Path) -> Result<(), RuntimeError> {
    let bytes = std::fs::read(path).map_err(|e| RuntimeError::Agent { path: path.into(), message: e.to_string() })?;
    let err = |m: &str| RuntimeError::Agent { path: path.into(), message: m.to_string() };
    if bytes.get(..4) != Some(b"\x7fELF") || bytes.get(4) != Some(&2) {
        return Err(err("not a 64-bit ELF file"));
    }
    let u16at = |o: usize| bytes.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u64at = |o: usize| bytes.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize);
    let (phoff, phentsize, phnum) = (u64at(0x20), u16at(0x36), u16at(0x38));
    let (Some(phoff), Some(phentsize), Some(phnum)) = (phoff, phentsize, phnum) else {
        return Err(err("truncated ELF header"));
    };
    for i in 0..phnum {
        if bytes.get(phoff + i * phentsize..phoff + i * phentsize + 4) == Some(&3u32.to_le_bytes()) {
            return Err(err("dynamically linked (has PT_INTERP); build it with scripts/build-agent.sh"));
        }
    }
    Ok(())
}

impl Runtime for NativeRuntime {
    fn class(&self) -> &'static str {
        "native"
    }

    fn launch(&self, id: &SandboxId, spec: &SandboxSpec) -> Result<Launched, RuntimeError> {
        self.launch_with(id, spec, None)
    }

    fn launch_in_network(&self, id: &SandboxId, spec: &SandboxSpec, net: &NetJoin) -> Result<Launched, RuntimeError> {
        self.launch_with(id, spec, Some(net))
    }

    fn launch_table_mounts(&self) -> Option<usize> {
        match &self.launch_ns {
            Some(ns) => ns.mount_points().ok().map(|p| p.len()),
            None => std::fs::read_to_string("/proc/self/mountinfo").ok().map(|t| t.lines().count()),
        }
    }

    fn adopt(&self, id: &SandboxId, pid: i32, start_time: u64) -> Result<Launched, RuntimeError> {
        let gone = |m: &str| RuntimeError::Gone { id: id.clone(), message: m.to_string() };
        if boundary::start_time(pid) != Some(start_time) {
            return Err(gone("its init process no longer exists"));
        }
        let pidfd = ember_sys::pidfd::pidfd_open(pid).map_err(|e| gone(&e.to_string()))?;
        let base = boundary::root_host_id(pid).ok_or_else(|| gone("its uid_map is unreadable"))?;
        // The pid could have been reused between the check and the open.
        if boundary::start_time(pid) != Some(start_time) || !self.cgroups.exists(id.as_str()) {
            return Err(gone("its init process or cgroup no longer exists"));
        }
        self.ranges.adopt(id.as_str(), base)?;
        let oom = self.oom.watch(&*self.cgroups, id.as_str()).ok();
        Ok(Launched {
            pid,
            pidfd,
            start_time,
            agent_socket: self.sandbox_dir(id.as_str()).join("agent.sock"),
            oom,
            timing: LaunchTiming::default(),
        })
    }

    fn destroy(&self, id: &SandboxId, init: Option<&OwnedFd>) -> Result<(), RuntimeError> {
        if let Some(fd) = init {
            // Killing PID 1 of the pid namespace kills every process in it.
            ember_sys::pidfd::pidfd_signal(fd, 9)?;
        }
        self.reap_leftover(id.as_str())
    }

    fn claimed(&self, id: &SandboxId, spec: &SandboxSpec) -> Result<(), RuntimeError> {
        let cpu_millis = spec.resources.cpu_millis;
        self.recovery.hasten(&*self.cgroups, id.as_str(), cpu_millis).map_err(Self::cg_err(id))
    }

    fn freeze(&self, id: &SandboxId, frozen: bool) -> Result<(), RuntimeError> {
        self.cgroups.freeze(id.as_str(), frozen).map_err(Self::cg_err(id))
    }

    fn reset(&self, id: &SandboxId, init_pid: i32) -> Result<(), RuntimeError> {
        let name = id.as_str();
        let others = || -> Result<Vec<i32>, RuntimeError> {
            let procs = self.cgroups.procs(name).map_err(Self::cg_err(id))?;
            Ok(procs.into_iter().filter(|p| *p != init_pid).collect())
        };
        if others()?.is_empty() {
            // The usual case: the last command left nothing behind.
            return Ok(());
        }
        // Frozen, nothing in the sandbox can fork or exit, so every pid read
        // from cgroup.procs still names the process it named (no reuse race).
        self.cgroups.freeze(name, true).map_err(Self::cg_err(id))?;
        let killed = others().and_then(|pids| {
            pids.into_iter().try_for_each(|p| ember_sys::pidfd::kill(p, 9).map_err(RuntimeError::from))
        });
        self.cgroups.freeze(name, false).map_err(Self::cg_err(id))?;
        killed?;
        // SIGKILL lands on thaw; the agent (PID 1 there) reaps them.
        for _ in 0..2_000 {
            if others()?.is_empty() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(RuntimeError::Gone { id: id.clone(), message: "processes survived the reset".into() })
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
        idmapped::inject(&self.ranges, id, pid, source, target, readonly)
    }

    fn host_ids(&self, uid: u32, gid: u32) -> (u32, u32) {
        (self.cfg.uid_base + uid.min(ID_RANGE - 1), self.cfg.uid_base + gid.min(ID_RANGE - 1))
    }

    fn id_range(&self, id: &SandboxId) -> Option<(u32, Arc<IdRanges>)> {
        Some((self.ranges.of(id.as_str())?, self.ranges.clone()))
    }

    fn memory_usage(&self, id: &SandboxId) -> Result<u64, RuntimeError> {
        self.cgroups.memory_bytes(id.as_str()).map_err(Self::cg_err(id))
    }

    fn stats(&self, id: &SandboxId) -> Result<ember_types::SandboxStats, RuntimeError> {
        crate::cgroup_stats(self.cgroups.as_ref(), id).map_err(Self::cg_err(id))
    }

    fn boundary(&self, id: &SandboxId, pid: i32) -> Result<BoundaryReport, RuntimeError> {
        boundary::report(self.class(), pid, self.cgroups.as_ref(), id)
    }

    fn leftovers(&self) -> Result<Vec<String>, RuntimeError> {
        let mut out = self
            .cgroups
            .list()
            .map_err(|source| RuntimeError::Cgroup { id: SandboxId::from_random([0; 16]), source })?;
        if let Ok(rd) = std::fs::read_dir(self.cfg.data_dir.join("sandboxes")) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
        Ok(out)
    }

    fn log_path(&self, id: &SandboxId) -> Option<PathBuf> {
        Some(self.sandbox_dir(id.as_str()).join("agent.log"))
    }

    fn writable_layer(&self, id: &SandboxId) -> Option<WritableLayer> {
        let upper = self.sandbox_dir(id.as_str()).join("mnt/upper");
        upper.is_dir().then_some(WritableLayer { upper, opaque_xattr: rootfs::OPAQUE_XATTR })
    }

    fn prepare_writable_layer(
        &self,
        id: &SandboxId,
        spec: &SandboxSpec,
    ) -> Result<Option<WritableLayer>, RuntimeError> {
        let dir = self.sandbox_dir(id.as_str());
        std::fs::create_dir_all(&dir).map_err(|source| RuntimeError::Prepare {
            what: "sandbox dir",
            path: dir.clone(),
            source,
        })?;
        let base = match idmapped::supported(&self.ranges, &self.host_template) {
            true => self.ranges.allocate(id.as_str())?,
            false => self.ranges.use_storage(id.as_str()),
        };
        let upper = rootfs::prepare_layer(&dir.join("mnt"), spec.resources.disk_bytes, base)?;
        Ok(Some(WritableLayer { upper, opaque_xattr: rootfs::OPAQUE_XATTR }))
    }

    fn reap_leftover(&self, name: &str) -> Result<(), RuntimeError> {
        self.oom.forget(name);
        let id = SandboxId::try_from(name.to_string()).unwrap_or_else(|_| SandboxId::from_random([0; 16]));
        self.cgroups.destroy(name).map_err(|source| RuntimeError::Cgroup { id, source })?;
        let dir = self.sandbox_dir(name);
        rootfs::release_layer(&dir.join("mnt"))?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(RuntimeError::Prepare { what: "remove sandbox dir", path: dir, source }),
        }
        // Freed last: a range is reused only once nothing of its sandbox is left.
        self.ranges.free(name);
        Ok(())
    }
}
