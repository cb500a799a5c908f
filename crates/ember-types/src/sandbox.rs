//! The sandbox's desired spec, its lifecycle states and why it ended.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

pub use crate::network::NetworkMode;

/// Resource limits applied through cgroups and the writable layer's size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// Memory limit in bytes; swap is not allowed on top of it.
    pub memory_bytes: u64,
    /// CPU quota in millicores (1000 = one core).
    pub cpu_millis: u64,
    /// Maximum number of tasks (processes and threads).
    pub pids: u64,
    /// Size of the writable layer (overlay upper) in bytes.
    pub disk_bytes: u64,
}

impl Default for Resources {
    fn default() -> Self {
        Resources { memory_bytes: 512 << 20, cpu_millis: 1000, pids: 256, disk_bytes: 1 << 30 }
    }
}

/// The identity commands run as, inside the sandbox's user namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserSpec {
    pub uid: u32,
    pub gid: u32,
}

impl UserSpec {
    /// The default non-root user every template defines.
    pub const SANDBOX: UserSpec = UserSpec { uid: 1000, gid: 1000 };
}

/// What a caller asked for, after validation and template defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    pub template: String,
    pub runtime_class: String,
    pub resources: Resources,
    /// Seconds until the sandbox expires; `None` means it lives until removed.
    pub ttl_secs: Option<u64>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    /// Started by the agent once the sandbox is up; when it exits the sandbox ends
    /// with `Exited(code)`. Empty means the sandbox idles until removed.
    pub entrypoint: Vec<String>,
    pub user: UserSpec,
    pub network: NetworkMode,
    /// The rootfs's overlay lower dirs, top first (an image's unpacked layers);
    /// empty means the built-in `host` layer with the host's `/usr`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lower_dirs: Vec<std::path::PathBuf>,
    /// Default working directory of commands and the entrypoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Enforced when `network` is `Egress`.
    #[serde(default, skip_serializing_if = "crate::network::is_open_egress")]
    pub egress: crate::network::EgressPolicy,
    /// Host directories bound into the sandbox (validated against the
    /// daemon's allow-list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
    /// Names of the secrets the create asked for (`/run/secrets/<name>`),
    /// never their values. A boot-time entrypoint waits until they are written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_names: Vec<String>,
    /// Frozen after this many seconds without proxy traffic, thawed by the
    /// next proxy call (`autoPause.afterSeconds`; docs/auto-pause.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_secs: Option<u64>,
    /// The first auto-pause checkpoints a gVisor sandbox instead
    /// (`autoPause.checkpoint`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_pause_checkpoint: bool,
}

impl SandboxSpec {
    /// A sandbox of the built-in `host` template with nothing asked for:
    /// default resources, the sandbox user, no network, no entrypoint.
    pub fn host(runtime_class: &str) -> SandboxSpec {
        SandboxSpec {
            template: "host".into(),
            runtime_class: runtime_class.into(),
            resources: Resources::default(),
            ttl_secs: None,
            env: Default::default(),
            metadata: Default::default(),
            entrypoint: vec![],
            user: UserSpec::SANDBOX,
            network: Default::default(),
            volumes: vec![],
            egress: Default::default(),
            lower_dirs: vec![],
            workdir: None,
            secret_names: vec![],
            auto_pause_secs: None,
            auto_pause_checkpoint: false,
        }
    }
}

/// A host directory bound at `mount_path` inside the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeMount {
    pub host_path: std::path::PathBuf,
    pub mount_path: String,
    pub read_only: bool,
}

/// Lifecycle states, as OpenSandbox names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SandboxState {
    Pending,
    Running,
    Paused,
    Stopping,
    Terminated,
    Failed,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("illegal sandbox transition {from} -> {to}")]
pub struct TransitionError {
    pub from: SandboxState,
    pub to: SandboxState,
}

impl SandboxState {
    pub fn is_terminal(self) -> bool {
        matches!(self, SandboxState::Terminated | SandboxState::Failed)
    }

    /// The legal moves: Pending → Running → (Paused ↔ Running) → Stopping →
    /// Terminated, and any live state → Failed.
    pub fn check_transition(self, to: SandboxState) -> Result<(), TransitionError> {
        use SandboxState::*;
        let ok = matches!(
            (self, to),
            (Pending, Running)
                | (Running, Paused)
                | (Paused, Running)
                | (Pending | Running | Paused, Stopping)
                | (Stopping, Terminated)
                | (Pending | Running | Paused | Stopping, Failed)
                | (Pending | Running | Paused, Terminated)
        );
        if ok {
            Ok(())
        } else {
            Err(TransitionError { from: self, to })
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Pending => "Pending",
            SandboxState::Running => "Running",
            SandboxState::Paused => "Paused",
            SandboxState::Stopping => "Stopping",
            SandboxState::Terminated => "Terminated",
            SandboxState::Failed => "Failed",
        }
    }

    pub fn parse(s: &str) -> Option<SandboxState> {
        use SandboxState::*;
        [Pending, Running, Paused, Stopping, Terminated, Failed]
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a sandbox stopped. Every terminal state carries one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TerminationReason {
    /// The entrypoint (or the agent) exited with this code.
    Exited(i32),
    /// The kernel's OOM killer fired inside the sandbox's memory cgroup.
    OOMKilled,
    /// The TTL ran out.
    Expired,
    /// Removed through the API, or its processes were killed from outside.
    Killed,
    /// ember itself failed to start or supervise the sandbox.
    RuntimeError(String),
}

impl TerminationReason {
    /// The terminal state this reason leads to.
    pub fn terminal_state(&self) -> SandboxState {
        match self {
            TerminationReason::Exited(0) | TerminationReason::Expired | TerminationReason::Killed => {
                SandboxState::Terminated
            }
            _ => SandboxState::Failed,
        }
    }

    /// The short, stable form used as OpenSandbox's `status.reason`.
    pub fn code(&self) -> String {
        match self {
            TerminationReason::Exited(c) => format!("Exited({c})"),
            TerminationReason::OOMKilled => "OOMKilled".into(),
            TerminationReason::Expired => "Expired".into(),
            TerminationReason::Killed => "Killed".into(),
            TerminationReason::RuntimeError(_) => "RuntimeError".into(),
        }
    }
}

impl fmt::Display for TerminationReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TerminationReason::RuntimeError(m) => write!(f, "RuntimeError({m})"),
            other => f.write_str(&other.code()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use SandboxState::*;

    #[test]
    fn transitions() {
        assert!(Pending.check_transition(Running).is_ok());
        assert!(Running.check_transition(Stopping).is_ok());
        assert!(Stopping.check_transition(Terminated).is_ok());
        assert!(Running.check_transition(Failed).is_ok());
        assert!(Terminated.check_transition(Running).is_err());
        assert!(Failed.check_transition(Terminated).is_err());
        assert!(Pending.check_transition(Paused).is_err());
    }

    #[test]
    fn reasons_map_to_states() {
        assert_eq!(TerminationReason::Exited(0).terminal_state(), Terminated);
        assert_eq!(TerminationReason::Exited(3).terminal_state(), Failed);
        assert_eq!(TerminationReason::OOMKilled.terminal_state(), Failed);
        assert_eq!(TerminationReason::Expired.terminal_state(), Terminated);
        assert_eq!(TerminationReason::Exited(3).code(), "Exited(3)");
    }

    #[test]
    fn state_names_round_trip() {
        for s in [Pending, Running, Paused, Stopping, Terminated, Failed] {
            assert_eq!(SandboxState::parse(s.as_str()), Some(s));
        }
        assert_eq!(SandboxState::parse("running"), Some(Running));
        assert_eq!(SandboxState::parse("nope"), None);
    }
}

/// What is actually enforced on a running sandbox, read back from the kernel
/// (not copied from the request).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BoundaryReport {
    pub runtime_class: String,
    /// "shared host kernel (namespaces)" for native; a user-space kernel for gVisor.
    pub kernel_boundary: String,
    /// Namespaces the sandbox does not share with the host.
    pub namespaces: Vec<String>,
    /// `/proc/<pid>/uid_map` of the sandbox init, e.g. "0 1000000000 65536".
    pub uid_map: String,
    pub host_uid_of_root: Option<u32>,
    pub seccomp: String,
    pub no_new_privs: bool,
    pub capabilities: Vec<String>,
    pub cgroup_version: String,
    pub memory_limit_bytes: u64,
    pub cpu_millis: u64,
    pub pids_limit: u64,
    pub network_interfaces: Vec<String>,
}
