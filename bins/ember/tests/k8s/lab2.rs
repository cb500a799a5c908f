//! `ember lab run 2` with its Kubernetes leg against the live API server
//! (etcd fsyncing, as in a real cluster), `ember operator` and a real node:
//! each of the burst's Sandbox resources became Ready through the operator,
//! as each create through ember's API did; the burst wrote to etcd at least
//! once per request; the API server's CPU was measured (its process found in
//! /proc by its port); the lab removed its resources and sandboxes. The
//! invariants are read from report.json, never the timings. The scale is
//! `EMBER_LAB2_SCALE` (default small; labs/02-on-demand/README.md's figures
//! come from this test run with `full`).
use super::{install_crds, Operator};
use crate::common::Daemon;
use ember_operator::crd::Sandbox;
use kube::api::Api;
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_2_routes_cold_creates_through_the_api_server_and_measures_what_the_burst_cost() {
    let server = ember_operator::testing::ApiServer::start_fsync().await;
    let kube = server.client().await;
    install_crds(&kube).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let daemon = Daemon::start_with(&["--insecure-registry", &format!("127.0.0.1:{port}")]);
    let _op = Operator::start(&server.kubeconfig, &daemon.url, &[]);
    let dir = daemon.data_dir.with_extension("lab2k8s");
    let _ = std::fs::remove_dir_all(&dir);
    let scale = std::env::var("EMBER_LAB2_SCALE").unwrap_or_else(|_| "small".into());
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["lab", "run", "2", "--scale", &scale, "--registry-port", &port.to_string(), "--out"])
        .arg(&dir)
        .arg("--kubeconfig")
        .arg(&server.kubeconfig)
        .env("EMBER_URL", &daemon.url)
        .output()
        .expect("ember lab runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    let raw = std::fs::read(dir.join("report.json")).unwrap_or_else(|e| panic!("no report.json ({e}): {text}\n{err}"));
    eprintln!("{text}");
    assert!(out.status.success(), "lab 2 failed: {text}\n{err}");
    let v: serde_json::Value = serde_json::from_slice(&raw).expect("report.json parses");
    let invariants = v["invariants"].as_array().expect("invariants");
    for name in [
        "every request of both paths became Ready",
        "the Kubernetes path wrote to etcd at least once per request",
        "the API server's CPU during the burst was measured",
    ] {
        let i = invariants.iter().find(|i| i["name"] == name).unwrap_or_else(|| panic!("no {name}: {invariants:?}"));
        assert_eq!(i["holds"], true, "{i}");
    }
    let leg = &v["data"]["kubernetesLeg"];
    let n = leg["requests"].as_u64().expect("requests");
    assert_eq!((leg["kubernetes"]["ready"].as_u64(), leg["ember"]["ready"].as_u64()), (Some(n), Some(n)), "{leg}");
    assert!(leg["kubernetes"]["etcdPuts"].as_f64().is_some_and(|p| p >= n as f64), "{leg}");
    // etcd fsyncs here: its WAL histogram counted the burst's writes.
    assert!(leg["kubernetes"]["walFsync"]["count"].as_f64().is_some_and(|c| c > 0.0), "{leg}");
    assert!(leg["kubernetes"]["apiserverCpuSeconds"].as_f64().is_some_and(|c| c > 0.0), "{leg}");
    assert!(leg["apiserver"].as_str().is_some_and(|s| s.starts_with("/proc")), "{leg}");
    // Every phase came from the operator's status times, one per request.
    assert_eq!(leg["phases"]["node"]["samples"].as_u64(), Some(n), "{leg}");
    // The lab removed its Sandbox resources (their finalizers, the sandboxes).
    let sandboxes: Api<Sandbox> = Api::namespaced(kube.clone(), "default");
    assert!(sandboxes.list(&Default::default()).await.expect("list").items.is_empty());
    let left = daemon.client.list_sandboxes("").await.expect("sandboxes");
    assert!(left.iter().all(|s| s.status.state == "Terminated"), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
