//! `ember serve`'s egress networking flags → an `ember_net::Network` (or none).
use crate::cli::NetArgs;
use anyhow::{bail, Context};
use ember_net::{AddrPlan, NetConfig, Network};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

const DEFAULT_RANGE: &str = "10.203.0.0/16";

/// `None` when egress networking is off: asked for (`--network-range none`),
/// or, by default, when `nft`/`ip` are missing or the node cannot be set up.
pub fn open(a: &NetArgs) -> anyhow::Result<Option<Arc<Network>>> {
    let explicit = a.network_range.is_some();
    let range = a.network_range.as_deref().unwrap_or(DEFAULT_RANGE);
    if range == "none" {
        return Ok(None);
    }
    let res = (|| {
        let cfg = NetConfig {
            tag: a.network_tag.clone(),
            range: AddrPlan::parse(range)?,
            nflog_group: a.nflog_group,
            upstream: upstream(a.dns_upstream.as_deref())?,
            ready_slots: a.network_slots,
        };
        if !NetConfig::check_tag(&cfg.tag) {
            bail!("--network-tag {:?}: 1-8 of [a-z0-9]", cfg.tag);
        }
        Network::open(cfg).context("setting up egress networking")
    })();
    match res {
        Ok(n) => Ok(Some(n)),
        Err(e) if !explicit => {
            tracing::warn!(error = %format!("{e:#}"), "egress networking is off (sandboxes get loopback only)");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// `--dns-upstream IP[:PORT]`, else the first IPv4 nameserver of /etc/resolv.conf.
fn upstream(flag: Option<&str>) -> anyhow::Result<SocketAddr> {
    if let Some(s) = flag {
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(a);
        }
        let ip: Ipv4Addr = s.parse().with_context(|| format!("--dns-upstream {s:?}: expected IP[:PORT]"))?;
        return Ok(SocketAddr::from((ip, 53)));
    }
    let conf = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let ip = conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .find_map(|v| v.trim().parse::<Ipv4Addr>().ok())
        .context("no IPv4 nameserver in /etc/resolv.conf; pass --dns-upstream")?;
    Ok(SocketAddr::from((ip, 53)))
}
