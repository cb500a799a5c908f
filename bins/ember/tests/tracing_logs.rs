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
