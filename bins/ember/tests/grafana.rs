//! The Grafana dashboard (`deploy/grafana/ember-dashboard.json`) against a
//! real Prometheus (Debian's `prometheus`) scraping a real daemon: every
//! panel's query, Grafana's variables replaced, returns series.
mod common;

use common::Daemon;
use ember_types::task::SubmitTaskRequest;
use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Panels whose series only a cluster node exports (docs/observability.md);
/// this test runs one node on its own.
const CLUSTER_ONLY: &[&str] = &["ember_cluster_nodes_alive"];

struct Prometheus {
    child: Child,
    client: ember_client::Client,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn prometheus_bin() -> PathBuf {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("no `prometheus` on PATH: install Debian's package (apt-get install prometheus; .ci/run does)")
    })
}

/// A Prometheus on a free loopback port scraping `target` (host:port) every
/// second into `dir`.
fn start_prometheus(dir: &std::path::Path, target: &str) -> Prometheus {
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let cfg = dir.join("prometheus.yml");
    let yml = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: ember\n    \
         static_configs:\n      - targets: ['{target}']\n"
    );
    std::fs::write(&cfg, yml).expect("write prometheus.yml");
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("prometheus log");
    let child = Command::new(prometheus_bin())
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    let client = ember_client::Client::new(&format!("http://127.0.0.1:{port}"), None).expect("client");
    Prometheus { child, client }
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Prometheus {
    /// The instant query's result vector, `None` while Prometheus is not up.
    async fn query(&self, q: &str) -> Option<Vec<Value>> {
        let (status, body) = self.client.get_raw(&format!("/api/v1/query?query={}", encode(q))).await.ok()?;
        let v: Value = serde_json::from_slice(&body).ok()?;
        assert!(status.is_success(), "query {q:?} refused: {v}");
        v["data"]["result"].as_array().cloned()
    }

    /// Waits until `n` scrapes of the daemon succeeded (rates need two).
    async fn wait_scrapes(&self, n: u32) {
        let q = "sum_over_time(up{job=\"ember\"}[5m])";
        for _ in 0..600 {
            let got = self.query(q).await.unwrap_or_default();
            let scrapes = got.first().and_then(|r| r["value"][1].as_str()).and_then(|s| s.parse::<f64>().ok());
            if scrapes.is_some_and(|s| s >= n as f64) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("Prometheus did not scrape the daemon {n} times");
    }
}

/// Every `expr` of the dashboard's panels, with the panel's title.
fn panel_queries() -> Vec<(String, String)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/ember-dashboard.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard")).expect("JSON");
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            // Grafana's variables, as Grafana would expand them here.
            let expr = expr.replace("$__rate_interval", "1m").replace("$job", "ember");
            out.push((p["title"].as_str().unwrap_or("?").to_string(), expr));
        }
    }
    out
}

/// What makes every series exist: a cold create, a pool and a claim from it,
/// an exec, a task.
async fn exercise(d: &Daemon) {
    let cold = d.create(|_| {}).await;
    d.warm_pool(1).await;
    let warm = d.create(|_| {}).await;
    assert_eq!(warm.launch.as_ref().map(|l| l.kind.as_str()), Some("warm"), "the second create is a claim");
    for id in [&cold.id, &warm.id] {
        let (code, out, _) = d.sh(id, "echo ok", None).await;
        assert_eq!((code, out.trim()), (Some(0), "ok"));
    }
    let task = SubmitTaskRequest { command: vec!["true".into()], ..Default::default() };
    d.client.submit_task(&task).await.expect("submit a task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_panel_query_returns_series_from_a_real_prometheus() {
    let bin = prometheus_bin();
    let d = Daemon::start();
    exercise(&d).await;
    let dir = tempfile_dir();
    let target = d.url.trim_start_matches("http://").trim_end_matches('/').to_string();
    let prom = start_prometheus(&dir, &target);
    prom.wait_scrapes(3).await;
    let mut empty = Vec::new();
    let queries = panel_queries();
    assert!(queries.len() >= 12, "the dashboard's panels were read: {queries:?}");
    for (title, expr) in &queries {
        if CLUSTER_ONLY.iter().any(|m| expr.contains(m)) {
            continue;
        }
        let got = prom.query(expr).await.expect("Prometheus answers");
        if got.is_empty() {
            empty.push(format!("{title}: {expr}"));
        }
    }
    assert!(empty.is_empty(), "panel queries with no series ({}):\n{}", bin.display(), empty.join("\n"));
    // Series that exist are not enough: the exercise fed them.
    for (q, at_least) in [
        ("ember_exec_seconds_count", 2.0),
        ("sum(ember_sandbox_launch_seconds_count{launch=\"warm\"})", 1.0),
        ("sum(ember_pool_claims_total)", 1.0),
        ("sum(ember_pool_claimed)", 1.0),
        ("sum(ember_sandboxes_by_class{state=\"Running\"})", 2.0),
    ] {
        let got = prom.query(q).await.expect("Prometheus answers");
        let v = got.first().and_then(|r| r["value"][1].as_str()).and_then(|s| s.parse::<f64>().ok());
        assert!(v.is_some_and(|v| v >= at_least), "{q} = {v:?}, expected at least {at_least}");
    }
    drop(prom);
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ember-grafana-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("prometheus dir");
    dir
}
