//! The enforced-boundary report, read back from `/proc` and cgroupfs.
use crate::RuntimeError;
use ember_cgroups::Cgroups;
use ember_types::{BoundaryReport, SandboxId};

/// Start time (clock ticks since boot) of `pid`, field 22 of `/proc/<pid>/stat`.
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The host id that id 0 of `pid`'s user namespace maps to (its range's
/// first id), from `/proc/<pid>/uid_map`.
pub(crate) fn root_host_id(pid: i32) -> Option<u32> {
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).ok()?;
    map.lines().find_map(|l| {
        let f: Vec<u32> = l.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        (f.len() == 3 && f[0] == 0).then(|| f[1])
    })
}

fn status_field(status: &str, key: &str) -> Option<String> {
    status.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
}

pub(crate) fn report(class: &str, pid: i32, cg: &dyn Cgroups, id: &SandboxId) -> Result<BoundaryReport, RuntimeError> {
    let gone = |m: String| RuntimeError::Gone { id: id.clone(), message: m };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| gone(e.to_string()))?;
    let mut namespaces = Vec::new();
    for ns in ["user", "mnt", "pid", "uts", "ipc", "net", "cgroup"] {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).ok();
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).ok();
        if theirs.is_some() && theirs != ours {
            namespaces.push(ns.to_string());
        }
    }
    let uid_map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap_or_default();
    let uid_map = uid_map.split_whitespace().collect::<Vec<_>>().join(" ");
    let host_uid_of_root = status_field(&status, "Uid:").and_then(|u| u.split_whitespace().nth(1)?.parse().ok());
    let capbnd = status_field(&status, "CapBnd:").and_then(|c| u64::from_str_radix(&c, 16).ok()).unwrap_or(0);
    let capabilities =
        super::KEEP_CAPS.iter().filter(|(c, _)| capbnd & (1 << c) != 0).map(|(_, n)| n.to_string()).collect::<Vec<_>>();
    let extra = (0..64).filter(|c| capbnd & (1u64 << c) != 0 && !super::KEEP_CAPS.iter().any(|(k, _)| k == c)).count();
    let mut capabilities = capabilities;
    if extra > 0 {
        capabilities.push(format!("+{extra} unexpected"));
    }
    let seccomp = match status_field(&status, "Seccomp:").as_deref() {
        Some("2") => format!(
            "filter: {} ({} filters)",
            ember_sys::seccomp::PROFILE_NAME,
            status_field(&status, "Seccomp_filters:").unwrap_or_default()
        ),
        Some("1") => "strict".into(),
        _ => "none".into(),
    };
    let net = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).unwrap_or_default();
    let network_interfaces =
        net.lines().skip(2).filter_map(|l| Some(l.split(':').next()?.trim().to_string())).collect();
    let limits = cg.read_limits(id.as_str()).map_err(|source| RuntimeError::Cgroup { id: id.clone(), source })?;
    Ok(BoundaryReport {
        runtime_class: class.to_string(),
        kernel_boundary: "shared host kernel (Linux namespaces + seccomp)".into(),
        namespaces,
        uid_map,
        host_uid_of_root,
        seccomp,
        no_new_privs: status_field(&status, "NoNewPrivs:").as_deref() == Some("1"),
        capabilities,
        cgroup_version: cg.version().to_string(),
        memory_limit_bytes: limits.memory_bytes,
        cpu_millis: limits.cpu_millis,
        pids_limit: limits.pids,
        network_interfaces,
    })
}
