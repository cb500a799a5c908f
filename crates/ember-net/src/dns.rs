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
        let pkt = buf[..n].to_vec();
        let sock = sock.clone();
        tokio::spawn(async move {
            if let Some(reply) = answer(&net, from, &pkt).await {
                let _ = sock.send_to(&reply, from).await;
            }
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

async fn answer(net: &Arc<Network>, from: SocketAddr, pkt: &[u8]) -> Option<Vec<u8>> {
    let IpAddr::V4(src) = from.ip() else { return None };
    let (slot, sandbox, policy) = net.lookup(src)?;
    let req = Message::from_vec(pkt).ok()?;
    let Some(q) = req.queries().first() else { return reply_code(&req, ResponseCode::FormErr) };
    let qname = q.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
    let qtype = q.query_type();
    if !policy.name_allowed(&qname) {
        net.dns_denied(&sandbox, &qname);
        return reply_code(&req, ResponseCode::Refused);
    }
    let Some(raw) = forward(net.upstream(), pkt, req.id()).await else {
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
/// the same id.
async fn forward(upstream: SocketAddr, pkt: &[u8], id: u16) -> Option<Vec<u8>> {
    let exchange = async {
        let s = UdpSocket::bind("0.0.0.0:0").await.ok()?;
        s.connect(upstream).await.ok()?;
        s.send(pkt).await.ok()?;
        let mut buf = vec![0u8; 4096];
        loop {
            let n = s.recv(&mut buf).await.ok()?;
            if n >= 2 && u16::from_be_bytes([buf[0], buf[1]]) == id {
                buf.truncate(n);
                return Some(buf);
            }
        }
    };
    tokio::time::timeout(UPSTREAM_TIMEOUT, exchange).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_types::EgressPolicy;

    #[test]
    fn ports_follow_the_matching_rules() {
        let t = |s: &str| EgressTarget::parse(s).unwrap();
        let p = EgressPolicy::allow_only(vec![t("a.test:443"), t("a.test:80"), t("*.b.test"), t("c.test:22")]);
        assert_eq!(pin_ports(&p.rules, "a.test"), vec![Some(80), Some(443)]);
        assert_eq!(pin_ports(&p.rules, "x.b.test"), vec![None]);
        assert!(pin_ports(&p.rules, "d.test").is_empty());
    }
}
