//! `ember bench k8s` end to end against the live API server, a real node and
//! `ember operator`: the three figures complete with every claim answered,
//! the Kubernetes ones through a SandboxClaim (ember's, then agent-sandbox's)
//! watched to Ready, and the bench removes everything it made. The claim count
//! is `EMBER_BENCH_K8S_CLAIMS` (default 10; the figures docs/kubernetes.md
//! reports come from this test run with more).
use super::{setup, Operator};
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_k8s_times_claims_through_kubernetes_and_through_ember() {
    let (server, _kube, daemon) = setup().await;
    let _op = Operator::start(&server.kubeconfig, &daemon.url, &[]);
    let claims: usize = std::env::var("EMBER_BENCH_K8S_CLAIMS").ok().and_then(|n| n.parse().ok()).unwrap_or(10);
    let n = claims.to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["--url", &daemon.url, "bench", "k8s", "--claims", &n, "--tasks", "2", "--json", "--kubeconfig"])
        .arg(&server.kubeconfig)
        .output()
        .expect("ember bench k8s runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "bench failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{text}");
    let got: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let figs = got["figures"].as_array().expect("figures");
    let through: Vec<&str> = figs.iter().filter_map(|f| f["through"].as_str()).collect();
    assert_eq!(through, ["kubernetes", "ember API", "agent-sandbox"], "{got}");
    for f in figs {
        assert_eq!(f["failed"], 0, "{f}");
        let answered = f["ready"]["samples"].as_u64().unwrap_or(0) + f["cold"].as_u64().unwrap_or(0);
        assert_eq!(answered, claims as u64, "{f}");
        assert!(f["ready"]["p50Ms"].as_f64().is_some_and(|p| p > 0.0), "{f}");
    }
    // The bench removed what it made: no pool left on the node.
    let pools = daemon.client.list_pools().await.expect("pools");
    assert!(pools.is_empty(), "{pools:?}");
    let left = daemon.client.list_sandboxes("").await.expect("sandboxes");
    assert!(left.iter().all(|s| s.status.state == "Terminated"), "{left:?}");
}
