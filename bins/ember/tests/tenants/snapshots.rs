//! The snapshot-bytes quota: a snapshot reserves what it can reach at most
//! (its sandbox's disk limit, its workspace's size) under the quota lock,
//! then counts its own bytes; over the quota is a 429 naming it.
use super::{call, create_sandbox, tenant, ADMIN};
use crate::common::Daemon;
use serde_json::{json, Value};
use std::time::Duration;

/// A sandbox snapshot of `id` as `key`, waited for until it is Ready when made.
async fn snapshot(d: &Daemon, key: &str, id: &str) -> (u16, Value) {
    let (s, b) = call(d, key, "POST", &format!("/v1/sandboxes/{id}/snapshots"), None).await;
    if s != 202 {
        return (s, b);
    }
    let sid = b["id"].as_str().expect("snapshot id").to_string();
    for _ in 0..400 {
        let (_, b) = call(d, key, "GET", &format!("/v1/snapshots/{sid}"), None).await;
        if b["status"]["state"] != "Creating" {
            return (s, b);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("snapshot {sid} still Creating")
}

async fn used(d: &Daemon) -> u64 {
    call(d, ADMIN, "GET", "/v1/tenants/sq", None).await.1["usage"]["snapshotBytes"].as_u64().expect("snapshotBytes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_bytes_are_a_quota() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    // One disk limit (1 GiB, the default) and 4 MiB over it.
    let limit: u64 = (1 << 30) + (4 << 20);
    let key = tenant(&d, "sq", json!({"snapshotBytes": limit})).await;
    let (s, b) = create_sandbox(&d, &key, json!({})).await;
    assert_eq!(s, 202, "{b}");
    let id = b["id"].as_str().expect("id").to_string();
    let write = json!({"command": "head -c 3145728 /dev/zero > /tmp/three-mib"});
    let (s, _) = call(&d, &key, "POST", &format!("/v1/sandboxes/{id}/proxy/44772/command"), Some(write)).await;
    assert_eq!(s, 200);
    let (s, first) = snapshot(&d, &key, &id).await;
    assert_eq!((s, first["status"]["state"].as_str()), (202, Some("Ready")), "{first}");
    let one = used(&d).await;
    assert!((3 << 20..4 << 20).contains(&one), "a 3 MiB layer counted {one}");
    // 3 MiB used and 1 GiB reserved fit; 6 MiB and 1 GiB do not.
    assert_eq!(snapshot(&d, &key, &id).await.0, 202);
    let (s, b) = snapshot(&d, &key, &id).await;
    let m = b["message"].as_str().unwrap_or("");
    assert_eq!((s, b["code"].as_str()), (429, Some("QUOTA::EXCEEDED")), "{b}");
    assert!(m.contains("snapshotBytes") && m.contains(&format!("limit {limit}")), "{m}");
    // A workspace snapshot reserves its workspace's size and counts its files.
    let ws = json!({"name": "sw", "size": "64Mi"});
    assert_eq!(call(&d, &key, "POST", "/v1/workspaces", Some(ws)).await.0, 201);
    let (s, b) = call(&d, &key, "POST", "/v1/workspaces/sw/snapshots", None).await;
    assert_eq!(s, 201, "{b}");
    let big = json!({"name": "big", "size": "1Gi"});
    assert_eq!(call(&d, &key, "POST", "/v1/workspaces", Some(big)).await.0, 201);
    let (s, b) = call(&d, &key, "POST", "/v1/workspaces/big/snapshots", None).await;
    assert!(s == 429 && b["message"].as_str().unwrap_or("").contains("snapshotBytes"), "{s} {b}");
    // A snapshot removed gives its bytes back.
    let sid = first["id"].as_str().expect("snapshot id");
    assert_eq!(call(&d, &key, "DELETE", &format!("/v1/snapshots/{sid}"), None).await.0, 204);
    assert!(used(&d).await < 4 << 20);
    assert_eq!(snapshot(&d, &key, &id).await.0, 202);
    let (_, t) = call(&d, ADMIN, "GET", "/v1/tenants/sq", None).await;
    super::conforms("TenantInfo", &t);
    let addr = d.url.trim_start_matches("http://");
    let h = [format!("Host: {addr}"), format!("OPEN-SANDBOX-API-KEY: {ADMIN}")];
    let (_, _, text) = crate::common::raw::exchange(addr, "GET /metrics", &h, "", super::HANG).await;
    assert!(text.contains("ember_tenant_snapshot_bytes{tenant=\"sq\"}"), "{text}");
}

/// A golden pool starts its members from the snapshot it names: another
/// tenant's snapshot is a 404 there, as on the snapshot's own route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_golden_pool_of_another_tenants_snapshot_is_a_404() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let a = tenant(&d, "ga", json!({})).await;
    let b = tenant(&d, "gb", json!({})).await;
    let (s, sb) = create_sandbox(&d, &a, json!({})).await;
    assert_eq!(s, 202, "{sb}");
    let (s, snap) = snapshot(&d, &a, sb["id"].as_str().expect("id")).await;
    assert_eq!((s, snap["status"]["state"].as_str()), (202, Some("Ready")), "{snap}");
    let sid = snap["id"].as_str().expect("snapshot id");
    assert_eq!(call(&d, &b, "GET", &format!("/v1/snapshots/{sid}"), None).await.0, 404);
    let pool = |name: &str| json!({"name": name, "fromSnapshot": sid, "min": 0, "max": 1});
    let (s, got) = call(&d, &b, "POST", "/v1/pools", Some(pool("taken"))).await;
    assert_eq!((s, got["code"].as_str()), (404, Some("SNAPSHOT::NOT_FOUND")), "{got}");
    assert_eq!(call(&d, ADMIN, "GET", "/v1/pools/taken", None).await.0, 404, "the pool was made");
    // Its owner's golden pool, and the admin's, are made.
    let (s, got) = call(&d, &a, "POST", "/v1/pools", Some(pool("mine"))).await;
    assert_eq!(s, 201, "{got}");
    assert_eq!(call(&d, ADMIN, "POST", "/v1/pools", Some(pool("admins"))).await.0, 201);
}

/// A workspace restored or forked from a snapshot is charged to
/// `workspaceBytes` like a created one, at the size the restore gives it
/// (the snapshotted workspace's unless asked): before, a tenant could pass
/// its quota by restoring or forking its snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restores_and_forks_count_against_workspace_bytes() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let key = tenant(&d, "rq", json!({"workspaceBytes": 160u64 << 20})).await;
    let ws = json!({"name": "orig", "size": "64Mi"});
    assert_eq!(call(&d, &key, "POST", "/v1/workspaces", Some(ws)).await.0, 201);
    let (s, snap) = call(&d, &key, "POST", "/v1/workspaces/orig/snapshots", None).await;
    assert_eq!(s, 201, "{snap}");
    let sid = snap["id"].as_str().expect("snapshot id").to_string();
    let restore = |name: &str| json!({"name": name});
    let path = |what: &str| format!("/v1/workspace-snapshots/{sid}/{what}");
    let over = |(s, b): &(u16, Value)| {
        *s == 429 && b["code"] == "QUOTA::EXCEEDED" && b["message"].as_str().unwrap_or("").contains("workspaceBytes")
    };
    // 64 + 64 fit in 160; a third 64 does not, restored or forked.
    let (s, b) = call(&d, &key, "POST", &path("restore"), Some(restore("r1"))).await;
    assert_eq!(s, 201, "{b}");
    let got = call(&d, &key, "POST", &path("restore"), Some(restore("r2"))).await;
    assert!(over(&got), "a restore past the quota: {got:?}");
    let got = call(&d, &key, "POST", &path("fork"), Some(json!({"count": 1, "prefix": "f"}))).await;
    assert!(over(&got), "a fork past the quota: {got:?}");
    // A smaller size asked fits (64 + 64 + 16 <= 160), and is what is charged.
    let small = json!({"name": "r3", "size": "16Mi"});
    let (s, b) = call(&d, &key, "POST", &path("restore"), Some(small)).await;
    assert_eq!(s, 201, "{b}");
    let (_, t) = call(&d, ADMIN, "GET", "/v1/tenants/rq", None).await;
    assert_eq!(t["usage"]["workspaceBytes"].as_u64(), Some(144 << 20), "{t}");
    // Freed by two removals: a fork of three is charged for three (16 + 3 x 64
    // > 160), a fork of two fits.
    assert_eq!(call(&d, &key, "DELETE", "/v1/workspaces/r1", None).await.0, 204);
    assert_eq!(call(&d, &key, "DELETE", "/v1/workspaces/orig", None).await.0, 204);
    let got = call(&d, &key, "POST", &path("fork"), Some(json!({"count": 3, "prefix": "f"}))).await;
    assert!(over(&got), "a fork of three: {got:?}");
    let (s, b) = call(&d, &key, "POST", &path("fork"), Some(json!({"count": 2, "prefix": "f"}))).await;
    assert_eq!(s, 201, "16 + 2 x 64 fit: {b}");
}
