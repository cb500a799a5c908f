//! `PATCH /v1/tenants/{name}`: a tenant's quotas changed after its create,
//! applied at the next create, audited; the tenant's own key may not.
use super::{call, conforms, create_sandbox, tenant, Daemon, ADMIN};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_quotas_change_by_merge_patch_at_the_next_create() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let key = tenant(&d, "grow", json!({"runningSandboxes": 1, "memoryBytes": 8u64 << 30, "tasks": 5})).await;
    let (s, b) = create_sandbox(&d, &key, json!({})).await;
    assert_eq!(s, 202, "{b}");
    let (s, b) = create_sandbox(&d, &key, json!({})).await;
    assert_eq!((s, b["code"].as_str()), (429, Some("QUOTA::EXCEEDED")), "{b}");

    // One more sandbox, memory unlimited, tasks left as they were.
    let patch = json!({"quotas": {"runningSandboxes": 2, "memoryBytes": null}});
    let (s, t) = call(&d, ADMIN, "PATCH", "/v1/tenants/grow", Some(patch)).await;
    assert_eq!(s, 200, "{t}");
    conforms("TenantInfo", &t);
    assert_eq!(t["quotas"], json!({"runningSandboxes": 2, "tasks": 5}), "{t}");
    assert_eq!(t["usage"]["runningSandboxes"], 1, "{t}");
    let (s, b) = create_sandbox(&d, &key, json!({})).await;
    assert_eq!(s, 202, "raised: {b}");
    let (s, b) = create_sandbox(&d, &key, json!({})).await;
    assert_eq!(s, 429, "the new limit holds: {b}");
    let (s, t) = call(&d, ADMIN, "GET", "/v1/tenants/grow", None).await;
    assert_eq!((s, &t["quotas"]["runningSandboxes"]), (200, &json!(2)), "{t}");

    // Bad patches change nothing.
    let bad = [
        (&ADMIN, "/v1/tenants/grow", json!({"quotas": {"sandboxes": 9}}), 400),
        (&ADMIN, "/v1/tenants/grow", json!({"quotas": {"runningSandboxes": -1}}), 400),
        (&ADMIN, "/v1/tenants/nobody", json!({"quotas": {"tasks": 1}}), 404),
        (&key.as_str(), "/v1/tenants/grow", json!({"quotas": {"runningSandboxes": null}}), 403),
    ];
    for (cred, path, body, want) in bad {
        let (s, b) = call(&d, cred, "PATCH", path, Some(body.clone())).await;
        assert_eq!(s, want, "{body}: {b}");
        assert!(b["code"].is_string() && b["message"].is_string(), "a structured error: {b}");
    }
    let (_, t) = call(&d, ADMIN, "GET", "/v1/tenants/grow", None).await;
    assert_eq!(t["quotas"], json!({"runningSandboxes": 2, "tasks": 5}), "unchanged by the refused patches: {t}");

    // Unlimited: a third sandbox passes.
    let (s, _) =
        call(&d, ADMIN, "PATCH", "/v1/tenants/grow", Some(json!({"quotas": {"runningSandboxes": null}}))).await;
    assert_eq!(s, 200);
    let (s, b) = create_sandbox(&d, &key, json!({})).await;
    assert_eq!(s, 202, "no limit: {b}");

    let (s, a) = call(&d, ADMIN, "GET", "/v1/audit", None).await;
    assert_eq!(s, 200, "{a}");
    let statuses: Vec<u64> = a["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|r| r["action"] == "tenants.patch")
        .filter_map(|r| r["status"].as_u64())
        .collect();
    let seen = |code: u64| statuses.iter().filter(|s| **s == code).count();
    assert_eq!((seen(200), seen(400), seen(404), seen(403)), (2, 2, 1, 1), "every quota change is audited: {a}");
}
