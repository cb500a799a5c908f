//! Egress networking, proved against a little internet of network namespaces
//! this test builds on the machine (see `common/internet.rs`); no packet is
//! ever aimed at an address the test did not create.
mod common;

use common::internet::Internet;
use common::Daemon;
use ember_types::api::CreatePoolRequest;
use ember_types::{DeniedFlow, EgressPolicy, EgressTarget};
use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

/// A daemon with egress networking on its own range, tag and nflog group,
/// forwarding DNS to the test's DNS host, and that internet (`k` picks both).
fn setup(k: u8) -> (Daemon, Internet) {
    let pid = std::process::id() % 100_000;
    let tag = format!("n{pid}{k:x}");
    let range = format!("10.213.{}.0/24", 100 + k);
    let group = (5000 + (pid % 400) * 16 + k as u32).to_string();
    let dns = format!("203.0.113.{}:53", 16 * k + 10);
    let d = Daemon::start_with(&[
        "--network-range",
        &range,
        "--network-tag",
        &tag,
        "--nflog-group",
        &group,
        "--dns-upstream",
        &dns,
        "--network-slots",
        "2",
    ]);
    let inet = Internet::build(&format!("i{pid}{k:x}"), k);
    (d, inet)
}

async fn curl(d: &Daemon, id: &str, args: &str) -> (bool, String, String) {
    let (code, out, err) = d.sh(id, &format!("curl -sS --max-time 3 {args}"), None).await;
    (code == Some(0), out.trim().to_string(), err)
}

/// A DNS query for allowed.test sent straight to `server` over UDP; true if
/// any answer came back within 2 s.
async fn raw_dns(d: &Daemon, id: &str, server: Ipv4Addr) -> bool {
    let q = r"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07allowed\x04test\x00\x00\x01\x00\x01";
    let script = format!("exec 3<>/dev/udp/{server}/53; printf '{q}' >&3; timeout 2 head -c 12 <&3 | wc -c");
    let (_, out, _) = d.sh(id, &format!("bash -c \"{script}\""), None).await;
    out.trim().parse::<u32>().unwrap_or(0) >= 12
}

async fn events_until(d: &Daemon, id: &str, pred: impl Fn(&[DeniedFlow]) -> bool) -> Vec<DeniedFlow> {
    for _ in 0..40 {
        let evs = d.client.network_events(id).await.expect("events");
        if pred(&evs) {
            return evs;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    d.client.network_events(id).await.expect("events")
}

fn has(evs: &[DeniedFlow], rule: &str, dest: &str) -> bool {
    evs.iter().any(|e| e.rule == rule && e.destination == dest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn none_has_no_route_egress_reaches_the_web_and_nothing_local() {
    let (d, inet) = setup(1);
    let web = inet.allowed.to_string();

    let none = d.create(|_| {}).await;
    let (code, _, err) = d.sh(&none.id, &format!("bash -c 'echo > /dev/tcp/{web}/80'"), None).await;
    assert!(code != Some(0) && err.contains("Network is unreachable"), "network none must have no route: {err}");
    let (_, routes, _) = d.sh(&none.id, "tail -n +2 /proc/net/route | wc -l", None).await;
    assert_eq!(routes.trim(), "0");

    let a = d.create(|r| r.network = Some("egress".into())).await;
    assert_eq!(a.network.as_deref(), Some("egress"));
    let (ok, out, err) = curl(&d, &a.id, &format!("http://{web}/")).await;
    assert!(ok && out == format!("web:{web}"), "egress reaches the web host: {out} {err}");
    let (_, out, _) = d.sh(&a.id, "getent hosts allowed.test", None).await;
    assert!(out.contains(&web), "the node's resolver forwards: {out}");
    assert!(raw_dns(&d, &a.id, inet.dns).await, "open egress may query any resolver");

    // The host: a service on all of the host's addresses, aimed at through
    // the test link's host end and through the sandbox's own gateway.
    let host = TcpListener::bind("0.0.0.0:0").expect("host listener");
    let port = host.local_addr().unwrap().port();
    let addr: Ipv4Addr = d.client.network(&a.id).await.unwrap().address.unwrap().parse().unwrap();
    let gateway = Ipv4Addr::from(u32::from(addr) - 1);
    for target in [inet.host_side, gateway] {
        let (ok, _, _) = curl(&d, &a.id, &format!("--max-time 2 http://{target}:{port}/")).await;
        assert!(!ok, "the host at {target} must be unreachable");
    }
    // A private-range host the test made: denied by default, allowed by a CIDR rule.
    let (ok, _, _) = curl(&d, &a.id, &format!("--max-time 2 http://{}/", inet.corp)).await;
    assert!(!ok, "private ranges are denied under open egress");

    // Another sandbox: its loopback service works for itself, not for others.
    let b = d
        .create(|r| {
            r.network = Some("egress".into());
            r.entrypoint = Some(vec!["python3".into(), "-m".into(), "http.server".into(), "8080".into()]);
        })
        .await;
    let mut up = false;
    for _ in 0..50 {
        if curl(&d, &b.id, "--max-time 1 -o /dev/null http://127.0.0.1:8080/").await.0 {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "a loopback service inside an egress sandbox keeps working");
    let b_addr = d.client.network(&b.id).await.unwrap().address.unwrap();
    let (ok, _, _) = curl(&d, &a.id, &format!("--max-time 2 http://{b_addr}:8080/")).await;
    assert!(!ok, "sandbox-to-sandbox traffic must be blocked");

    let evs = events_until(&d, &a.id, |e| has(e, "sandbox", &b_addr)).await;
    for (rule, dest) in [
        ("host", inet.host_side.to_string()),
        ("host", gateway.to_string()),
        ("private", inet.corp.to_string()),
        ("sandbox", b_addr.clone()),
    ] {
        assert!(has(&evs, rule, &dest), "no {rule} event for {dest}: {evs:#?}");
    }
    assert!(evs.iter().any(|e| e.port == Some(port) && e.protocol == "tcp"), "{evs:#?}");
    let (_, metrics) = d.client.get_raw("/metrics").await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics).into_owned();
    assert!(metrics.contains("ember_network_denied_flows_total{rule=\"sandbox\"}"), "{metrics}");

    // Warm claim from a pool with egress: the slot is joined and policed already.
    let req = CreatePoolRequest {
        name: Some("eg".into()),
        template: "host".into(),
        max: 1,
        target: Some(1.into()),
        network: Some("egress".into()),
        ..Default::default()
    };
    d.client.create_pool(&req).await.expect("pool");
    for _ in 0..100 {
        if d.client.get_pool("eg").await.unwrap().idle == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let w = d.create(|r| r.network = Some("egress".into())).await;
    assert_eq!(w.launch.as_ref().map(|l| l.kind.as_str()), Some("warm"));
    let (ok, out, _) = curl(&d, &w.id, &format!("http://{web}/")).await;
    assert!(ok && out == format!("web:{web}"), "a warm egress sandbox reaches the web: {out}");
    d.client.delete_pool("eg").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_list_admits_pinned_names_only() {
    let (d, inet) = setup(2);
    let (allowed, denied, other) = (inet.allowed.to_string(), inet.denied.to_string(), inet.other.to_string());
    let s =
        d.create(|r| r.allow = vec!["allowed.test:80".into(), "*.wild.test".into(), format!("{}/30", inet.corp)]).await;
    let (ok, out, err) = curl(&d, &s.id, "http://allowed.test/").await;
    assert!(ok && out == format!("web:{allowed}"), "allowed.test is admitted: {out} {err}");
    let (ok, _, _) = curl(&d, &s.id, "--max-time 2 http://allowed.test:8080/").await;
    assert!(!ok, "the pin holds only the rule's port");
    let evs = events_until(&d, &s.id, |e| has(e, "default", &allowed)).await;
    assert!(evs.iter().any(|e| e.destination == allowed && e.port == Some(8080)), "{evs:#?}");
    // The wildcard rule names no port: its answer (the same address) opens all.
    let (ok, out, _) = curl(&d, &s.id, "http://a.wild.test/").await;
    assert!(ok && out == format!("web:{allowed}"), "*.wild.test is admitted: {out}");
    let (ok, _, _) = curl(&d, &s.id, &format!("http://{}/", inet.corp)).await;
    assert!(ok, "an explicit CIDR rule opens a private range");

    let (ok, _, err) = curl(&d, &s.id, "http://denied.test/").await;
    assert!(!ok && err.contains("resolve"), "denied.test does not resolve: {err}");
    let (ok, _, _) = curl(&d, &s.id, &format!("--max-time 2 http://{other}/")).await;
    assert!(!ok, "direct IP access to a non-allowed address is blocked");
    assert!(!raw_dns(&d, &s.id, inet.dns).await, "DNS to a rogue resolver is blocked");
    let (ok, _, _) =
        curl(&d, &s.id, &format!("--max-time 2 --resolve allowed.test:80:{denied} http://allowed.test/")).await;
    assert!(!ok, "a forged SNI/Host for an allowed name at a denied address is blocked");
    let (ok, _, _) = curl(&d, &s.id, &format!("--max-time 2 -H 'Host: allowed.test' http://{denied}/")).await;
    assert!(!ok, "a forged Host header does not open a denied address");

    let evs = events_until(&d, &s.id, |e| has(e, "dns", &inet.dns.to_string())).await;
    assert!(evs.iter().any(|e| e.kind == "dns" && e.rule == "name" && e.destination == "denied.test"), "{evs:#?}");
    assert!(has(&evs, "default", &other), "{evs:#?}");
    assert!(has(&evs, "default", &denied), "{evs:#?}");
    assert!(has(&evs, "dns", &inet.dns.to_string()), "{evs:#?}");

    // The CLI shows the policy and the events, and replaces the policy at runtime.
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(args)
            .env("EMBER_URL", &d.url)
            .output()
            .expect("ember runs");
        assert!(out.status.success(), "ember {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = cli(&["sandbox", "policy", &s.id]);
    assert!(shown.contains("allow allowed.test:80") && shown.contains("DNS pinning"), "{shown}");
    assert!(cli(&["sandbox", "events", &s.id]).contains("denied.test"));
    let updated = cli(&["sandbox", "policy", &s.id, "--allow", &other]);
    assert!(updated.contains(&format!("allow {other}")), "{updated}");
    // The change is in the audit log as a policy change (docs/tenancy.md).
    let log = std::fs::read_to_string(d.data_dir.join("audit/audit.jsonl")).expect("the audit log");
    let changes: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["action"] == "policy.update" && r["path"] == format!("/v1/sandboxes/{}/network", s.id))
        .collect();
    assert_eq!(changes.iter().map(|r| r["outcome"].as_str()).collect::<Vec<_>>(), [Some("ok")], "{log}");
    let (ok, out, _) = curl(&d, &s.id, &format!("http://{other}/")).await;
    assert!(ok && out == format!("web:{other}"), "the updated policy admits {other}: {out}");
    let (ok, _, _) = curl(&d, &s.id, "http://a.wild.test/").await;
    assert!(!ok, "the updated policy no longer admits *.wild.test");

    // The API refuses bad targets with {code, message}.
    let bad = EgressPolicy::allow_only(vec![EgressTarget::parse("x.test").unwrap()]);
    let none = d.create(|_| {}).await;
    let e = d.client.set_network_policy(&none.id, &bad).await.unwrap_err().to_string();
    assert!(e.contains("SANDBOX::INVALID_PARAMETER"), "{e}");
    let mut req = ember_types::api::CreateSandboxRequest { template: Some("host".into()), ..Default::default() };
    req.allow = vec!["10.0.0.0/33".into()];
    let e = d.client.create_sandbox(&req).await.unwrap_err().to_string();
    assert!(e.contains("SANDBOX::INVALID_PARAMETER") && e.contains("prefix"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_live_slots_and_reclaims_dead_ones() {
    let (mut d, inet) = setup(3);
    let web = inet.allowed.to_string();
    let live = d.create(|r| r.allow = vec![web.clone()]).await;
    let dead = d.create(|r| r.network = Some("egress".into())).await;
    d.kill9();
    // The second sandbox dies while no daemon watches it.
    for pid in d.procs(&dead.id) {
        let _ = std::process::Command::new("kill").args(["-9", &pid.to_string()]).output();
    }
    for _ in 0..100 {
        if d.procs(&dead.id).is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(d.procs(&dead.id).is_empty(), "the killed sandbox is gone before the restart");
    d.spawn();
    // Its init may still be a zombie at the restart, re-adopted and then seen
    // to exit: either way it must end and give its slot back.
    let mut state = String::new();
    for _ in 0..200 {
        state = d.client.get_sandbox(&dead.id).await.unwrap().status.state;
        if state == "Failed" || state == "Terminated" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(state == "Failed" || state == "Terminated", "the killed sandbox ended: {state}");
    let node = d.client.network_node().await.expect("network");
    let all = d.client.list_sandboxes("").await.unwrap();
    let states: Vec<_> = all.iter().map(|s| (s.id.clone(), s.status.state.clone())).collect();
    assert_eq!(
        node.in_use, 1,
        "only the live sandbox holds a slot: {node:?} {states:?} live={} dead={}",
        live.id, dead.id
    );
    let (ok, out, _) = curl(&d, &live.id, &format!("http://{web}/")).await;
    assert!(ok && out == format!("web:{web}"), "the re-adopted sandbox keeps its network: {out}");
    let (ok, _, _) = curl(&d, &live.id, &format!("--max-time 2 http://{}/", inet.other)).await;
    assert!(!ok, "and its allow-list");
    d.client.delete_sandbox(&live.id).await.unwrap();
    let node = d.client.network_node().await.unwrap();
    assert_eq!(node.in_use, 0);
    assert!(node.ready >= 2, "released slots are scrubbed and ready again: {node:?}");
}
