//! The OCI bundle of one sandbox (`config.json`), generated with `oci-spec`
//! from the same inputs the native class uses: the rootfs the daemon assembled
//! (template layers + writable tmpfs, see `oci/rootfs.rs`), the host's `/usr`
//! read-only, cgroup limits, the 0 → `uid_base` user mapping, ember's seccomp
//! deny-list, the capability set of [`crate::native::KEEP_CAPS`] and the agent.
//!
//! The agent cannot inherit a listening fd through an OCI runtime, so it is
//! bind-mounted read-only at [`AGENT_PATH`] and told to listen on
//! [`SOCKET_DIR`]`/agent.sock`, a directory bound from the host: the daemon
//! connects to the same socket from outside.
use super::OPEN_FILES;
use crate::native::rootfs::ID_RANGE;
use crate::native::KEEP_CAPS;
use ember_types::{SandboxId, SandboxSpec};
use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCpuBuilder, LinuxIdMappingBuilder, LinuxMemoryBuilder, LinuxNamespaceBuilder,
    LinuxNamespaceType, LinuxPidsBuilder, LinuxResourcesBuilder, LinuxSeccompAction, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscallBuilder, Mount, MountBuilder, ProcessBuilder, RootBuilder,
    Spec, SpecBuilder, UserBuilder,
};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Where the agent binary appears inside the sandbox.
pub const AGENT_PATH: &str = "/.ember/agent";
/// The host directory with the agent's socket appears here inside the sandbox.
pub const SOCKET_DIR: &str = "/run/ember";

/// Syscalls that fail with EPERM (names of `ember_sys::seccomp`'s deny-list).
const DENIED: &[&str] = &[
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "swapon",
    "swapoff",
    "reboot",
    "sethostname",
    "setdomainname",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "acct",
    "quotactl",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "unshare",
    "setns",
    "open_by_handle_at",
    "name_to_handle_at",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "open_tree",
    "move_mount",
    "mount_setattr",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "uselib",
    "ustat",
    "sysfs",
    "vhangup",
    "kcmp",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
];

/// The seccomp profile's name, as the boundary report gives it.
pub const PROFILE_NAME: &str = "ember-default via OCI (deny-list, EPERM; clone3 ENOSYS)";

#[derive(Debug, thiserror::Error)]
#[error("building the OCI config of sandbox {id}: {message}")]
pub struct BundleError {
    pub id: String,
    pub message: String,
}

/// Inputs of one sandbox's `config.json`.
#[derive(Clone)]
pub struct BundleInputs<'a> {
    pub id: &'a SandboxId,
    pub spec: &'a SandboxSpec,
    /// The assembled root filesystem (absolute).
    pub rootfs: &'a Path,
    /// Host dir bound at [`SOCKET_DIR`].
    pub socket_dir: &'a Path,
    pub agent: &'a Path,
    /// `/<group>/<id>`, relative to each cgroup hierarchy's root.
    pub cgroups_path: PathBuf,
    /// The host id of the sandbox's root (its id range's first).
    pub uid_base: u32,
    pub env: Vec<String>,
    /// runsc runs without a user namespace of its own: the Sentry is the boundary.
    pub user_namespace: bool,
    /// A user namespace the runtime joins instead of making one (as host
    /// root, which would then own it): one owned by the sandbox's range.
    pub user_namespace_path: Option<PathBuf>,
    /// The bundle sets no `process.rlimits`: the init inherits the runtime's
    /// (runc, which [`super::cli::OciCli`] starts with
    /// [`super::OPEN_FILES`]). runc 1.1 applies them with a prlimit of the
    /// init from the host side, which needs CAP_SYS_RESOURCE over the init's
    /// user namespace: one owned by the sandbox's range gives host root no
    /// owner's rights there, and a daemon without that capability (a
    /// container's root, this CI's) fails "error setting rlimit type 7".
    pub inherit_rlimits: bool,
    /// Whether the runtime honours a seccomp rule's `errnoRet`. gVisor's
    /// `--oci-seccomp` (2022-12) does not: every errno action gives EPERM, so
    /// `clone3 → ENOSYS` would become EPERM and glibc would not fall back to
    /// `clone` (threads could not start). Without it the rule is left out.
    pub errno_ret: bool,
    /// The host pids cgroup limit ([`super::OciClass::host_pids`]).
    pub pids_limit: u64,
    /// The workspace slot bound at [`super::slot::SLOT_DIR`] (runsc only).
    pub workspace_slot: Option<&'a Path>,
    /// Where each of `spec.volumes` is bound from: its host path, or its
    /// idmapped copy ([`super::rootfs::attach_trees`]).
    pub volume_sources: Vec<PathBuf>,
    /// The host runs cgroup v2, which has no swappiness: crun refuses a
    /// config that sets it. No swap is ember's own `memory.swap.max = 0` there.
    pub cgroup_v2: bool,
}

/// `RLIMIT_NOFILE` at [`super::OPEN_FILES`], soft and hard.
fn open_files() -> Result<oci_spec::runtime::PosixRlimit, oci_spec::OciSpecError> {
    let n = OPEN_FILES;
    oci_spec::runtime::PosixRlimitBuilder::default()
        .typ(oci_spec::runtime::PosixRlimitType::RlimitNofile)
        .soft(n)
        .hard(n)
        .build()
}

fn err(id: &SandboxId) -> impl Fn(oci_spec::OciSpecError) -> BundleError + '_ {
    move |e| BundleError { id: id.to_string(), message: e.to_string() }
}

fn mount(dest: &str, typ: &str, source: &str, options: &[&str]) -> Result<Mount, oci_spec::OciSpecError> {
    MountBuilder::default()
        .destination(dest)
        .typ(typ)
        .source(source)
        .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()
}

pub fn build(b: &BundleInputs<'_>) -> Result<Spec, BundleError> {
    let e = err(b.id);
    let hostname = format!("sbx-{}", b.id.short());
    let caps: HashSet<Capability> = KEEP_CAPS
        .iter()
        .filter_map(|(_, n)| serde_json::from_value(serde_json::Value::String(n.to_string())).ok())
        .collect();
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(UserBuilder::default().uid(0u32).gid(0u32).build().map_err(&e)?)
        .args(vec![AGENT_PATH.to_string(), "--listen".to_string(), format!("unix:{SOCKET_DIR}/agent.sock")])
        .env(b.env.clone())
        .cwd("/")
        .no_new_privileges(true)
        .rlimits(if b.inherit_rlimits { Vec::new() } else { vec![open_files().map_err(&e)?] })
        .capabilities(
            oci_spec::runtime::LinuxCapabilitiesBuilder::default()
                .bounding(caps.clone())
                .effective(caps.clone())
                .permitted(caps)
                .build()
                .map_err(&e)?,
        )
        .build()
        .map_err(&e)?;

    let s = |p: &Path| p.display().to_string();
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]).map_err(&e)?,
        mount("/dev", "tmpfs", "tmpfs", &["nosuid", "strictatime", "mode=755", "size=65536k"]).map_err(&e)?,
        mount("/dev/pts", "devpts", "devpts", &["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"])
            .map_err(&e)?,
        mount("/dev/shm", "tmpfs", "shm", &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]).map_err(&e)?,
        mount(AGENT_PATH, "bind", &s(b.agent), &["bind", "ro", "nosuid", "nodev"]).map_err(&e)?,
        mount(SOCKET_DIR, "bind", &s(b.socket_dir), &["bind", "rw", "nosuid", "nodev", "noexec"]).map_err(&e)?,
    ];
    // The secrets' tmpfs, as the native class mounts it (`native::rootfs`):
    // in the container's mount namespace only, written by the agent.
    let (size, inodes) = (ember_types::secrets::TMPFS_BYTES, ember_types::secrets::MAX_SECRETS + 1);
    let opts = ["nosuid", "nodev", "noexec", "mode=755", &format!("size={size}"), &format!("nr_inodes={inodes}")];
    mounts.push(mount(ember_types::secrets::SECRETS_DIR, "tmpfs", "tmpfs", &opts).map_err(&e)?);
    // /tmp stays on the writable layer, under the disk quota: without a /tmp
    // mount in the spec gVisor mounts its own unbounded tmpfs there (memory,
    // only the memory limit stops it). For crun/runc the bind changes nothing.
    let tmp = b.rootfs.join("tmp");
    mounts.push(mount("/tmp", "bind", &s(&tmp), &["rbind", "rw", "nosuid", "nodev"]).map_err(&e)?);
    if b.spec.lower_dirs.is_empty() {
        mounts.push(mount("/usr", "bind", "/usr", &["rbind", "ro", "nosuid", "nodev"]).map_err(&e)?);
    }
    if let Some(slot) = b.workspace_slot {
        // rslave: mounts made later under the host dir reach the gofer's copy.
        let opts = ["rbind", "rw", "rslave", "nosuid", "nodev"];
        mounts.push(mount(super::slot::SLOT_DIR, "bind", &s(slot), &opts).map_err(&e)?);
    }
    for (v, source) in b.spec.volumes.iter().zip(&b.volume_sources) {
        let rw = if v.read_only { "ro" } else { "rw" };
        mounts.push(mount(&v.mount_path, "bind", &s(source), &["rbind", rw, "nosuid", "nodev"]).map_err(&e)?);
    }

    let r = &b.spec.resources;
    let mut memory = LinuxMemoryBuilder::default().limit(r.memory_bytes as i64);
    if !b.cgroup_v2 {
        memory = memory.swappiness(0u64);
    }
    let resources = LinuxResourcesBuilder::default()
        .memory(memory.build().map_err(&e)?)
        .cpu(LinuxCpuBuilder::default().quota(r.cpu_millis as i64 * 100).period(100_000u64).build().map_err(&e)?)
        .pids(LinuxPidsBuilder::default().limit(b.pids_limit as i64).build().map_err(&e)?)
        .build()
        .map_err(&e)?;

    let mut ns = vec![
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Network,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
    ];
    if b.user_namespace {
        ns.push(LinuxNamespaceType::User);
    }
    let namespaces = ns
        .into_iter()
        .map(|t| match (&b.user_namespace_path, t) {
            (Some(p), LinuxNamespaceType::User) => LinuxNamespaceBuilder::default().typ(t).path(p).build(),
            _ => LinuxNamespaceBuilder::default().typ(t).build(),
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(&e)?;
    let mut linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .resources(resources)
        .cgroups_path(b.cgroups_path.clone())
        .seccomp(seccomp(b.errno_ret, b.workspace_slot.is_some()).map_err(&e)?)
        .masked_paths(
            ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/acpi", "/proc/scsi"]
                .map(String::from)
                .to_vec(),
        )
        .readonly_paths(
            ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"].map(String::from).to_vec(),
        );
    if b.user_namespace {
        let map = LinuxIdMappingBuilder::default()
            .container_id(0u32)
            .host_id(b.uid_base)
            .size(ID_RANGE)
            .build()
            .map_err(&e)?;
        linux = linux.uid_mappings(vec![map]).gid_mappings(vec![map]);
    }
    SpecBuilder::default()
        .version("1.0.2")
        .hostname(hostname)
        .root(RootBuilder::default().path(b.rootfs).readonly(false).build().map_err(&e)?)
        .process(process)
        .mounts(mounts)
        .linux(linux.build().map_err(&e)?)
        .build()
        .map_err(&e)
}

/// ember's deny-list as an OCI seccomp profile: allow by default, EPERM for the
/// listed syscalls and for `clone` with CLONE_NEWUSER, ENOSYS for `clone3` (so
/// libc falls back to `clone`, where the flags can be inspected).
///
/// With a workspace slot (gVisor), `mount` is refused unless its flags are
/// exactly `MS_BIND`: a workspace is attached by a one-shot `runsc exec` of
/// `mount-workspace` (slot.rs), and gVisor since 2023 applies the bundle's
/// filter to exec'd processes too. The filter runs inside the Sentry, whose
/// own kernel still refuses the bind to a process without CAP_SYS_ADMIN, and
/// only that one-shot process holds it (no_new_privs, no user namespaces).
fn seccomp(errno_ret: bool, bind_inside: bool) -> Result<oci_spec::runtime::LinuxSeccomp, oci_spec::OciSpecError> {
    let names = DENIED.iter().filter(|n| !(bind_inside && **n == "mount")).map(|s| s.to_string());
    const CLONE_NEWUSER: u64 = 0x1000_0000;
    const MS_BIND: u64 = 0x1000;
    let clone_userns = LinuxSeccompArgBuilder::default()
        .index(0usize)
        .value(CLONE_NEWUSER)
        .value_two(CLONE_NEWUSER)
        .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
        .build()?;
    let not_a_bare_bind =
        LinuxSeccompArgBuilder::default().index(3usize).value(MS_BIND).op(LinuxSeccompOperator::ScmpCmpNe).build()?;
    let mut rules = vec![errno(names.collect(), 1, vec![])?, errno(vec!["clone".into()], 1, vec![clone_userns])?];
    if errno_ret {
        rules.push(errno(vec!["clone3".into()], 38, vec![])?);
    }
    if bind_inside {
        rules.push(errno(vec!["mount".into()], 1, vec![not_a_bare_bind])?);
    }
    LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .architectures(vec![oci_spec::runtime::Arch::ScmpArchX86_64])
        .syscalls(rules)
        .build()
}

/// A rule failing `names` with errno `code` (when every condition of `args` holds).
fn errno(
    names: Vec<String>,
    code: u32,
    args: Vec<oci_spec::runtime::LinuxSeccompArg>,
) -> Result<oci_spec::runtime::LinuxSyscall, oci_spec::OciSpecError> {
    let mut b = LinuxSyscallBuilder::default().names(names).action(LinuxSeccompAction::ScmpActErrno).errno_ret(code);
    if !args.is_empty() {
        b = b.args(args);
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_maps_root_limits_the_cgroup_and_runs_the_agent() {
        let id = SandboxId::from_random([7; 16]);
        let spec = SandboxSpec::host("crun");
        let inputs = BundleInputs {
            id: &id,
            spec: &spec,
            rootfs: Path::new("/data/sbx/mnt/root"),
            socket_dir: Path::new("/data/sbx/sock"),
            agent: Path::new("/opt/ember-agent"),
            cgroups_path: PathBuf::from("/ember-crun/x"),
            uid_base: 1_000_000,
            env: vec!["A=b".into()],
            user_namespace: true,
            inherit_rlimits: false,
            errno_ret: true,
            pids_limit: spec.resources.pids,
            workspace_slot: None,
            user_namespace_path: None,
            volume_sources: vec![],
            cgroup_v2: false,
        };
        let v = serde_json::to_value(build(&inputs).unwrap()).unwrap();
        assert_eq!(v["process"]["args"][0], AGENT_PATH);
        assert_eq!(v["process"]["args"][2], "unix:/run/ember/agent.sock");
        assert_eq!(v["linux"]["uidMappings"][0]["hostID"], 1_000_000);
        assert_eq!(v["linux"]["resources"]["memory"]["limit"], spec.resources.memory_bytes as i64);
        assert_eq!(v["linux"]["resources"]["pids"]["limit"], spec.resources.pids as i64);
        assert_eq!(v["linux"]["cgroupsPath"], "/ember-crun/x");
        assert_eq!(v["linux"]["resources"]["memory"]["swappiness"], 0);
        let caps = v["process"]["capabilities"]["bounding"].as_array().unwrap();
        assert!(caps.iter().any(|c| c == "CAP_SETUID"));
        assert!(!caps.iter().any(|c| c == "CAP_SYS_ADMIN"));
        let denied = &v["linux"]["seccomp"]["syscalls"][0]["names"];
        assert!(denied.as_array().unwrap().iter().any(|n| n == "keyctl"));
        assert!(denied.as_array().unwrap().iter().any(|n| n == "mount"), "no slot: every mount refused");
        // With a workspace slot (gVisor) a bare bind gets through, nothing else.
        let slot = Path::new("/data/sbx/ws");
        let gv = serde_json::to_value(build(&BundleInputs { workspace_slot: Some(slot), ..inputs.clone() }).unwrap())
            .unwrap();
        let rules = gv["linux"]["seccomp"]["syscalls"].as_array().unwrap();
        assert!(!rules[0]["names"].as_array().unwrap().iter().any(|n| n == "mount"));
        let mount = rules.iter().find(|r| r["names"][0] == "mount").expect("a rule for mount");
        assert_eq!(mount["args"][0]["index"], 3);
        assert_eq!(mount["args"][0]["value"], 0x1000, "MS_BIND");
        assert_eq!(mount["args"][0]["op"], "SCMP_CMP_NE");
        assert_eq!(mount["action"], "SCMP_ACT_ERRNO");
        let usr_bound =
            |v: &serde_json::Value| v["mounts"].as_array().unwrap().iter().any(|m| m["destination"] == "/usr");
        assert!(usr_bound(&v), "the host template borrows the host's /usr");
        assert_eq!(v["process"]["rlimits"][0]["hard"], OPEN_FILES);
        let runc =
            serde_json::to_value(build(&BundleInputs { inherit_rlimits: true, ..inputs.clone() }).unwrap()).unwrap();
        assert!(runc["process"]["rlimits"].as_array().is_none_or(|r| r.is_empty()), "runc inherits its own");
        let no_userns = BundleInputs { user_namespace: false, ..inputs };
        let v = serde_json::to_value(build(&no_userns).unwrap()).unwrap();
        assert!(v["linux"]["uidMappings"].is_null());
        let image = SandboxSpec { lower_dirs: vec![PathBuf::from("/layers/a")], ..spec.clone() };
        let v =
            serde_json::to_value(build(&BundleInputs { spec: &image, cgroup_v2: true, ..no_userns }).unwrap()).unwrap();
        assert!(!usr_bound(&v), "an image brings its own /usr");
        assert!(v["linux"]["resources"]["memory"]["swappiness"].is_null(), "cgroup v2 has no swappiness");
    }
}
