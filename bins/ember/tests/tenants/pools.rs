//! A warm pool is its tenant's: another tenant's create never claims its
//! member, named or not; the admin claims from it only by naming it.
use super::{call, create_sandbox, tenant, ADMIN};
use crate::common::Daemon;
use serde_json::{json, Value};
use std::time::Duration;

/// Waits until pool `name` has `n` idle members; the count seen last.
async fn wait_idle(d: &Daemon, name: &str, n: u64) -> u64 {
    let mut idle = 0;
    for _ in 0..400 {
        idle = call(d, ADMIN, "GET", &format!("/v1/pools/{name}"), None).await.1["idle"].as_u64().unwrap_or(0);
        if idle == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    idle
}

fn launch_kind(b: &Value) -> &str {
    b["launch"]["kind"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_create_never_claims_a_tenants_pool_member() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let a = tenant(&d, "pa", json!({})).await;
    let b = tenant(&d, "pb", json!({})).await;
    let pool = json!({"name": "apool", "template": "host", "min": 1, "max": 1, "target": 1});
    let (s, body) = call(&d, &a, "POST", "/v1/pools", Some(pool)).await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(wait_idle(&d, "apool", 1).await, 1);
    // B asks for the same template and resources, without naming a pool:
    // a cold start, A's member stays idle.
    let (s, got) = create_sandbox(&d, &b, json!({})).await;
    assert_eq!((s, launch_kind(&got)), (202, "cold"), "{got}");
    // Naming A's pool is a 404, as A's pool's own route is.
    let (s, got) = create_sandbox(&d, &b, json!({"extensions": {"poolRef": "apool"}})).await;
    assert_eq!((s, got["code"].as_str()), (404, Some("POOL::NOT_FOUND")), "{got}");
    // The admin's create without a pool named leaves a tenant's pool alone.
    let (s, got) = create_sandbox(&d, ADMIN, json!({})).await;
    assert_eq!((s, launch_kind(&got)), (202, "cold"), "{got}");
    assert_eq!(wait_idle(&d, "apool", 1).await, 1, "A's member was claimed");
    let (_, p) = call(&d, ADMIN, "GET", "/v1/pools/apool", None).await;
    assert_eq!(p["claimsTotal"], 0, "{p}");
    // A claims its own member.
    let (s, got) = create_sandbox(&d, &a, json!({})).await;
    assert_eq!((s, launch_kind(&got)), (202, "warm"), "{got}");
    // The admin may, by naming the pool.
    assert_eq!(wait_idle(&d, "apool", 1).await, 1);
    let (s, got) = create_sandbox(&d, ADMIN, json!({"extensions": {"poolRef": "apool"}})).await;
    assert_eq!((s, launch_kind(&got)), (202, "warm"), "{got}");
    // A task of B (its sandbox made by the task worker) does not claim it either.
    assert_eq!(wait_idle(&d, "apool", 1).await, 1);
    let (s, t) = call(&d, &b, "POST", "/v1/tasks", Some(json!({"command": ["true"], "template": "host"}))).await;
    assert_eq!(s, 201, "{t}");
    let id = t["id"].as_str().expect("task id").to_string();
    for _ in 0..400 {
        let (_, t) = call(&d, &b, "GET", &format!("/v1/tasks/{id}"), None).await;
        if t["state"] == "Succeeded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (_, t) = call(&d, &b, "GET", &format!("/v1/tasks/{id}"), None).await;
    assert_eq!(t["state"], "Succeeded", "{t}");
    let (_, p) = call(&d, ADMIN, "GET", "/v1/pools/apool", None).await;
    assert_eq!((p["claimsTotal"].as_u64(), p["idle"].as_u64()), (Some(2), Some(1)), "{p}");
}
