//! `GET /v1/sandboxes/{id}/stats`: live figures of a sandbox's cgroup, read
//! from the kernel at the request (what `ember stats` shows).
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStats {
    pub id: String,
    /// `v1` or `v2`.
    pub cgroup_version: String,
    /// CPU time of every process the sandbox ever ran, µs; a rate is the
    /// difference of two readings. `null`: no cpu accounting on this host.
    pub cpu_usage_micros: Option<u64>,
    /// The cpu limit in thousandths of a core (0: none).
    pub cpu_limit_millis: u64,
    /// Memory charged to the sandbox (its processes and its tmpfs layer).
    pub memory_bytes: u64,
    pub memory_limit_bytes: u64,
    pub pids: u64,
    pub pids_limit: u64,
    /// Block IO through the cgroup; `null`: no io accounting on this host.
    pub io_read_bytes: Option<u64>,
    pub io_write_bytes: Option<u64>,
}
