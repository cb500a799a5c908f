//! The OCI classes ember knows, what each needs from this host, and how each
//! differs: global flags, the host pids limit, the kernel boundary it reports.
use super::cli::OciCli;
use std::path::{Path, PathBuf};

/// Host tasks of an idle gVisor sandbox, rounded up (see [`OciClass::host_pids`]).
pub const RUNSC_PIDS_OVERHEAD: u64 = 128;
/// Host tasks per gVisor process on the ptrace platform, rounded up.
pub const RUNSC_TASKS_PER_PROCESS: u64 = 16;

/// The OCI classes ember knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OciClass {
    Crun,
    Runc,
    Runsc,
}

impl OciClass {
    pub const ALL: [OciClass; 3] = [OciClass::Runsc, OciClass::Crun, OciClass::Runc];

    pub fn name(self) -> &'static str {
        match self {
            OciClass::Crun => "crun",
            OciClass::Runc => "runc",
            OciClass::Runsc => "runsc",
        }
    }

    /// Flags before every verb. gVisor here works only on the ptrace platform
    /// and without its own network stack; `--host-uds=create` lets the agent
    /// create its listening socket in the bound host dir; `--oci-seccomp`
    /// applies the bundle's filter inside the Sentry too; `--overlay2=none`
    /// makes the gofer write through to the host overlay ember assembles (its
    /// upper dir is the sandbox's writable layer, snapshotted and under the
    /// disk quota), where gVisor since 2023 keeps root's writes in an overlay
    /// of its own by default (`root:self`), out of ember's sight.
    pub(super) fn global_args(self) -> Vec<String> {
        match self {
            OciClass::Runsc => {
                ["--platform=ptrace", "--network=none", "--host-uds=create", "--oci-seccomp", "--overlay2=none"]
                    .map(String::from)
                    .to_vec()
            }
            _ => Vec::new(),
        }
    }

    /// The host pids cgroup limit for a sandbox allowed `pids` tasks. Under
    /// gVisor the cgroup holds the Sentry's and the gofer's own host threads
    /// (~45 when idle) and, on the ptrace platform, stub processes and tracer
    /// threads for every sandbox process (measured here: ~13 host tasks per
    /// single-threaded process). `pids` alone would not even let the sandbox
    /// start; scaled, it still bounds the sandbox's share of the host's pids.
    /// Reaching it ends the whole sandbox (the Sentry cannot make a stub and
    /// exits) rather than failing one `fork`, as on a shared kernel.
    pub fn host_pids(self, pids: u64) -> u64 {
        match self {
            OciClass::Runsc => pids.saturating_mul(RUNSC_TASKS_PER_PROCESS).saturating_add(RUNSC_PIDS_OVERHEAD),
            OciClass::Crun | OciClass::Runc => pids,
        }
    }

    pub fn kernel_boundary(self) -> &'static str {
        match self {
            OciClass::Runsc => "gVisor user-space kernel (Sentry, ptrace platform)",
            OciClass::Crun | OciClass::Runc => "shared host kernel (Linux namespaces + seccomp)",
        }
    }

    /// The runtime binary on `PATH`, and why the class cannot run here if it
    /// cannot.
    pub fn detect(self) -> Result<PathBuf, String> {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
        let bin = std::env::split_paths(&path).map(|d| d.join(self.name())).find(|p| p.is_file()).ok_or_else(|| {
            format!("{} is not on PATH (install your distribution's `{}` package)", self.name(), self.name())
        })?;
        if self == OciClass::Crun
            && Path::new("/sys/fs/cgroup/memory").is_dir()
            && !Path::new("/sys/fs/cgroup/hugetlb/cgroup.procs").exists()
        {
            return Err("crun needs hugetlb mounted as a cgroup v1 hierarchy: mkdir -p /sys/fs/cgroup/hugetlb && \
                        mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb"
                .into());
        }
        OciCli::new(&bin, "/nonexistent", vec![]).version().map_err(|e| e.to_string())?;
        Ok(bin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runsc_scales_the_host_pids_limit_and_the_others_do_not() {
        assert_eq!(OciClass::Runsc.host_pids(10), 10 * RUNSC_TASKS_PER_PROCESS + RUNSC_PIDS_OVERHEAD);
        assert_eq!(OciClass::Crun.host_pids(10), 10);
        assert_eq!(OciClass::Runc.host_pids(10), 10);
    }
}
