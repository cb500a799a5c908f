//! The crun reference's setup: what it needs installed (checked here, never
//! installed: `scripts/bench-setup.sh` does that), and its containers, built
//! by ember-runtime's own functions so they do the work of a `host` sandbox:
//! tmpfs + overlay over the host template layer, `config.json` from
//! `ember_runtime::oci::bundle::build` (ember's seccomp deny-list,
//! capabilities, default limits, 0 → uid base mapping, /usr read-only), and
//! ember's agent as the container's process, serving on a socket this process
//! made and crun hands over as fd 3 (as native hands its agent fd 3).
use ember_runtime::oci::cli::OciCli;
use ember_runtime::oci::{prepare_bundle, BundlePlan, OciClass};
use ember_types::{SandboxId, SandboxSpec};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// `ember serve --uid-base`'s default: the same host ids as the daemon's sandboxes.
pub const UID_BASE: u32 = 1_000_000_000;
/// Installs what the benchmarks need and mounts what crun needs.
pub const SETUP: &str = "scripts/bench-setup.sh";
/// How long a started agent may take to answer `/ping`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How the reference still differs from an ember sandbox, for the report.
pub const DIFFERENCES: &[&str] = &[
    "ember: one HTTP request to a daemon (loopback; the daemon also persists a record and \
     creates the cgroups with its own manager); crun: two CLI processes (create, start) \
     forked from this one, crun creating the cgroups from cgroupsPath",
    "ember native mounts the overlay inside its clone with syscalls and loads its seccomp BPF \
     itself; the reference mounts tmpfs + overlay on the host with mount(8), as ember's crun \
     class does, and crun compiles the same deny-list with libseccomp",
    "exec: ember's agent runs the command as uid 1000 and streams it over HTTP; \
     `crun exec` joins the namespaces as root from a new CLI process",
];

/// What crun's reference needs: its version line and ember's static agent,
/// or what is missing and how to get it. Changes nothing on the host.
pub fn preflight() -> Result<(String, PathBuf), String> {
    let cli = OciCli::new("crun", "/nonexistent", vec![]);
    let version = cli.version().map_err(|e| format!("crun does not run ({e}): run {SETUP}, or pass --no-crun"))?;
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let cgroups = std::fs::read_to_string("/proc/cgroups").unwrap_or_default();
    if needs_hugetlb(&mounts, &cgroups) {
        return Err(format!(
            "crun refuses this cgroup v1 layout without a hugetlb hierarchy (/sys/fs/cgroup/hugetlb): run {SETUP}"
        ));
    }
    let agent = match std::env::var_os("EMBER_AGENT_BIN") {
        // Absolute: crun resolves the bundle's paths from its own directory.
        Some(p) => std::path::absolute(&p).map_err(|e| format!("EMBER_AGENT_BIN {p:?}: {e}"))?,
        None => crate::serve::default_agent().map_err(|e| format!("{e:#}; or set EMBER_AGENT_BIN"))?,
    };
    Ok((version, agent))
}

/// crun refuses a v1/hybrid cgroup layout whose kernel has the hugetlb
/// controller but no hierarchy mounts it.
pub fn needs_hugetlb(mounts: &str, cgroups: &str) -> bool {
    let rows: Vec<Vec<&str>> =
        mounts.lines().map(|l| l.split_whitespace().collect()).filter(|f: &Vec<&str>| f.len() >= 4).collect();
    let unified_root = rows.iter().any(|f| f[1] == "/sys/fs/cgroup" && f[2] == "cgroup2");
    let v1 = rows.iter().any(|f| f[2] == "cgroup" && f[1].starts_with("/sys/fs/cgroup/"));
    let has_hugetlb = rows.iter().any(|f| f[2] == "cgroup" && f[3].split(',').any(|o| o == "hugetlb"));
    let kernel_has = cgroups
        .lines()
        .any(|l| l.split_whitespace().next() == Some("hugetlb") && l.split_whitespace().nth(3) == Some("1"));
    !unified_root && v1 && !has_hugetlb && kernel_has
}

/// A temp dir with the host template layer, crun's state root and one dir per
/// container; its cgroup group in every hierarchy. All removed on drop.
pub struct Reference {
    dir: PathBuf,
    template: PathBuf,
    agent: PathBuf,
    group: String,
    pub cli: OciCli,
    spec: SandboxSpec,
    seq: AtomicU64,
}

/// One started container: ready once its agent answered.
pub struct Container {
    pub id: SandboxId,
    dir: PathBuf,
}

impl Reference {
    pub fn new(agent: PathBuf) -> Result<Reference, String> {
        let group = format!("ember-bench-crun-{}", std::process::id());
        let dir = std::env::temp_dir().join(&group);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("state")).map_err(|e| format!("{}: {e}", dir.display()))?;
        let template = ember_runtime::native::rootfs::ensure_host_template(&dir.join("templates"), UID_BASE)
            .map_err(|e| format!("the host template layer: {e}"))?;
        let cli = OciCli::new("crun", dir.join("state"), vec![]);
        Ok(Reference { template, agent, cli, spec: SandboxSpec::host("crun"), seq: AtomicU64::new(0), group, dir })
    }

    /// From nothing to an agent that answered `GET /ping`: rootfs, bundle,
    /// `crun create` (the listening socket as fd 3), `crun start`, ping.
    pub fn start(&self) -> Result<Container, String> {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&std::process::id().to_le_bytes());
        // Bytes 6 and 8 carry the UUID version and variant.
        b[10..16].copy_from_slice(&n.to_le_bytes()[..6]);
        let id = SandboxId::from_random(b);
        let c = Container { dir: self.dir.join("sandboxes").join(id.as_str()), id };
        std::fs::create_dir_all(&c.dir).map_err(|e| format!("{}: {e}", c.dir.display()))?;
        if let Err(e) = self.launch(&c) {
            let _ = self.remove(&c);
            return Err(e);
        }
        Ok(c)
    }

    fn launch(&self, c: &Container) -> Result<(), String> {
        let prepared = prepare_bundle(&BundlePlan {
            id: &c.id,
            spec: &self.spec,
            dir: &c.dir,
            host_template: &self.template,
            agent: &self.agent,
            cgroups_path: PathBuf::from("/").join(&self.group).join(c.id.as_str()),
            uid_base: UID_BASE,
            lower_trees: &[],
            volume_trees: &[],
            userns: None,
            class: OciClass::Crun,
            workspace_slot: None,
            listen_fd: true,
            cgroup_v2: ember_cgroups::unified(Path::new("/sys/fs/cgroup")),
        })
        .map_err(|e| format!("{e}: {}", error_chain(&e)))?;
        let sock = prepared.socket_dir.join("agent.sock");
        let listener = UnixListener::bind(&sock).map_err(|e| format!("{}: {e}", sock.display()))?;
        let log = c.dir.join("agent.log");
        self.cli
            .create_with_listener(c.id.as_str(), &prepared.bundle_dir, &log, listener.into())
            .map_err(|e| e.to_string())?;
        self.cli.start(c.id.as_str()).map_err(|e| e.to_string())?;
        ember_runtime::ping_agent(&sock, READY_TIMEOUT)
    }

    /// `crun delete --force`, then the overlay and tmpfs and the dir.
    pub fn remove(&self, c: &Container) -> Result<(), String> {
        let deleted = self.cli.delete(c.id.as_str()).map_err(|e| e.to_string());
        ember_runtime::oci::rootfs::unmount(&c.dir).map_err(|e| format!("{e}: {}", error_chain(&e)))?;
        std::fs::remove_dir_all(&c.dir).map_err(|e| format!("{}: {e}", c.dir.display()))?;
        deleted
    }

    /// The container's init as the host sees it: seccomp mode and uid map.
    pub fn init_boundary(&self, c: &Container) -> Result<(String, String), String> {
        let pid = self.cli.state(c.id.as_str()).map_err(|e| e.to_string())?.pid;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| e.to_string())?;
        let seccomp = status.lines().find_map(|l| l.strip_prefix("Seccomp:")).unwrap_or("?").trim().to_string();
        let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).map_err(|e| e.to_string())?;
        Ok((seccomp, map.split_whitespace().collect::<Vec<_>>().join(" ")))
    }
}

impl Drop for Reference {
    fn drop(&mut self) {
        // crun removes each container's cgroup; the group above them is ours.
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        for f in mounts.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()) {
            if f.len() >= 3 && (f[2] == "cgroup" || f[2] == "cgroup2") {
                let _ = std::fs::remove_dir(Path::new(f[1]).join(&self.group));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut s = e.source();
    while let Some(x) = s {
        parts.push(x.to_string());
        s = x.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::needs_hugetlb;

    const CGROUPS: &str = "#subsys_name\thierarchy\tnum_cgroups\tenabled\nhugetlb\t0\t1\t1\n";

    #[test]
    fn a_hybrid_layout_without_hugetlb_needs_the_setup_script() {
        let hybrid = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n";
        assert!(needs_hugetlb(hybrid, CGROUPS));
        let mounted = format!("{hybrid}cgroup /sys/fs/cgroup/hugetlb cgroup rw,relatime,hugetlb 0 0\n");
        assert!(!needs_hugetlb(&mounted, CGROUPS));
        assert!(!needs_hugetlb("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n", CGROUPS));
    }
}
