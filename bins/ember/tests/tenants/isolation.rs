//! Tenant B against tenant A's objects on every operation of the OpenAPI
//! document: 404 (or 403), never an answer from the object; A reaches its
//! own, the admin sees all, and B's lists hold none of A's.
use super::{call, create_sandbox, load_doc, tenant, ADMIN};
use crate::common::Daemon;
use serde_json::json;
use std::collections::BTreeMap;

/// The collections whose `/{x}` names one object, and the object of A's each names.
fn owner_path(path: &str, objs: &BTreeMap<&'static str, String>) -> Option<String> {
    let rest = path.strip_prefix("/v1/")?;
    let (coll, tail) = rest.split_once('/')?;
    if !tail.starts_with('{') || objs.get(coll).is_none() {
        return None;
    }
    let mut out = format!("/v1/{coll}/{}", objs[coll]);
    let after = &tail[tail.find('}')? + 1..];
    // Other placeholders: the agent's port, a path, anything else.
    let mut rest = after.to_string();
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}')? + open;
        let fill = match &rest[open + 1..close] {
            "port" => "44772",
            "path" => "ping",
            _ => "x",
        };
        rest = format!("{}{fill}{}", &rest[..open], &rest[close + 1..]);
    }
    out.push_str(&rest);
    Some(out)
}

/// Routes only the admin key may call (a tenant key gets 403).
fn admin_only(method: &str, path: &str) -> bool {
    let p = path.strip_prefix("/v1").unwrap_or(path);
    ["/tenants", "/audit", "/network", "/cluster", "/snapshot-store", "/workspace-snapshots/operations"]
        .iter()
        .any(|a| p.starts_with(a))
        || path == "/metrics"
        || ((p.starts_with("/images") || p.starts_with("/templates")) && method != "get")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_b_gets_nothing_of_tenant_a_on_any_documented_operation() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let a = tenant(&d, "ta", json!({})).await;
    let b = tenant(&d, "tb", json!({})).await;
    let mut objs: BTreeMap<&'static str, String> = BTreeMap::new();
    let (s, sb) = create_sandbox(&d, &a, json!({})).await;
    assert_eq!(s, 202, "{sb}");
    let sandbox = sb["id"].as_str().expect("id").to_string();
    objs.insert("sandboxes", sandbox.clone());
    let pool = json!({"name": "pa", "template": "host", "min": 0, "max": 1, "target": 0});
    assert_eq!(call(&d, &a, "POST", "/v1/pools", Some(pool)).await.0, 201);
    objs.insert("pools", "pa".into());
    let ws = json!({"name": "wa", "size": "32Mi"});
    assert_eq!(call(&d, &a, "POST", "/v1/workspaces", Some(ws)).await.0, 201);
    objs.insert("workspaces", "wa".into());
    let (s, t) = call(&d, &a, "POST", "/v1/tasks", Some(json!({"command": ["true"], "tenant": "tb"}))).await;
    assert_eq!(s, 201, "{t}");
    assert_eq!(t["spec"]["tenant"], "ta", "the body's tenant won over the key's: {t}");
    objs.insert("tasks", t["id"].as_str().expect("task id").into());
    let (s, snap) = call(&d, &a, "POST", &format!("/v1/sandboxes/{sandbox}/snapshots"), Some(json!({}))).await;
    assert!((200..300).contains(&s), "{s} {snap}");
    objs.insert("snapshots", snap["id"].as_str().expect("snapshot id").into());
    let (s, wsnap) = call(&d, &a, "POST", "/v1/workspaces/wa/snapshots", None).await;
    assert_eq!(s, 201, "{wsnap}");
    objs.insert("workspace-snapshots", wsnap["id"].as_str().expect("ws snapshot id").into());

    let doc = load_doc();
    let (mut objects, mut admin) = (0, 0);
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, _) in item.as_object().expect("path item") {
            if !["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            let m = method.to_ascii_uppercase();
            let body = (m != "GET" && m != "DELETE").then(|| json!({}));
            if let Some(target) = owner_path(path, &objs) {
                let (s, ans) = call(&d, &b, &m, &target, body.clone()).await;
                assert!(s == 404 || s == 403, "tenant B: {m} {target} -> {s} {ans}");
                assert!(ans["code"].is_string(), "{m} {target}: not a {{code, message}} error: {ans}");
                // The bare OpenSandbox alias is guarded the same.
                if let Some(bare) = target.strip_prefix("/v1").filter(|t| t.starts_with("/sandboxes")) {
                    let (s, _) = call(&d, &b, &m, bare, body).await;
                    assert!(s == 404 || s == 403, "tenant B: {m} {bare} -> {s}");
                }
                objects += 1;
            } else if admin_only(method, path) && !path.contains('{') {
                let (s, ans) = call(&d, &b, &m, path, body).await;
                assert_eq!(s, 403, "tenant B: {m} {path} -> {ans}");
                admin += 1;
            }
        }
    }
    assert!(objects > 60 && admin > 8, "the table covered too little: {objects} object, {admin} admin operations");

    // Nothing of B's calls touched A's objects; A reaches each, the admin too.
    for (coll, id) in &objs {
        let path = format!("/v1/{coll}/{id}");
        assert_eq!(call(&d, &a, "GET", &path, None).await.0, 200, "tenant A: GET {path}");
        assert_eq!(call(&d, ADMIN, "GET", &path, None).await.0, 200, "admin: GET {path}");
        let list = if *coll == "snapshots" { "/v1/snapshots".to_string() } else { format!("/v1/{coll}") };
        let (_, mine) = call(&d, &a, "GET", &list, None).await;
        let (_, theirs) = call(&d, &b, "GET", &list, None).await;
        let (_, all) = call(&d, ADMIN, "GET", &list, None).await;
        assert!(mine.to_string().contains(id.as_str()), "A's list of {coll} lacks {id}: {mine}");
        assert!(all.to_string().contains(id.as_str()), "the admin's list of {coll} lacks {id}");
        assert!(!theirs.to_string().contains(id.as_str()), "B's list of {coll} shows A's {id}: {theirs}");
    }
    // Nor through a create's body: A's workspace, snapshot and pool named
    // by B are as unknown as on their own routes.
    for (extra, what) in [
        (json!({"workspaces": [{"name": "wa"}]}), "A's workspace mounted"),
        (
            json!({"volumes": [{"name": "v", "mountPath": "/mnt/v", "pvc": {"claimName": "wa"}}]}),
            "A's workspace as a pvc",
        ),
        (json!({"extensions": {"poolRef": "pa"}}), "A's pool claimed"),
    ] {
        let (s, ans) = create_sandbox(&d, &b, extra).await;
        assert_eq!(s, 404, "tenant B, {what}: {ans}");
    }
    let restore = json!({"snapshotId": objs["snapshots"]});
    let (s, ans) = call(&d, &b, "POST", "/v1/sandboxes", Some(restore)).await;
    assert_eq!(s, 404, "tenant B restored A's snapshot: {ans}");
    let (s, ans) = call(&d, &b, "POST", "/v1/tasks", Some(json!({"command": ["true"], "workspace": "wa"}))).await;
    assert_eq!(s, 404, "tenant B, a task on A's workspace: {ans}");
    // A workspace a create makes (a new pvc claim) is the creator's.
    let vol = json!([{"name": "v", "mountPath": "/mnt/v", "pvc": {"claimName": "wb", "storage": "32Mi"}}]);
    let (s, ans) = create_sandbox(&d, &b, json!({"volumes": vol})).await;
    assert_eq!(s, 202, "{ans}");
    assert_eq!(call(&d, &b, "GET", "/v1/workspaces/wb", None).await.0, 200);
    assert_eq!(call(&d, &a, "GET", "/v1/workspaces/wb", None).await.0, 404);
    let (_, state) = call(&d, &a, "GET", &format!("/v1/sandboxes/{sandbox}"), None).await;
    assert_eq!(state["status"]["state"], "Running", "B's calls changed A's sandbox: {state}");
}

/// A host volume is the admin's: the directories `--allow-host-path` opens
/// are the same for every tenant, so a tenant key's create with one is a 403
/// (before, any tenant could mount another's data kept there); the admin's
/// create with the same volume runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_key_cannot_mount_a_host_volume() {
    let shared = tempfile::tempdir().expect("a host dir");
    let allowed = shared.path().to_str().expect("a UTF-8 temp path").to_string();
    let d = Daemon::start_with(&["--api-key", ADMIN, "--allow-host-path", allowed.as_str()]);
    let key = tenant(&d, "hv", json!({})).await;
    let volume = json!({"volumes": [{"name": "data", "host": {"path": allowed}, "mountPath": "/mnt/data"}]});
    let (s, b) = create_sandbox(&d, &key, volume.clone()).await;
    assert_eq!((s, b["code"].as_str()), (403, Some("TENANT::FORBIDDEN")), "{b}");
    assert!(b["message"].as_str().unwrap_or("").contains("\"data\""), "{b}");
    let (s, b) = call(&d, &key, "GET", "/v1/sandboxes", None).await;
    assert_eq!((s, b["items"].as_array().map(Vec::len)), (200, Some(0)), "nothing made: {b}");
    let (s, b) = create_sandbox(&d, ADMIN, volume).await;
    assert_eq!(s, 202, "the admin mounts an allowed host dir: {b}");
    let id = b["id"].as_str().expect("id");
    assert_eq!(call(&d, ADMIN, "DELETE", &format!("/v1/sandboxes/{id}"), None).await.0, 204);
}
