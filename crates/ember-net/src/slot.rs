//! Network slots: a named network namespace (`/run/netns/<tag>-<N>`) with `lo`
//! up and a veth pair, host end `<tag>-<N>` (address `host(N)/30`), sandbox
//! end `eth0` (`guest(N)/30`, default route via the host end).
//!
//! Moving a veth end into a namespace waits for an RCU grace period (~17 ms
//! here, and as much again to delete it), so slots are made ahead of claims by
//! the refill thread, never on a claim's path.
//!
//! The namespace belongs to the host's user namespace, so root inside a
//! sandbox (root of its own user namespace only) cannot change its addresses,
//! routes or sysctls: a used slot has nothing to scrub but its nftables chain,
//! and is reused.
use crate::addr::AddrPlan;
use crate::NetError;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

pub const NETNS_DIR: &str = "/run/netns";

pub fn name(tag: &str, n: u32) -> String {
    format!("{tag}-{n}")
}

pub fn netns_path(tag: &str, n: u32) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name(tag, n))
}

/// Runs `ip [-n NS] [-force] -batch -` with `script`.
fn ip_batch(netns: Option<&str>, force: bool, script: &str) -> Result<(), NetError> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    if force {
        cmd.arg("-force");
    }
    let mut child = cmd
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| NetError::Command { what: "ip", message: e.to_string() })?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(script.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| NetError::Command { what: "ip", message: e.to_string() })?;
    if out.status.success() || force {
        Ok(())
    } else {
        Err(NetError::Command { what: "ip", message: String::from_utf8_lossy(&out.stderr).trim().to_string() })
    }
}

/// Creates slot `n`. On failure whatever was made is removed again.
pub fn create(tag: &str, plan: &AddrPlan, n: u32) -> Result<(), NetError> {
    let ns = name(tag, n);
    if netns_path(tag, n).exists() {
        // Someone else's: never tear down what this call did not make.
        return Err(NetError::Command { what: "slot", message: format!("{ns} exists already") });
    }
    let res = create_inner(tag, plan, n, &ns);
    if res.is_err() {
        destroy(tag, n);
    }
    res
}

fn create_inner(tag: &str, plan: &AddrPlan, n: u32, ns: &str) -> Result<(), NetError> {
    ip_batch(
        None,
        false,
        &format!(
            "netns add {ns}\nlink add {ns} type veth peer name eth0 netns {ns}\naddr add {}/30 dev {ns}\nlink set {ns} up\n",
            plan.host(n)
        ),
    )?;
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{ns}/disable_ipv6"), "1");
    // Inside: no IPv6 (the firewall passes none), unprivileged low ports (root
    // inside has no CAP_NET_BIND_SERVICE over a namespace it does not own),
    // unprivileged ping sockets.
    let sysctls: Result<(), std::io::Error> = ember_sys::netns::run_in(&netns_path(tag, n), || {
        std::fs::write("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1")?;
        std::fs::write("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1")?;
        std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")?;
        std::fs::write("/proc/sys/net/ipv4/ping_group_range", "0 2147483647")
    })?;
    sysctls.map_err(|e| NetError::Command { what: "slot sysctls", message: e.to_string() })?;
    ip_batch(
        Some(ns),
        false,
        &format!(
            "link set lo up\naddr add {}/30 dev eth0\nlink set eth0 up\nroute add default via {}\n",
            plan.guest(n),
            plan.host(n)
        ),
    )
}

/// Removes slot `n`'s veth and namespace; missing parts are not an error.
pub fn destroy(tag: &str, n: u32) {
    let ns = name(tag, n);
    let _ = ip_batch(None, true, &format!("link del {ns}\nnetns del {ns}\n"));
    let _ = std::fs::remove_file(netns_path(tag, n));
}

/// Whether slot `n` looks whole: its namespace file and its host-side veth exist.
pub fn intact(tag: &str, n: u32) -> bool {
    netns_path(tag, n).exists() && std::path::Path::new("/sys/class/net").join(name(tag, n)).exists()
}

/// Slot numbers with a namespace or a host-side veth on this host.
pub fn existing(tag: &str) -> Vec<u32> {
    let prefix = format!("{tag}-");
    let mut out = Vec::new();
    for dir in [NETNS_DIR, "/sys/class/net"] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if let Some(num) = n.strip_prefix(&prefix).and_then(|s| s.parse::<u32>().ok()) {
                if !out.contains(&num) {
                    out.push(num);
                }
            }
        }
    }
    out.sort_unstable();
    out
}
