//! A little internet made of network namespaces on this machine, for the
//! egress tests. Nothing in it routes off the machine:
//! - "web" (`<tag>w`): 203.0.113.(16k+2) `allowed`, +3 `denied`, +4 `other`,
//!   an HTTP server on port 80 answering `web:<address it was reached on>`;
//! - "dns" (`<tag>d`): 203.0.113.(16k+10), an authoritative responder for
//!   `allowed.test`, `*.wild.test` (→ allowed) and `denied.test` (→ denied);
//! - "corp" (`<tag>c`): 172.29.k.2, a private-range host with the same server.
//!
//! Each is linked to the host by a veth; the host ends get the .1/.9 addresses.
//! Build it after the daemon starts (the daemon denies the host's networks
//! as they are at its start).
use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{rdata::A, RData, Record};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct Internet {
    pub tag: String,
    pub allowed: Ipv4Addr,
    pub denied: Ipv4Addr,
    pub other: Ipv4Addr,
    pub dns: Ipv4Addr,
    pub corp: Ipv4Addr,
    /// A host address on the web link (the host itself, as a sandbox could aim at it).
    pub host_side: Ipv4Addr,
    stop: Arc<AtomicBool>,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip runs");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Namespace `ns` linked to the host: host end `host_if` with `host_cidr`,
/// inside `eth0` with `addrs`, default route via `gw`.
fn link(ns: &str, host_if: &str, host_cidr: &str, addrs: &[String], gw: &str) {
    ip(&["netns", "add", ns]);
    ip(&["link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns]);
    ip(&["addr", "add", host_cidr, "dev", host_if]);
    ip(&["link", "set", host_if, "up"]);
    ip(&["-n", ns, "link", "set", "lo", "up"]);
    for a in addrs {
        ip(&["-n", ns, "addr", "add", a, "dev", "eth0"]);
    }
    ip(&["-n", ns, "link", "set", "eth0", "up"]);
    ip(&["-n", ns, "route", "add", "default", "via", gw]);
}

fn in_ns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    ember_sys::netns::run_in(&PathBuf::from("/run/netns").join(ns), f).expect("enter test netns")
}

impl Internet {
    /// `k` (0..15) picks the subnets; `tag` (≤ 6 chars) names the namespaces.
    pub fn build(tag: &str, k: u8) -> Internet {
        let base = 16 * k;
        let a = |o: u8| Ipv4Addr::new(203, 0, 113, base + o);
        let net = Internet {
            tag: tag.to_string(),
            allowed: a(2),
            denied: a(3),
            other: a(4),
            dns: a(10),
            corp: Ipv4Addr::new(172, 29, k, 2),
            host_side: a(1),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let web: Vec<String> = [2, 3, 4].iter().map(|o| format!("{}/29", a(*o))).collect();
        link(&format!("{tag}w"), &format!("{tag}w"), &format!("{}/29", a(1)), &web, &a(1).to_string());
        link(
            &format!("{tag}d"),
            &format!("{tag}d"),
            &format!("{}/29", a(9)),
            &[format!("{}/29", a(10))],
            &a(9).to_string(),
        );
        let corp_gw = Ipv4Addr::new(172, 29, k, 1);
        link(
            &format!("{tag}c"),
            &format!("{tag}c"),
            &format!("{corp_gw}/30"),
            &[format!("{}/30", net.corp)],
            &corp_gw.to_string(),
        );
        for ns in [format!("{tag}w"), format!("{tag}c")] {
            let l = in_ns(&ns, || TcpListener::bind("0.0.0.0:80")).expect("web listener");
            serve_http(l, net.stop.clone());
        }
        let u = in_ns(&format!("{tag}d"), || UdpSocket::bind("0.0.0.0:53")).expect("dns socket");
        serve_dns(u, net.allowed, net.denied, net.stop.clone());
        net
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for s in ["w", "d", "c"] {
            let n = format!("{}{s}", self.tag);
            let _ = Command::new("ip").args(["link", "del", &n]).output();
            let _ = Command::new("ip").args(["netns", "del", &n]).output();
        }
    }
}

fn serve_http(l: TcpListener, stop: Arc<AtomicBool>) {
    l.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            match l.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                    let mut buf = [0u8; 2048];
                    let _ = s.read(&mut buf);
                    let local = s.local_addr().map(|a| a.ip().to_string()).unwrap_or_default();
                    let body = format!("web:{local}\n");
                    let _ = write!(s, "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
}

fn serve_dns(u: UdpSocket, allowed: Ipv4Addr, denied: Ipv4Addr, stop: Arc<AtomicBool>) {
    u.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while !stop.load(Ordering::SeqCst) {
            let Ok((n, from)) = u.recv_from(&mut buf) else { continue };
            let Ok(q) = Message::from_vec(&buf[..n]) else { continue };
            let mut r = Message::new();
            r.set_id(q.id()).set_message_type(MessageType::Response).set_op_code(q.op_code());
            r.set_authoritative(true).set_recursion_desired(q.recursion_desired());
            r.add_queries(q.queries().to_vec());
            if let Some(query) = q.queries().first() {
                let name = query.name().to_ascii().trim_end_matches('.').to_ascii_lowercase();
                let addr = match name.as_str() {
                    "allowed.test" => Some(allowed),
                    n if n.ends_with(".wild.test") => Some(allowed),
                    "denied.test" => Some(denied),
                    _ => None,
                };
                match (addr, query.query_type()) {
                    (Some(a), hickory_proto::rr::RecordType::A) => {
                        r.add_answer(Record::from_rdata(query.name().clone(), 60, RData::A(A(a))));
                    }
                    (Some(_), _) => {}
                    (None, _) => {
                        r.set_response_code(ResponseCode::NXDomain);
                    }
                }
            }
            if let Ok(bytes) = r.to_vec() {
                let _ = u.send_to(&bytes, from);
            }
        }
    });
}
