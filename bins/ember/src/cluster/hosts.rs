//! The hosts' network: a bridge with the cluster's /24 (the host at .1, so it
//! reaches every node), and per host a named netns with a veth whose inside
//! end is `eth0`. No default route inside: nothing leaves the machine.
use super::state::State;
use anyhow::{bail, Context};
use std::process::Command;

/// Runs `ip ARGS`; its stderr in the error.
pub fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

pub fn create(st: &State) -> anyhow::Result<()> {
    let br = st.bridge.as_str();
    ip(&["link", "add", br, "type", "bridge"])?;
    ip(&["addr", "add", &format!("{}.1/24", st.subnet), "dev", br])?;
    ip(&["link", "set", br, "up"])?;
    for h in &st.hosts {
        let ns = h.netns.as_str();
        ip(&["netns", "add", ns])?;
        ip(&["link", "add", &h.veth, "type", "veth", "peer", "name", "eth0", "netns", ns])?;
        ip(&["link", "set", &h.veth, "master", br, "up"])?;
        ip(&["-n", ns, "addr", "add", &format!("{}/24", h.addr), "dev", "eth0"])?;
        ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    Ok(())
}

/// Cuts host `ns` off the bridge (`--partition`): its processes live on.
pub fn cut(ns: &str) -> anyhow::Result<()> {
    ip(&["-n", ns, "link", "set", "eth0", "down"])
}

/// Best effort: each step may find its object gone already.
pub fn remove(st: &State) {
    for h in &st.hosts {
        // Deleting the namespace deletes eth0, and with it the peer.
        let _ = ip(&["netns", "del", &h.netns]);
        let _ = ip(&["link", "del", &h.veth]);
    }
    let _ = ip(&["link", "del", &st.bridge]);
}

pub fn leftovers(st: &State) -> Vec<String> {
    let mut left = Vec::new();
    let links: Vec<&str> =
        std::iter::once(st.bridge.as_str()).chain(st.hosts.iter().map(|h| h.veth.as_str())).collect();
    for l in links {
        if std::path::Path::new("/sys/class/net").join(l).exists() {
            left.push(format!("link {l}"));
        }
    }
    for h in &st.hosts {
        if std::path::Path::new("/run/netns").join(&h.netns).exists() {
            left.push(format!("netns {}", h.netns));
        }
    }
    left
}
