//! The sandbox origins (`--sandbox-domain`) and agent-sandbox's router take
//! a tenant's key and a scoped token by the proxy route's rule: a tenant
//! reaches its own sandboxes (another's is a 404), a token its sandbox within
//! its scope; the calls are audited. The 401 of a wrong key is audited, and
//! leaves a keep-alive connection usable.
use super::{call, create_sandbox, on_conn, tenant, ADMIN, HANG};
use crate::common::{raw, Daemon};
use ember_types::agent_sandbox::{NAMESPACE_KEY, SANDBOX_KEY};
use serde_json::json;

const DOMAIN: &str = "sb.test";

/// A request under the sandbox origin `44772-<id>.sb.test` with `cred` as
/// the key header; the status.
async fn origin(d: &Daemon, id: &str, req: &str, cred: Option<&str>, body: &str) -> u16 {
    let addr = d.url.trim_start_matches("http://");
    let mut h = vec![format!("Host: 44772-{id}.{DOMAIN}"), "Content-Type: application/json".to_string()];
    h.extend(cred.map(|k| format!("OPEN-SANDBOX-API-KEY: {k}")));
    raw::exchange(addr, req, &h, body, HANG).await.0
}

/// `POST /execute` through the router to Sandbox `team/<name>`; status and body.
async fn router(d: &Daemon, name: &str, cred: &str) -> (u16, String) {
    let addr = d.url.trim_start_matches("http://");
    let h = [
        format!("Host: {addr}"),
        format!("X-Sandbox-ID: {name}"),
        "X-Sandbox-Namespace: team".into(),
        format!("OPEN-SANDBOX-API-KEY: {cred}"),
        "Content-Type: application/json".into(),
    ];
    let (s, _, body) =
        raw::exchange(addr, "POST /execute", &h, &json!({"command": "echo routed"}).to_string(), HANG).await;
    (s, body)
}

async fn token(d: &Daemon, key: &str, id: &str, scope: &str) -> String {
    let (s, t) = call(d, key, "POST", &format!("/v1/sandboxes/{id}/tokens"), Some(json!({"scope": scope}))).await;
    assert_eq!(s, 201, "{t}");
    t["token"].as_str().expect("token").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origins_and_the_router_take_tenant_keys_and_tokens_by_the_proxy_rule() {
    let d = Daemon::start_with(&["--api-key", ADMIN, "--sandbox-domain", DOMAIN]);
    let a = tenant(&d, "oa", json!({})).await;
    let b = tenant(&d, "ob", json!({})).await;
    let meta = json!({"metadata": {NAMESPACE_KEY: "team", SANDBOX_KEY: "sb-a"}});
    let (s, sb) = create_sandbox(&d, &a, meta).await;
    assert_eq!(s, 202, "{sb}");
    let id = sb["id"].as_str().expect("id").to_string();
    let other = create_sandbox(&d, &a, json!({})).await.1["id"].as_str().expect("id").to_string();

    // The sandbox origin.
    assert_eq!(origin(&d, &id, "GET /ping", Some(&a), "").await, 200, "the owner's key");
    assert_eq!(origin(&d, &id, "GET /ping", Some(ADMIN), "").await, 200, "the admin's key");
    assert_eq!(origin(&d, &id, "GET /ping", Some(&b), "").await, 404, "another tenant's key");
    assert_eq!(origin(&d, &id, "GET /ping", None, "").await, 401);
    let exec = token(&d, &a, &id, "exec").await;
    let files = token(&d, &a, &id, "files").await;
    let cmd = json!({"command": "true"}).to_string();
    assert_eq!(origin(&d, &id, "POST /command", Some(&exec), &cmd).await, 200, "an exec token's exec");
    assert_eq!(origin(&d, &id, "POST /command", Some(&files), &cmd).await, 403, "a files token's exec");
    assert_eq!(origin(&d, &other, "GET /ping", Some(&exec), "").await, 404, "a token of another sandbox");

    // agent-sandbox's router.
    let (s, out) = router(&d, "sb-a", &a).await;
    assert!(s == 200 && out.contains("routed"), "{s} {out}");
    assert_eq!(router(&d, "sb-a", ADMIN).await.0, 200);
    let (s, out) = router(&d, "sb-a", &b).await;
    assert!(s == 404 && out.contains("SANDBOX::NOT_FOUND"), "{s} {out}");
    assert_eq!(router(&d, "sb-a", &exec).await.0, 200);
    assert_eq!(router(&d, "sb-a", &files).await.0, 403);
    assert_eq!(router(&d, "sb-a", "emb_00000000_wrong").await.0, 401);

    // Both are audited as the proxy route is, the router's exec with its argv.
    let (_, log) = call(&d, ADMIN, "GET", "/v1/audit?tenant=oa", None).await;
    let recs = log["items"].as_array().cloned().unwrap_or_default();
    let execs: Vec<_> = recs.iter().filter(|r| r["action"] == "exec").collect();
    assert!(execs.iter().any(|r| r["argv"] == "echo routed" && r["status"] == 200), "{recs:#?}");
    assert!(execs.iter().any(|r| r["path"] == format!("/v1/sandboxes/{id}/proxy/44772/command")), "{recs:#?}");
}

/// A 401 reads the body first (the connection stays usable) and is in the
/// audit log with the presented key's public prefix only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_leaves_the_connection_usable_and_is_audited() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let addr = d.url.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let body = json!({"template": "host"}).to_string();
    let wrong = "emb_0badc0de_0123456789abcdef0123456789abcdef0123456789abcdef";
    assert_eq!(on_conn(&mut s, &addr, wrong, "POST /v1/sandboxes", &body).await, Some(401));
    assert_eq!(on_conn(&mut s, &addr, "not-the-admin-key", "POST /v1/pools", &body).await, Some(401));
    assert_eq!(on_conn(&mut s, &addr, ADMIN, "GET /v1/sandboxes", "").await, Some(200), "the connection was closed");
    let (_, log) = call(&d, ADMIN, "GET", "/v1/audit?tenant=unknown", None).await;
    let recs = log["items"].as_array().cloned().unwrap_or_default();
    let got: Vec<_> = recs.iter().map(|r| (r["key"].as_str(), r["status"].as_u64(), r["outcome"].as_str())).collect();
    assert_eq!(got, [(Some("emb_0badc0de"), Some(401), Some("denied")), (Some("invalid"), Some(401), Some("denied"))]);
    let file = std::fs::read_to_string(d.data_dir.join("audit/audit.jsonl")).expect("audit file");
    assert!(!file.contains("not-the-admin-key") && !file.contains("0123456789abcdef"), "a key reached the log");
}
