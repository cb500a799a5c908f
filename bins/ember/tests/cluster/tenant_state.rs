//! Tenants are the cluster's (docs/tenancy.md, "Tenants across a
//! cluster"): a tenant and its keys made through one node hold on every
//! node, a key revoked through one is refused by the others, keys created at
//! once through two nodes both survive, a restarted node knows them before
//! it serves.
use super::{eventually, nats, node, runtime};
use crate::common::{raw, Daemon};
use serde_json::{json, Value};
use std::time::Duration;

const ADMIN: &str = "cluster-k3y";
/// Guards against a node that never answers; no threshold.
const HANG: Duration = Duration::from_secs(120);
/// How long a change made through one node may take to reach another's
/// copy before the test fails: a bound on a hang (the watch delivers in
/// milliseconds), not a timing assertion.
const SPREAD: Duration = Duration::from_secs(20);

async fn call(d: &Daemon, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    raw::json_call(&d.url, key, (method, path), body, HANG).await
}

fn two_nodes(name: &str) -> (nats::NatsCluster, [Daemon; 2]) {
    let nats = nats::NatsCluster::start(name, 3);
    let keyed = ["--api-key", ADMIN];
    let nodes = [node(&nats, "a", &keyed), node(&nats, "b", &keyed)];
    (nats, nodes)
}

/// Tenant `name` made through `d`, and a key of it made there.
async fn tenant(d: &Daemon, name: &str) -> String {
    let (s, b) = call(d, ADMIN, "POST", "/v1/tenants", Some(json!({"name": name}))).await;
    assert_eq!(s, 201, "{b}");
    key(d, name).await
}

async fn key(d: &Daemon, name: &str) -> String {
    let (s, b) = call(d, ADMIN, "POST", &format!("/v1/tenants/{name}/keys"), None).await;
    assert_eq!(s, 201, "{b}");
    b["key"].as_str().expect("key").to_string()
}

/// The status `key` gets for a list of sandboxes through `d`.
async fn list_status(d: &Daemon, key: &str) -> u16 {
    call(d, key, "GET", "/v1/sandboxes", None).await.0
}

/// Waits until `key` gets `want` through `d` (any other answer but 401/200 fails).
async fn until_status(d: &Daemon, key: &str, want: u16, what: &str) {
    eventually(SPREAD, what, || async {
        match list_status(d, key).await {
            s if s == want => Some(()),
            200 | 401 => None,
            s => panic!("{what}: {s}"),
        }
    })
    .await
}

#[test]
fn tenants_and_keys_made_through_one_node_hold_on_every_node() {
    let (_nats, mut nodes) = two_nodes("tenantkeys");
    runtime().block_on(async {
        let first = tenant(&nodes[0], "ta").await;
        assert_eq!(list_status(&nodes[0], &first).await, 200, "the node that made it knows it at once");
        until_status(&nodes[1], &first, 200, "a key made through a, used through b").await;
        let (s, b) = call(&nodes[1], ADMIN, "POST", "/v1/tenants", Some(json!({"name": "ta"}))).await;
        assert_eq!((s, b["code"].as_str()), (409, Some("TENANT::EXISTS")), "the name is taken cluster-wide: {b}");

        // Two keys at once through the two nodes: both survive.
        let (k2, k3) = futures_util::join!(key(&nodes[0], "ta"), key(&nodes[1], "ta"));
        for d in &nodes {
            for k in [&first, &k2, &k3] {
                until_status(d, k, 200, "each of three keys on each node").await;
            }
            let (s, b) = call(d, ADMIN, "GET", "/v1/tenants/ta/keys", None).await;
            assert_eq!((s, b["items"].as_array().map(Vec::len)), (200, Some(3)), "{b}");
        }

        // A key revoked through b is refused by a.
        let prefix = first.rsplit_once('_').expect("prefix").0.to_string();
        let (s, b) = call(&nodes[1], ADMIN, "DELETE", &format!("/v1/tenants/ta/keys/{prefix}"), None).await;
        assert_eq!(s, 204, "{b}");
        assert_eq!(list_status(&nodes[1], &first).await, 401, "refused at once by the node that revoked it");
        until_status(&nodes[0], &first, 401, "a key revoked through b, used through a").await;
        assert_eq!(list_status(&nodes[0], &k2).await, 200, "the tenant's other keys stay");

        // A restarted node reads the tenants before it serves.
        nodes[1].kill9();
        nodes[1].spawn();
        assert_eq!(list_status(&nodes[1], &k3).await, 200, "b's first answer after its restart");
        assert_eq!(list_status(&nodes[1], &first).await, 401);

        // A tenant removed through a: its keys are refused through b.
        let (s, b) = call(&nodes[0], ADMIN, "DELETE", "/v1/tenants/ta", None).await;
        assert_eq!(s, 204, "{b}");
        until_status(&nodes[1], &k2, 401, "a removed tenant's key through the other node").await;
        let (s, _) = call(&nodes[1], ADMIN, "GET", "/v1/tenants/ta", None).await;
        assert_eq!(s, 404);
    });
}
