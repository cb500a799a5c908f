//! Sandbox networking on one node: egress on request, sandboxes isolated from
//! each other and from the host, allow-lists enforced by pinning.
//!
//! Layout:
//! - `addr.rs`: the address range, one /30 per slot, the resolver's address.
//! - `slot.rs`: network slots (named netns + veth), made ahead of claims.
//! - `pool.rs`: the slot pool: acquire, release (scrub and reuse), adopt after
//!   a restart, converge (reclaim leftovers), the refill thread.
//! - `nft.rs`: the nftables table `inet <tag>` and per-slot chains and sets.
//! - `dns.rs`: the pinning resolver.
//! - `flowlog.rs`: the denied-flow log (nflog group + resolver refusals).
//!
//! Everything but the resolver is synchronous (it runs `ip` and `nft`); the
//! engine calls it from blocking threads.
#![forbid(unsafe_code)]

pub mod addr;
mod dns;
mod dns_limits;
pub mod flowlog;
pub mod nft;
mod pool;
pub mod slot;

pub use addr::AddrPlan;
pub use pool::{Attachment, NetStats};

use ember_types::{DeniedFlow, EgressPolicy};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("{what}: {message}")]
    Command { what: &'static str, message: String },
    #[error(transparent)]
    Sys(#[from] ember_sys::SysError),
    #[error(transparent)]
    Nft(#[from] nft::NftError),
    #[error("every network slot of {0} is in use")]
    Exhausted(String),
    #[error("network slot {0} is not in use")]
    NoSlot(u32),
}

/// Fixed at daemon start.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// Names the nftables table, the slot namespaces and veths (`<tag>-<N>`):
    /// 1-8 of [a-z0-9]; daemons sharing a host need different tags.
    pub tag: String,
    pub range: AddrPlan,
    /// nflog group the firewall logs to (one reader per group per host).
    pub nflog_group: u16,
    /// Where the resolver forwards allowed queries.
    pub upstream: SocketAddr,
    /// Ready slots kept ahead of claims.
    pub ready_slots: usize,
}

impl NetConfig {
    pub fn check_tag(tag: &str) -> bool {
        (1..=8).contains(&tag.len()) && tag.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    }
}

/// A slot in use, and by whom.
#[derive(Clone, Debug)]
pub(crate) struct SlotUse {
    pub sandbox: String,
    pub policy: EgressPolicy,
}

/// A std Mutex guards it: short sections, never held across an await or a
/// command (`ip`/`nft` run outside it).
#[derive(Default)]
pub(crate) struct State {
    pub ready: VecDeque<u32>,
    pub used: HashMap<u32, SlotUse>,
    pub creating: HashSet<u32>,
    /// (slot, address, port) pinned by the resolver, so a repeat refreshes
    /// the timeout instead of failing.
    pub pins: HashSet<(u32, Ipv4Addr, Option<u16>)>,
}

type Observer = Box<dyn Fn(&str) + Send + Sync>;

pub struct Network {
    cfg: NetConfig,
    /// The special ranges plus the host's own networks: never pinned, and
    /// denied under open egress unless a rule allows them.
    denied: Vec<(Ipv4Addr, u8)>,
    state: Mutex<State>,
    /// Wakes the refill thread.
    refill: Condvar,
    log: flowlog::FlowLog,
    observer: OnceLock<Observer>,
    resolver: Mutex<Option<std::net::UdpSocket>>,
    nflog: Mutex<Option<ember_sys::nflog::NflogSocket>>,
    started: AtomicBool,
    created_total: AtomicU64,
    create_micros_total: AtomicU64,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// The host's IPv4 networks (from `ip -j -4 addr`), other than loopback and
/// the slots' own links.
fn host_networks(tag: &str) -> Vec<(Ipv4Addr, u8)> {
    let out = std::process::Command::new("ip").args(["-j", "-4", "addr"]).output();
    let v: serde_json::Value = out.ok().and_then(|o| serde_json::from_slice(&o.stdout).ok()).unwrap_or_default();
    let mut nets = Vec::new();
    for link in v.as_array().into_iter().flatten() {
        let name = link["ifname"].as_str().unwrap_or("");
        if name == "lo" || name.starts_with(&format!("{tag}-")) {
            continue;
        }
        for a in link["addr_info"].as_array().into_iter().flatten() {
            if let (Some(ip), Some(p)) =
                (a["local"].as_str().and_then(|s| s.parse::<Ipv4Addr>().ok()), a["prefixlen"].as_u64())
            {
                let p = p.min(32) as u8;
                let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
                nets.push((Ipv4Addr::from(u32::from(ip) & mask), p));
            }
        }
    }
    nets
}

impl Network {
    /// Sets the node up: IPv4 forwarding, the resolver address on `lo`, the
    /// nftables table, the nflog socket and the resolver socket. Slots are
    /// left alone until [`Network::converge`]. Idempotent across restarts.
    pub fn open(cfg: NetConfig) -> Result<Arc<Network>, NetError> {
        if !NetConfig::check_tag(&cfg.tag) {
            return Err(NetError::Command { what: "network tag", message: format!("{:?}: 1-8 of [a-z0-9]", cfg.tag) });
        }
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .map_err(|e| NetError::Command { what: "enable IPv4 forwarding", message: e.to_string() })?;
        let res = cfg.range.resolver();
        let out = std::process::Command::new("ip")
            .args(["addr", "replace", &format!("{res}/32"), "dev", "lo"])
            .output()
            .map_err(|e| NetError::Command { what: "ip", message: e.to_string() })?;
        if !out.status.success() {
            let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(NetError::Command { what: "resolver address on lo", message });
        }
        let mut denied: Vec<_> = addr::SPECIAL_RANGES.to_vec();
        denied.extend(host_networks(&cfg.tag));
        nft::apply(&nft::base_script(&cfg.tag, &cfg.range, cfg.nflog_group, &denied))?;
        let nflog = ember_sys::nflog::NflogSocket::bind(cfg.nflog_group, 128)?;
        nflog.set_timeout(std::time::Duration::from_millis(500))?;
        let sock = std::net::UdpSocket::bind((res, 53))
            .map_err(|e| NetError::Command { what: "resolver socket", message: format!("{res}:53: {e}") })?;
        Ok(Arc::new(Network {
            cfg,
            denied,
            state: Mutex::new(State::default()),
            refill: Condvar::new(),
            log: flowlog::FlowLog::default(),
            observer: OnceLock::new(),
            resolver: Mutex::new(Some(sock)),
            nflog: Mutex::new(Some(nflog)),
            started: AtomicBool::new(false),
            created_total: AtomicU64::new(0),
            create_micros_total: AtomicU64::new(0),
        }))
    }

    pub fn config(&self) -> &NetConfig {
        &self.cfg
    }

    /// Called with the rule of every denied flow (for a metrics counter).
    pub fn set_observer(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        let _ = self.observer.set(Box::new(f));
    }

    /// Starts the resolver (on the current tokio runtime), the nflog reader and
    /// the refill thread. Call once, after adopting and converging.
    pub fn start(self: &Arc<Self>) -> Result<(), NetError> {
        if self.started.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(sock) = self.resolver.lock().take() {
            sock.set_nonblocking(true).map_err(|e| NetError::Command { what: "resolver", message: e.to_string() })?;
            let sock = tokio::net::UdpSocket::from_std(sock)
                .map_err(|e| NetError::Command { what: "resolver", message: e.to_string() })?;
            tokio::spawn(dns::serve(Arc::downgrade(self), sock));
        }
        if let Some(sock) = self.nflog.lock().take() {
            let weak = Arc::downgrade(self);
            std::thread::Builder::new()
                .name("ember-nflog".into())
                .spawn(move || read_nflog(weak, sock))
                .map_err(|e| NetError::Command { what: "nflog thread", message: e.to_string() })?;
        }
        let weak = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("ember-slots".into())
            .spawn(move || pool::refill_loop(weak))
            .map_err(|e| NetError::Command { what: "slot refill thread", message: e.to_string() })?;
        Ok(())
    }

    pub(crate) fn upstream(&self) -> SocketAddr {
        self.cfg.upstream
    }

    /// Whether the resolver may pin `a` for a domain rule.
    pub(crate) fn pinnable(&self, a: Ipv4Addr) -> bool {
        !addr::in_ranges(a, &self.denied) && !self.cfg.range.contains(a)
    }

    /// The slot, sandbox and policy behind a sandbox address.
    pub(crate) fn lookup(&self, a: Ipv4Addr) -> Option<(u32, String, EgressPolicy)> {
        let slot = self.cfg.range.slot_of(a)?;
        let st = self.state.lock();
        st.used.get(&slot).map(|u| (slot, u.sandbox.clone(), u.policy.clone()))
    }

    fn record(&self, sandbox: &str, ev: DeniedFlow) {
        if let Some(f) = self.observer.get() {
            f(&ev.rule);
        }
        self.log.push(sandbox, ev);
    }

    pub(crate) fn dns_denied(&self, sandbox: &str, qname: &str) {
        let ev = DeniedFlow {
            time: flowlog::now_rfc3339(),
            kind: "dns".into(),
            destination: qname.to_string(),
            port: Some(53),
            protocol: "udp".into(),
            rule: "name".into(),
        };
        self.record(sandbox, ev);
    }

    /// The denied flows of a sandbox, oldest first.
    pub fn events(&self, sandbox: &str) -> Vec<DeniedFlow> {
        self.log.get(sandbox)
    }
}

/// The nflog reader: one blocking thread, until the network is dropped.
fn read_nflog(net: std::sync::Weak<Network>, sock: ember_sys::nflog::NflogSocket) {
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match sock.recv(&mut buf) {
            Ok(n) => n,
            Err(e) => {
                // ENOBUFS: the kernel dropped log messages; keep reading.
                tracing::warn!(error = %e, "nflog receive failed");
                0
            }
        };
        let Some(net) = net.upgrade() else { return };
        for pkt in ember_sys::nflog::parse(&buf[..n]) {
            let Some((slot, ev)) = flowlog::packet_event(&net.cfg.tag, &net.cfg.range, &pkt.prefix, &pkt.payload)
            else {
                continue;
            };
            let owner = net.state.lock().used.get(&slot).map(|u| u.sandbox.clone());
            if let Some(sandbox) = owner {
                net.record(&sandbox, ev);
            }
        }
    }
}
