//! `ember serve --log-format json`: one JSON object a line; every line of a
//! request carries its request id, and a claim's spans (pool pop, workspace
//! bind, agent claim, the record) and the first exec's close with their times.
mod common;

use common::Daemon;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// The `request` span's id of a log line, and the names of its spans.
fn request_of(line: &Value) -> Option<(String, Vec<String>)> {
    let spans = line["spans"].as_array()?;
    let req = spans.iter().find(|s| s["name"] == "request")?;
    let mut names: Vec<String> = spans.iter().filter_map(|s| s["name"].as_str().map(String::from)).collect();
    // A span's close line names the span that closed as `span`.
    if let Some(n) = line["span"]["name"].as_str() {
        names.push(n.to_string());
    }
    Some((req["request_id"].as_str()?.to_string(), names))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_json_log_lines_share_its_request_id_and_name_its_spans() {
    let log = std::env::temp_dir().join(format!("ember-json-log-{}.log", std::process::id()));
    let d = Daemon::start_logged(&["--log-format", "json"], &log);
    d.warm_pool(1).await;
    let s = d.create(|_| {}).await;
    assert_eq!(s.launch.as_ref().map(|l| l.kind.as_str()), Some("warm"), "a claim");
    let (code, out, _) = d.sh(&s.id, "echo traced", None).await;
    assert_eq!((code, out.trim()), (Some(0), "traced"));

    // The exec's stream ended when `sh` returned; its span's close follows.
    let mut by_request: HashMap<String, BTreeSet<String>> = HashMap::new();
    for _ in 0..200 {
        let text = std::fs::read_to_string(&log).expect("daemon log");
        by_request.clear();
        for l in text.lines() {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}"));
            assert!(v["timestamp"].is_string() && v["level"].is_string(), "a log line: {l}");
            if let Some((id, names)) = request_of(&v) {
                by_request.entry(id).or_default().extend(names);
            }
        }
        if by_request.values().any(|n| n.contains("exec")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let claim = ["request", "pool_claim", "pool_pop", "workspace_bind", "agent_claim", "claim_record"];
    let claims: Vec<_> = by_request.iter().filter(|(_, n)| n.contains("agent_claim")).collect();
    assert_eq!(claims.len(), 1, "one request holds the claim's spans: {by_request:?}");
    let (claim_id, names) = claims[0];
    for want in claim {
        assert!(names.contains(want), "the claim's lines (request {claim_id}) name {want}: {names:?}");
    }
    let execs: Vec<_> = by_request.iter().filter(|(_, n)| n.contains("exec")).collect();
    assert_eq!(execs.len(), 1, "one request holds the exec span: {by_request:?}");
    assert_ne!(execs[0].0, claim_id, "the exec is a request of its own");
    let _ = std::fs::remove_file(&log);
}

/// With the `otlp` feature: the spans reach an OTLP/HTTP receiver. The
/// receiver here is a bare HTTP/1.1 listener: a POST to `/v1/traces` with a
/// non-empty protobuf body is what is checked, not its decoding.
#[cfg(feature = "otlp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_are_exported_over_otlp_http() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    let d = Daemon::start_with(&["--otlp-endpoint", &endpoint]);
    let s = d.create(|_| {}).await;
    // The batch goes out within the exporter's schedule (5 s); the bound
    // below only guards against a daemon that never posts.
    let (mut conn, _) = tokio::time::timeout(Duration::from_secs(60), listener.accept())
        .await
        .expect("a POST in time")
        .expect("accept");
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    let (head, body_len) = loop {
        let n = conn.read(&mut buf).await.expect("read");
        assert!(n > 0, "the exporter hung up: {:?}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            break (head, len);
        }
    };
    let _ = conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
    assert!(head.starts_with("post /v1/traces "), "{head}");
    assert!(head.contains("content-type: application/x-protobuf"), "{head}");
    assert!(body_len > 0, "spans in the body: {head}");
    d.client.delete_sandbox(&s.id).await.expect("remove");
}
