//! The node's resolver: the only DNS server a sandbox can reach. It listens on
//! the range's resolver address (on the host's `lo`), answers only slot
//! addresses, and for each query:
//! 1. refuses (REFUSED, logged as a `dns` event, rule `name`) a name the
//!    sandbox's policy does not allow;
//! 2. forwards an allowed one to the upstream resolver;
//! 3. under an allow-list, pins every A address in the answer (except the
//!    always-denied ranges: no DNS rebinding into the host's networks) into
//!    the slot's nftables set, with the matching rules' ports, *before* the
//!    answer goes back, so the connection that follows finds it open;
//! 4. drops AAAA answers (sandboxes have no IPv6).
//!
//! An upstream reply is taken only if its id and question match the query's
//! (anything else is dropped and the wait goes on). Each slot has a bounded
//! number of queries in flight and a rate of `nft` pin updates
//! (`dns_limits.rs`).
use crate::dns_limits::SlotLimits;
use crate::Network;
use ember_types::{EgressAction, EgressTarget};
use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::{RData, RecordType};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::net::UdpSocket;

/// How long the upstream gets to answer.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);

pub(crate) async fn serve(net: Weak<Network>, sock: UdpSocket) {
    let sock = Arc::new(sock);
    let limits = SlotLimits::new();
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, from) = match sock.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "resolver receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(net) = net.upgrade() else { return };
        // Only slot addresses get answers; each within its slot's bound.
        let IpAddr::V4(src) = from.ip() else { continue };
        let Some(slot) = net.lookup(src) else { continue };
        let Some(inflight) = limits.begin(slot.0) else {
            tracing::debug!(sandbox = %slot.1, "resolver: too many queries in flight; dropping one");
            continue;
        };
        let pkt = buf[..n].to_vec();
        let (sock, limits) = (sock.clone(), limits.clone());
        tokio::spawn(async move {
            if let Some(reply) = answer(&net, slot, &limits, &pkt).await {
                let _ = sock.send_to(&reply, from).await;
            }
            drop(inflight);
        });
    }
}

fn reply_code(req: &Message, code: ResponseCode) -> Option<Vec<u8>> {
    let mut m = Message::error_msg(req.id(), req.op_code(), code);
    m.add_queries(req.queries().to_vec());
    m.set_recursion_desired(req.recursion_desired());
    m.set_recursion_available(true);
    m.to_vec().ok()
}

type SlotInfo = (u32, String, ember_types::EgressPolicy);

async fn answer(net: &Arc<Network>, slot: SlotInfo, limits: &SlotLimits, pkt: &[u8]) -> Option<Vec<u8>> {
    let (slot, sandbox, policy) = slot;
    let req = Message::from_vec(pkt).ok()?;
    let Some(q) = req.queries().first() else { return reply_code(&req, ResponseCode::FormErr) };
    let qname = q.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
    let qtype = q.query_type();
    if !policy.name_allowed(&qname) {
        net.dns_denied(&sandbox, &qname);
        return reply_code(&req, ResponseCode::Refused);
    }
    let Some(raw) = forward(net.upstream(), pkt, &req, UPSTREAM_TIMEOUT).await else {
        return reply_code(&req, ResponseCode::ServFail);
    };
    let Ok(mut resp) = Message::from_vec(&raw) else { return reply_code(&req, ResponseCode::ServFail) };
    if policy.default_action == EgressAction::Deny {
        let ports = pin_ports(&policy.rules, &qname);
        let mut pins = Vec::new();
        let mut ttl = u32::MAX;
        for r in resp.answers() {
            if let Some(RData::A(a)) = r.data() {
                let a: Ipv4Addr = a.0;
                if net.pinnable(a) {
                    ttl = ttl.min(r.ttl());
                    pins.extend(ports.iter().map(|p| (a, *p)));
                }
            }
        }
        // Pins all in place need no `nft` run; new ones wait for the slot's rate.
        if !pins.is_empty() && !net.all_pinned(slot, &pins) && !limits.take_pin(slot) {
            tracing::debug!(sandbox = %sandbox, name = %qname, "resolver: pin rate exceeded; answering SERVFAIL");
            return reply_code(&req, ResponseCode::ServFail);
        }
        if !pins.is_empty() {
            let n = net.clone();
            let pinned = tokio::task::spawn_blocking(move || n.pin(slot, &pins, ttl)).await;
            if !matches!(pinned, Ok(Ok(()))) {
                tracing::warn!(sandbox = %sandbox, name = %qname, "pinning failed; answering SERVFAIL");
                return reply_code(&req, ResponseCode::ServFail);
            }
        }
    }
    if qtype == RecordType::AAAA || resp.answers().iter().any(|r| r.record_type() == RecordType::AAAA) {
        let kept: Vec<_> = resp.take_answers().into_iter().filter(|r| r.record_type() != RecordType::AAAA).collect();
        resp.insert_answers(kept);
        return resp.to_vec().ok();
    }
    Some(raw)
}

/// The ports an allowed name's addresses are pinned for: `None` (all) if any
/// matching allow rule names no port.
fn pin_ports(rules: &[ember_types::EgressRule], qname: &str) -> Vec<Option<u16>> {
    let mut ports = Vec::new();
    for r in rules.iter().filter(|r| r.action == EgressAction::Allow && r.target.matches_name(qname)) {
        match &r.target {
            EgressTarget::Domain { port: None, .. } => return vec![None],
            t => ports.push(t.port()),
        }
    }
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Sends the query upstream from a fresh socket and waits for the reply with
/// the same id and question: a reply to another question (spoofed, or a stale
/// one) must not be answered, nor pinned.
async fn forward(upstream: SocketAddr, pkt: &[u8], req: &Message, timeout: Duration) -> Option<Vec<u8>> {
    let exchange = async {
        let s = UdpSocket::bind("0.0.0.0:0").await.ok()?;
        s.connect(upstream).await.ok()?;
        s.send(pkt).await.ok()?;
        let mut buf = vec![0u8; 4096];
        loop {
            let n = s.recv(&mut buf).await.ok()?;
            let reply = &buf[..n];
            if n < 2 || u16::from_be_bytes([reply[0], reply[1]]) != req.id() {
                continue;
            }
            match Message::from_vec(reply) {
                Ok(m) if m.queries() == req.queries() => return Some(reply.to_vec()),
                _ => tracing::debug!(upstream = %upstream, "resolver: dropping a reply to another question"),
            }
        }
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_types::EgressPolicy;

    fn query(name: &str) -> Message {
        let mut m = Message::new();
        m.set_id(4242);
        m.add_query(hickory_proto::op::Query::query(name.parse().unwrap(), RecordType::A));
        m
    }

    /// A real upstream on loopback that answers each query first with a reply
    /// to `wrong` (same id), then, if `then_right`, with the right one.
    async fn upstream(wrong: &str, then_right: bool) -> SocketAddr {
        let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = s.local_addr().unwrap();
        let wrong = query(wrong).to_vec().unwrap();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let (n, from) = s.recv_from(&mut buf).await.unwrap();
            s.send_to(&wrong, from).await.unwrap();
            if then_right {
                s.send_to(&buf[..n], from).await.unwrap();
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_reply_to_another_question_is_dropped() {
        let req = query("allowed.test.");
        let pkt = req.to_vec().unwrap();
        let up = upstream("evil.test.", true).await;
        let got = forward(up, &pkt, &req, UPSTREAM_TIMEOUT).await.expect("the right reply");
        assert_eq!(Message::from_vec(&got).unwrap().queries(), req.queries());
        // Only the wrong reply: nothing is taken (the wait runs out).
        let up = upstream("evil.test.", false).await;
        assert!(forward(up, &pkt, &req, Duration::from_millis(300)).await.is_none());
    }

    #[test]
    fn ports_follow_the_matching_rules() {
        let t = |s: &str| EgressTarget::parse(s).unwrap();
        let p = EgressPolicy::allow_only(vec![t("a.test:443"), t("a.test:80"), t("*.b.test"), t("c.test:22")]);
        assert_eq!(pin_ports(&p.rules, "a.test"), vec![Some(80), Some(443)]);
        assert_eq!(pin_ports(&p.rules, "x.b.test"), vec![None]);
        assert!(pin_ports(&p.rules, "d.test").is_empty());
    }
}
