//! A tenant's sandbox quotas hold across the cluster (docs/tenancy.md,
//! "Quotas across a cluster"): creates racing through two nodes take
//! exactly the quota, a removal through one node frees a slot for a create
//! through the other, a SIGKILLed node's sandboxes give their slots back,
//! and usage is the cluster's on every node; so do its workspace, task and
//! pool quotas and its creates per second, creates racing through two
//! nodes included. The tenant and its key are made through one node and
//! used through both (`tenant_state.rs`).
use super::{eventually, nats, node, runtime};
use crate::common::{raw, Daemon};
use serde_json::{json, Value};
use std::time::Duration;

const ADMIN: &str = "cluster-k3y";
/// Guards against a node that never answers; no threshold.
const HANG: Duration = Duration::from_secs(120);

async fn call(d: &Daemon, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    raw::json_call(&d.url, key, (method, path), body, HANG).await
}

/// Tenant `name` made through node `d` with `quotas`, and a key of it.
async fn tenant_on(d: &Daemon, name: &str, quotas: &Value) -> String {
    let (s, b) = call(d, ADMIN, "POST", "/v1/tenants", Some(json!({"name": name, "quotas": quotas}))).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = call(d, ADMIN, "POST", &format!("/v1/tenants/{name}/keys"), None).await;
    assert_eq!(s, 201, "{b}");
    b["key"].as_str().expect("key").to_string()
}

async fn create(d: &Daemon, key: &str) -> (u16, Value) {
    call(d, key, "POST", "/v1/sandboxes", Some(json!({"template": "host"}))).await
}

/// The tenant's running sandboxes as node `d` shows them.
async fn used(d: &Daemon) -> u64 {
    let (_, t) = call(d, ADMIN, "GET", "/v1/tenants/tq", None).await;
    t["usage"]["runningSandboxes"].as_u64().unwrap_or_else(|| panic!("no usage: {t}"))
}

fn refused_by_quota((s, b): &(u16, Value)) -> bool {
    let m = b["message"].as_str().unwrap_or("");
    *s == 429 && b["code"] == "QUOTA::EXCEEDED" && m.contains("runningSandboxes") && m.contains("limit 3")
}

#[test]
fn a_tenants_quota_holds_across_nodes() {
    let nats = nats::NatsCluster::start("tenantquota", 3);
    let keyed = ["--api-key", ADMIN];
    let mut nodes = [node(&nats, "a", &keyed), node(&nats, "b", &keyed)];
    runtime().block_on(async {
        let quotas = json!({"runningSandboxes": 3});
        let key = tenant_on(&nodes[0], "tq", &quotas).await;
        eventually(Duration::from_secs(20), "the key through b", || async {
            let (s, _) = call(&nodes[1], &key, "GET", "/v1/sandboxes", None).await;
            (s == 200).then_some(())
        })
        .await;
        let keys = [key.clone(), key];
        // 8 creates at once, 4 through each node, against 3: exactly 3 pass.
        let creates = (0..8).map(|i| create(&nodes[i % 2], &keys[i % 2]));
        let answers = futures_util::future::join_all(creates).await;
        let made: Vec<(usize, String)> = answers
            .iter()
            .enumerate()
            .filter(|(_, (s, _))| *s == 202)
            .map(|(i, (_, b))| (i % 2, b["id"].as_str().expect("id").to_string()))
            .collect();
        assert_eq!(made.len(), 3, "{answers:?}");
        assert_eq!(answers.iter().filter(|a| refused_by_quota(a)).count(), 5, "{answers:?}");
        // Usage is the cluster's, through either node and in /metrics.
        assert_eq!((used(&nodes[0]).await, used(&nodes[1]).await), (3, 3));
        let addr = nodes[1].url.trim_start_matches("http://").to_string();
        let h = [format!("Host: {addr}"), format!("OPEN-SANDBOX-API-KEY: {ADMIN}")];
        let (_, _, metrics) = raw::exchange(&addr, "GET /metrics", &h, "", HANG).await;
        assert!(metrics.contains("ember_tenant_running_sandboxes{tenant=\"tq\"} 3"), "{metrics}");

        // A removal through one node frees a slot for a create through the other.
        let (via, id) = made[0].clone();
        let (s, b) = call(&nodes[via], &keys[via], "DELETE", &format!("/v1/sandboxes/{id}"), None).await;
        assert_eq!(s, 204, "{b}");
        let other = 1 - via;
        let (s, b) = create(&nodes[other], &keys[other]).await;
        assert_eq!(s, 202, "the freed slot, through the other node: {b}");
        let mut held = [0usize; 2];
        for (n, _) in &made[1..] {
            held[*n] += 1;
        }
        held[other] += 1;
        assert!(refused_by_quota(&create(&nodes[via], &keys[via]).await), "a fourth through {via}");

        // SIGKILL of the node holding the most gives its slots back to the other.
        let victim = if held[0] >= held[1] { 0 } else { 1 };
        let survivor = 1 - victim;
        nodes[victim].kill9();
        let first = eventually(Duration::from_secs(30), "a slot freed by the dead node", || async {
            let got = create(&nodes[survivor], &keys[survivor]).await;
            match got.0 {
                202 => Some(got),
                _ if refused_by_quota(&got) => None,
                _ => panic!("{got:?}"),
            }
        })
        .await;
        assert_eq!(first.0, 202);
        for _ in 1..held[victim] {
            let (s, b) = create(&nodes[survivor], &keys[survivor]).await;
            assert_eq!(s, 202, "{b}");
        }
        assert!(refused_by_quota(&create(&nodes[survivor], &keys[survivor]).await), "over the quota after the kill");
        assert_eq!(used(&nodes[survivor]).await, 3);
    });
}

/// A tenant's pool, workspace and task quotas count what it holds on every
/// node: what was made through one node counts against a create through
/// the other (one after the other; racing creates below).
#[test]
fn a_tenants_pool_workspace_and_task_quotas_count_every_nodes_objects() {
    let nats = nats::NatsCluster::start("tenantobjs", 3);
    let keyed = ["--api-key", ADMIN];
    let nodes = [node(&nats, "a", &keyed), node(&nats, "b", &keyed)];
    runtime().block_on(async {
        let quotas = json!({"poolSize": 2, "workspaceBytes": 100 << 20, "tasks": 1});
        let key = tenant_on(&nodes[0], "tobj", &quotas).await;
        eventually(Duration::from_secs(20), "the key through b", || async {
            let (s, _) = call(&nodes[1], &key, "GET", "/v1/sandboxes", None).await;
            (s == 200).then_some(())
        })
        .await;
        let over = |(s, b): &(u16, Value), quota: &str| {
            *s == 429 && b["code"] == "QUOTA::EXCEEDED" && b["message"].as_str().unwrap_or("").contains(quota)
        };
        let ws = |name: &str| json!({"name": name, "size": "64Mi"});
        let (s, b) = call(&nodes[0], &key, "POST", "/v1/workspaces", Some(ws("tw1"))).await;
        assert_eq!(s, 201, "{b}");
        let got = call(&nodes[1], &key, "POST", "/v1/workspaces", Some(ws("tw2"))).await;
        assert!(over(&got, "workspaceBytes"), "64Mi on a, 64Mi more through b against 100Mi: {got:?}");

        let pool = |name: &str, max: u32| json!({"name": name, "template": "host", "min": 0, "max": max, "target": 0});
        let (s, b) = call(&nodes[0], &key, "POST", "/v1/pools", Some(pool("tp1", 2))).await;
        assert_eq!(s, 201, "{b}");
        let got = call(&nodes[1], &key, "POST", "/v1/pools", Some(pool("tp2", 1))).await;
        assert!(over(&got, "poolSize"), "a pool of 2 through a, 1 more through b against 2: {got:?}");

        let task = json!({"command": ["sleep", "600"]});
        let (s, t) = call(&nodes[0], &key, "POST", "/v1/tasks", Some(task.clone())).await;
        assert_eq!(s, 201, "{t}");
        let got = call(&nodes[1], &key, "POST", "/v1/tasks", Some(task)).await;
        assert!(over(&got, "tasks"), "a task through a, one more through b against 1: {got:?}");
        let tid = t["id"].as_str().expect("task id");
        assert_eq!(call(&nodes[0], &key, "POST", &format!("/v1/tasks/{tid}/cancel"), None).await.0, 200);
    });
}

/// `n` creates of `body(i)` at once on `path`, alternately through node a
/// and node b: how many were made (`made`) and how many refused by `quota`.
async fn race(
    nodes: &[Daemon; 2],
    key: &str,
    path: &str,
    n: usize,
    made: u16,
    quota: &str,
    body: impl Fn(usize) -> Value,
) {
    let calls = (0..n).map(|i| call(&nodes[i % 2], key, "POST", path, Some(body(i))));
    let answers = futures_util::future::join_all(calls).await;
    let over = |(s, b): &(u16, Value)| {
        *s == 429 && b["code"] == "QUOTA::EXCEEDED" && b["message"].as_str().unwrap_or("").contains(quota)
    };
    let passed = answers.iter().filter(|(s, _)| *s == made).count();
    let refused = answers.iter().filter(|a| over(a)).count();
    assert_eq!((passed, refused), (n / 2, n - n / 2), "{n} at {path} against {quota} for {}: {answers:?}", n / 2);
}

/// Creates racing through two nodes take exactly a quota that is not about
/// sandboxes: the cluster's ledger orders them by its compare-and-set and
/// counts the objects between its read and its write (each node checking
/// alone made 6 workspaces of 6 against 3). And creates per second are one
/// bucket for the cluster, not one per node (2 passed in under a second).
#[test]
fn racing_creates_through_two_nodes_take_exactly_each_quota() {
    let nats = nats::NatsCluster::start("tenantrace", 3);
    let keyed = ["--api-key", ADMIN];
    let nodes = [node(&nats, "a", &keyed), node(&nats, "b", &keyed)];
    runtime().block_on(async {
        let quotas = json!({"workspaceBytes": 3 * (64 << 20), "tasks": 3, "poolSize": 2, "createsPerSecond": 1});
        let key = tenant_on(&nodes[0], "trace", &quotas).await;
        eventually(Duration::from_secs(20), "the key through b", || async {
            let (s, _) = call(&nodes[1], &key, "GET", "/v1/sandboxes", None).await;
            (s == 200).then_some(())
        })
        .await;
        race(
            &nodes,
            &key,
            "/v1/workspaces",
            6,
            201,
            "workspaceBytes",
            |i| json!({"name": format!("rw{i}"), "size": "64Mi"}),
        )
        .await;
        race(&nodes, &key, "/v1/tasks", 6, 201, "tasks", |_| json!({"command": ["sleep", "600"]})).await;
        let pool = |i: usize| json!({"name": format!("rp{i}"), "template": "host", "min": 0, "max": 1, "target": 0});
        race(&nodes, &key, "/v1/pools", 4, 201, "poolSize", pool).await;

        // 6 sandbox creates at once against 1 a second: one token, and one
        // more for each whole second the burst took.
        let started = std::time::Instant::now();
        let creates = (0..6).map(|i| create(&nodes[i % 2], &key));
        let answers = futures_util::future::join_all(creates).await;
        let took = started.elapsed().as_secs() as usize;
        let passed = answers.iter().filter(|(s, _)| *s == 202).count();
        let rated =
            |(s, b): &(u16, Value)| *s == 429 && b["message"].as_str().unwrap_or("").contains("createsPerSecond");
        assert!(passed >= 1 && passed <= 1 + took, "{passed} of 6 passed in {took} s against 1/s: {answers:?}");
        assert_eq!(answers.iter().filter(|a| rated(a)).count(), 6 - passed, "{answers:?}");
    });
}
