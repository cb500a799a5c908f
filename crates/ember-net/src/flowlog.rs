//! The denied-flow log: every packet the firewall drops with a `log` statement
//! arrives on the daemon's nflog group (see `ember_sys::nflog`); every name the
//! resolver refuses is added directly. Events are kept per sandbox, the newest
//! [`KEEP`], in memory; totals per rule feed the `/metrics` counter.
use crate::addr::AddrPlan;
use ember_types::DeniedFlow;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use time::format_description::well_known::Rfc3339;

/// Events kept per sandbox.
pub const KEEP: usize = 1000;

/// Source, destination, protocol and destination port of a logged packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: u8,
    pub dport: Option<u16>,
}

/// Reads the IPv4 header (and the ports of TCP/UDP) of a logged packet.
pub fn parse_ipv4(p: &[u8]) -> Option<Flow> {
    if p.len() < 20 || p[0] >> 4 != 4 {
        return None;
    }
    let ihl = (p[0] & 0x0f) as usize * 4;
    let proto = p[9];
    let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
    let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
    let dport = match proto {
        6 | 17 => p.get(ihl + 2..ihl + 4).map(|b| u16::from_be_bytes([b[0], b[1]])),
        _ => None,
    };
    Some(Flow { src, dst, proto, dport })
}

pub fn proto_name(p: u8) -> String {
    match p {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        n => n.to_string(),
    }
}

pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc().format(&Rfc3339).unwrap_or_default()
}

/// A std Mutex: pushes and copies only, never held across an await.
#[derive(Default)]
pub struct FlowLog {
    by_sandbox: Mutex<HashMap<String, VecDeque<DeniedFlow>>>,
}

impl FlowLog {
    pub fn push(&self, sandbox: &str, ev: DeniedFlow) {
        let mut m = self.by_sandbox.lock();
        let q = m.entry(sandbox.to_string()).or_default();
        if q.len() == KEEP {
            q.pop_front();
        }
        q.push_back(ev);
    }

    pub fn get(&self, sandbox: &str) -> Vec<DeniedFlow> {
        let m = self.by_sandbox.lock();
        m.get(sandbox).map(|q| q.iter().cloned().collect()).unwrap_or_default()
    }

    pub fn forget(&self, sandbox: &str) {
        self.by_sandbox.lock().remove(sandbox);
    }
}

/// Turns one logged packet into an event: (slot, event), or `None` when it is
/// not IPv4 from a slot address of this plan, or not this daemon's prefix.
pub fn packet_event(tag: &str, plan: &AddrPlan, prefix: &str, payload: &[u8]) -> Option<(u32, DeniedFlow)> {
    let rule = prefix.strip_prefix(tag)?.strip_prefix(':')?;
    let f = parse_ipv4(payload)?;
    let slot = plan.slot_of(f.src)?;
    Some((
        slot,
        DeniedFlow {
            time: now_rfc3339(),
            kind: "connect".into(),
            destination: f.dst.to_string(),
            port: f.dport,
            protocol: proto_name(f.proto),
            rule: rule.to_string(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_syn_becomes_an_event() {
        let plan = AddrPlan::parse("10.203.0.0/24").unwrap();
        let mut p = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 10, 203, 0, 6, 203, 0, 113, 11];
        p.extend([0xc3, 0x50, 0, 80]);
        let (slot, ev) = packet_event("ember", &plan, "ember:default", &p).unwrap();
        assert_eq!(slot, 1);
        assert_eq!((ev.destination.as_str(), ev.port, ev.protocol.as_str()), ("203.0.113.11", Some(80), "tcp"));
        assert_eq!(ev.rule, "default");
        assert!(packet_event("other", &plan, "ember:default", &p).is_none());
        assert!(packet_event("ember", &plan, "ember:x", &p[..10]).is_none());
    }

    #[test]
    fn the_log_keeps_the_newest() {
        let log = FlowLog::default();
        for i in 0..KEEP + 5 {
            let ev = DeniedFlow {
                time: String::new(),
                kind: "connect".into(),
                destination: i.to_string(),
                port: None,
                protocol: "tcp".into(),
                rule: "default".into(),
            };
            log.push("a", ev);
        }
        let evs = log.get("a");
        assert_eq!(evs.len(), KEEP);
        assert_eq!(evs[0].destination, "5");
        log.forget("a");
        assert!(log.get("a").is_empty());
    }
}
