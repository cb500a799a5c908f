//! Getting crun ready to be measured: the binary, the hugetlb hierarchy this
//! host's hybrid cgroup layout needs, and an OCI bundle shaped like ember's
//! `host` template.
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Same id range as `ember serve --uid-base` (default) and its 65536 ids.
pub const HOST_ID: u32 = 1_000_000_000;
pub const ID_RANGE: u32 = 65536;

/// The capability set the native runtime keeps (ember-runtime's `KEEP_CAPS`).
const CAPS: [&str; 11] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_AUDIT_WRITE",
    "CAP_SETFCAP",
];

/// How the crun bundle differs from an ember sandbox, for the report.
pub const DIFFERENCES: &[&str] = &[
    "crun: read-only root dir (ember: overlay with a tmpfs upper layer, plus a generated /etc)",
    "crun: no seccomp filter (ember loads one before exec'ing its agent)",
    "crun ready = `crun state` says running (ember ready = its agent answered GET /ping over its socket)",
    "crun is driven by fork+exec of its CLI here; ember by HTTP to a daemon (loopback, one connection)",
];

/// `crun --version`'s first line; installs crun with apt-get when it is missing.
pub fn ensure_crun() -> Result<String, String> {
    if let Some(v) = crun_version() {
        return Ok(v);
    }
    eprintln!("crun is not installed: running `apt-get install -y crun`");
    if !apt_install() {
        eprintln!("apt-get install failed: running `apt-get update` and trying once more");
        if !apt(&["update"]) || !apt_install() {
            return Err("crun is not installed and `apt-get install -y crun` failed".into());
        }
    }
    crun_version().ok_or_else(|| "crun was installed but `crun --version` does not run".into())
}

fn crun_version() -> Option<String> {
    let out = Command::new("crun").arg("--version").stdin(Stdio::null()).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    out.status.success().then(|| text.lines().next().unwrap_or("crun").trim().to_string())
}

fn apt_install() -> bool {
    apt(&["install", "-y", "crun"])
}

/// apt-get with its output on our stderr (stdout stays for the report).
fn apt(args: &[&str]) -> bool {
    Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .is_ok_and(|s| s.success())
}

/// crun refuses a hybrid cgroup v1 layout that lacks a hugetlb hierarchy. Mounts
/// one when the layout is v1/hybrid, the kernel has the controller and no
/// hierarchy has it yet; says what it did. Returns a warning when it could not.
pub fn ensure_hugetlb() -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let rows: Vec<Vec<&str>> =
        mounts.lines().map(|l| l.split_whitespace().collect()).filter(|f: &Vec<&str>| f.len() >= 4).collect();
    let unified_root = rows.iter().any(|f| f[1] == "/sys/fs/cgroup" && f[2] == "cgroup2");
    let v1 = rows.iter().any(|f| f[2] == "cgroup" && f[1].starts_with("/sys/fs/cgroup/"));
    let has_hugetlb = rows.iter().any(|f| f[2] == "cgroup" && f[3].split(',').any(|o| o == "hugetlb"));
    let kernel_has = std::fs::read_to_string("/proc/cgroups")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().next() == Some("hugetlb") && l.split_whitespace().nth(3) == Some("1"));
    if unified_root || !v1 || has_hugetlb || !kernel_has {
        return None;
    }
    let dir = "/sys/fs/cgroup/hugetlb";
    eprintln!(
        "crun needs a hugetlb cgroup v1 hierarchy here: mkdir -p {dir} && mount -t cgroup -o hugetlb cgroup {dir}"
    );
    if let Err(e) = std::fs::create_dir_all(dir) {
        return Some(format!("cannot create {dir}: {e}; crun may refuse to start containers"));
    }
    let ok = Command::new("mount")
        .args(["-t", "cgroup", "-o", "hugetlb", "cgroup", dir])
        .stdin(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    (!ok).then(|| format!("mounting the hugetlb hierarchy at {dir} failed; crun may refuse to start containers"))
}

/// A temp dir with a rootfs, two bundles (`/bin/true`, `sleep infinity`) and
/// crun's state root. Removed on drop.
pub struct Bundle {
    pub dir: PathBuf,
    pub state_root: PathBuf,
    pub true_bundle: PathBuf,
    pub sleep_bundle: PathBuf,
    pub log: PathBuf,
}

impl Bundle {
    pub fn create() -> Result<Bundle, String> {
        let dir = std::env::temp_dir().join(format!("ember-bench-crun.{}", std::process::id()));
        let b = Bundle {
            state_root: dir.join("state"),
            true_bundle: dir.join("bundle-true"),
            sleep_bundle: dir.join("bundle-sleep"),
            log: dir.join("crun.log"),
            dir,
        };
        b.build().map_err(|e| format!("building the OCI bundle in {}: {e}", b.dir.display()))?;
        Ok(b)
    }

    fn build(&self) -> std::io::Result<()> {
        if self.dir.exists() {
            std::fs::remove_dir_all(&self.dir)?;
        }
        let rootfs = self.dir.join("rootfs");
        for d in ["usr", "proc", "dev", "tmp", "etc"] {
            std::fs::create_dir_all(rootfs.join(d))?;
        }
        for (link, target) in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")] {
            std::os::unix::fs::symlink(target, rootfs.join(link))?;
        }
        std::fs::create_dir_all(&self.state_root)?;
        for (bundle, args) in
            [(&self.true_bundle, vec!["/bin/true"]), (&self.sleep_bundle, vec!["/bin/sleep", "infinity"])]
        {
            std::fs::create_dir_all(bundle)?;
            let cfg = serde_json::to_vec_pretty(&config(&rootfs, &args))?;
            std::fs::write(bundle.join("config.json"), cfg)?;
        }
        Ok(())
    }
}

impl Drop for Bundle {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// crun's default spec, minus /sys and mqueue (ember mounts neither), plus the
/// host's /usr read-only, ember's id mapping, capabilities and default limits
/// (512 MiB, 1 CPU, 256 pids), in the same six namespaces.
fn config(rootfs: &Path, args: &[&str]) -> Value {
    let map = json!([{ "containerID": 0, "hostID": HOST_ID, "size": ID_RANGE }]);
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": args,
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": { "bounding": CAPS, "effective": CAPS, "permitted": CAPS },
            "noNewPrivileges": true
        },
        "root": { "path": rootfs, "readonly": true },
        "hostname": "crun-bench",
        "mounts": [
            { "destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"] },
            { "destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
            { "destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] },
            { "destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "nodev", "mode=1777", "size=65536k"] },
            { "destination": "/usr", "type": "bind", "source": "/usr", "options": ["bind", "ro", "nosuid", "nodev"] }
        ],
        "linux": {
            "uidMappings": map,
            "gidMappings": map,
            "namespaces": [
                { "type": "pid" }, { "type": "mount" }, { "type": "uts" },
                { "type": "ipc" }, { "type": "network" }, { "type": "user" }
            ],
            "resources": {
                "memory": { "limit": 512u64 << 20 },
                "cpu": { "quota": 100_000, "period": 100_000 },
                "pids": { "limit": 256 }
            },
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats"]
        }
    })
}
