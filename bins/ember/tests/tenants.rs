//! Multi-tenancy against a real daemon (docs/tenancy.md): tenant keys,
//! isolation over every documented route, quotas under concurrent creates,
//! the audit log. Real sandboxes, real processes.
mod common;
#[path = "tenants/isolation.rs"]
mod isolation;
#[path = "tenants/outside.rs"]
mod outside;
#[path = "tenants/pools.rs"]
mod pools;
#[path = "common/schema.rs"]
mod schema;
#[path = "tenants/snapshots.rs"]
mod snapshots;
#[path = "tenants/tokens.rs"]
mod tokens;
#[path = "tenants/ui.rs"]
mod ui;
#[path = "tenants/update.rs"]
mod update;

use common::Daemon;
use serde_json::{json, Value};
use std::time::Duration;

const ADMIN: &str = "admin-secret";
/// Guards against a daemon that never answers; no threshold.
const HANG: Duration = Duration::from_secs(120);

fn load_doc() -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/api/openapi.yaml");
    serde_yaml::from_str(&std::fs::read_to_string(p).expect("openapi.yaml")).expect("YAML")
}

/// `v` is what docs/api/openapi.yaml's schema `name` says, every key declared.
fn conforms(name: &str, v: &Value) {
    let doc = load_doc();
    let schema = json!({"$ref": format!("#/components/schemas/{name}")});
    if let Err(e) = schema::Validator::strict(&doc).validate(&schema, v) {
        panic!("{name}: {e:?}\n{v:#}");
    }
}

/// One call with `key`; (status, JSON body or `Null`).
async fn call(d: &Daemon, key: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    common::raw::json_call(&d.url, key, (method, path), body, HANG).await
}

/// A tenant with `quotas` and one key of it.
async fn tenant(d: &Daemon, name: &str, quotas: Value) -> String {
    let (s, b) = call(d, ADMIN, "POST", "/v1/tenants", Some(json!({"name": name, "quotas": quotas}))).await;
    assert_eq!(s, 201, "{b}");
    let (s, b) = call(d, ADMIN, "POST", &format!("/v1/tenants/{name}/keys"), None).await;
    assert_eq!(s, 201, "{b}");
    conforms("CreatedKey", &b);
    b["key"].as_str().expect("key").to_string()
}

async fn create_sandbox(d: &Daemon, key: &str, extra: Value) -> (u16, Value) {
    let mut body = json!({"template": "host"});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    call(d, key, "POST", "/v1/sandboxes", Some(body)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_hashed_shown_once_revocable_and_survive_a_restart() {
    let mut d = Daemon::start_with(&["--api-key", ADMIN]);
    // Single-key mode: the admin's calls write no tenant state.
    assert_eq!(create_sandbox(&d, ADMIN, json!({})).await.0, 202);
    assert!(!d.data_dir.join("tenants/tenants.json").exists(), "a daemon without tenants wrote tenant state");
    let key = tenant(&d, "acme", json!({})).await;
    assert_eq!(call(&d, &key, "GET", "/v1/sandboxes", None).await.0, 200);
    // The admin's routes are not a tenant's.
    assert_eq!(call(&d, &key, "GET", "/v1/tenants", None).await.0, 403);
    let (_, t) = call(&d, ADMIN, "GET", "/v1/tenants/acme", None).await;
    conforms("TenantInfo", &t);
    conforms("TenantList", &call(&d, ADMIN, "GET", "/v1/tenants", None).await.1);
    conforms("KeyList", &call(&d, ADMIN, "GET", "/v1/tenants/acme/keys", None).await.1);
    let prefix = t["keys"][0]["prefix"].as_str().expect("prefix").to_string();
    assert!(key.starts_with(&prefix) && key.len() > prefix.len() + 16, "{key} / {prefix}");
    let stored = std::fs::read_to_string(d.data_dir.join("tenants/tenants.json")).expect("tenant record");
    assert!(stored.contains(&prefix) && !stored.contains(&key), "the key itself is stored: {stored}");
    // Durable: a SIGKILLed daemon comes back with the tenant and its key.
    d.kill9();
    d.spawn();
    assert_eq!(call(&d, &key, "GET", "/v1/sandboxes", None).await.0, 200);
    assert_eq!(call(&d, ADMIN, "DELETE", &format!("/v1/tenants/acme/keys/{prefix}"), None).await.0, 204);
    let (s, b) = call(&d, &key, "GET", "/v1/sandboxes", None).await;
    assert_eq!((s, b["code"].as_str()), (401, Some("INVALID_API_KEY")));
    assert_eq!(call(&d, ADMIN, "DELETE", "/v1/tenants/acme", None).await.0, 204);
    assert_eq!(call(&d, ADMIN, "GET", "/v1/tenants/acme", None).await.0, 404);
}

/// k = 3 running sandboxes, 8 creates at once: exactly 3 pass, the others
/// are 429 `QUOTA::EXCEEDED` naming the quota, its limit and the use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_take_exactly_the_quota() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let key = tenant(&d, "q", json!({"runningSandboxes": 3})).await;
    let creates = (0..8).map(|_| create_sandbox(&d, &key, json!({})));
    let answers = futures_util::future::join_all(creates).await;
    let ok: Vec<_> = answers.iter().filter(|(s, _)| *s == 202).collect();
    let refused: Vec<_> = answers.iter().filter(|(s, _)| *s == 429).collect();
    assert_eq!((ok.len(), refused.len()), (3, 5), "{answers:?}");
    for (_, b) in &refused {
        conforms("ErrorBody", b);
        let m = b["message"].as_str().unwrap_or("");
        assert_eq!(b["code"], "QUOTA::EXCEEDED");
        assert!(m.contains("runningSandboxes") && m.contains("limit 3") && m.contains("in use 3"), "{m}");
    }
    let (_, t) = call(&d, ADMIN, "GET", "/v1/tenants/q", None).await;
    assert_eq!(t["usage"]["runningSandboxes"], 3, "{t}");
    let addr = d.url.trim_start_matches("http://");
    let h = [format!("Host: {addr}"), format!("OPEN-SANDBOX-API-KEY: {ADMIN}")];
    let (_, _, text) = common::raw::exchange(addr, "GET /metrics", &h, "", HANG).await;
    assert!(text.contains("ember_tenant_running_sandboxes{tenant=\"q\"} 3"), "{text}");
    // A removed sandbox gives its slot back.
    let id = ok[0].1["id"].as_str().expect("id");
    assert_eq!(call(&d, &key, "DELETE", &format!("/v1/sandboxes/{id}"), None).await.0, 204);
    assert_eq!(create_sandbox(&d, &key, json!({})).await.0, 202);
    assert_eq!(create_sandbox(&d, &key, json!({})).await.0, 429);
}

/// `createsPerSecond` is a token bucket: a burst of 8 at 1/s passes at most
/// one more than the seconds the burst took (counted, so a slow machine
/// cannot fail it), and the rest are 429s naming the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_per_second_bounds_a_burst() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let key = tenant(&d, "rate", json!({"createsPerSecond": 1})).await;
    let start = std::time::Instant::now();
    let answers = futures_util::future::join_all((0..8).map(|_| create_sandbox(&d, &key, json!({})))).await;
    let secs = start.elapsed().as_secs_f64().ceil() as usize;
    let ok = answers.iter().filter(|(s, _)| *s == 202).count();
    let refused: Vec<_> = answers.iter().filter(|(s, _)| *s == 429).collect();
    assert_eq!(ok + refused.len(), 8, "{answers:?}");
    assert!((1..=1 + secs).contains(&ok), "{ok} creates passed in {secs} s at 1/s: {answers:?}");
    for (_, b) in refused {
        assert!(b["message"].as_str().unwrap_or("").contains("createsPerSecond"), "{b}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_cpu_pool_workspace_and_task_quotas_refuse_what_goes_over() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let q =
        json!({"memoryBytes": 1u64 << 30, "cpuMillis": 1500, "poolSize": 2, "workspaceBytes": 64u64 << 20, "tasks": 1});
    let key = tenant(&d, "m", q).await;
    let small = json!({"resourceLimits": {"memory": "512Mi", "cpu": "500m"}});
    assert_eq!(create_sandbox(&d, &key, small).await.0, 202);
    let (s, b) = create_sandbox(&d, &key, json!({"resourceLimits": {"memory": "768Mi", "cpu": "500m"}})).await;
    assert_eq!(s, 429, "{b}");
    assert!(b["message"].as_str().unwrap_or("").contains("memoryBytes"), "{b}");
    let (s, b) = create_sandbox(&d, &key, json!({"resourceLimits": {"memory": "256Mi", "cpu": "1500m"}})).await;
    assert_eq!(s, 429, "{b}");
    assert!(b["message"].as_str().unwrap_or("").contains("cpuMillis"), "{b}");
    let pool = |max: u32| json!({"name": "mp", "template": "host", "min": 0, "max": max, "target": 0});
    let (s, b) = call(&d, &key, "POST", "/v1/pools", Some(pool(3))).await;
    assert_eq!((s, b["code"].as_str()), (429, Some("QUOTA::EXCEEDED")), "{b}");
    assert_eq!(call(&d, &key, "POST", "/v1/pools", Some(pool(2))).await.0, 201);
    let (s, b) = call(&d, &key, "PUT", "/v1/pools/mp", Some(json!({"max": 4}))).await;
    assert!(s == 429 && b["message"].as_str().unwrap_or("").contains("poolSize"), "{s} {b}");
    let ws = |name: &str, size: &str| json!({"name": name, "size": size});
    assert_eq!(call(&d, &key, "POST", "/v1/workspaces", Some(ws("w1", "48Mi"))).await.0, 201);
    let (s, b) = call(&d, &key, "POST", "/v1/workspaces", Some(ws("w2", "32Mi"))).await;
    assert!(s == 429 && b["message"].as_str().unwrap_or("").contains("workspaceBytes"), "{s} {b}");
    let task = json!({"command": ["sleep", "600"]});
    let (s, t) = call(&d, &key, "POST", "/v1/tasks", Some(task.clone())).await;
    assert_eq!(s, 201, "{t}");
    let (s, b) = call(&d, &key, "POST", "/v1/tasks", Some(task)).await;
    assert!(s == 429 && b["message"].as_str().unwrap_or("").contains("tasks"), "{s} {b}");
    let (_, t2) = call(&d, ADMIN, "GET", "/v1/tenants/m", None).await;
    assert_eq!((t2["usage"]["workspaceBytes"].as_u64(), t2["usage"]["tasks"].as_u64()), (Some(48 << 20), Some(1)));
    let tid = t["id"].as_str().expect("task id");
    assert_eq!(call(&d, &key, "POST", &format!("/v1/tasks/{tid}/cancel"), None).await.0, 200);
    // The admin (the default tenant) has no quota.
    assert_eq!(call(&d, ADMIN, "PUT", "/v1/pools/mp", Some(json!({"max": 4}))).await.0, 200);
    assert_eq!(call(&d, ADMIN, "DELETE", "/v1/pools/mp", None).await.0, 204);
}

/// A scripted session's calls all land in the audit log with tenant, key
/// prefix, source and request id; an env value given on create is nowhere
/// in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_has_every_call_and_no_secret() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let key = tenant(&d, "aud", json!({})).await;
    let prefix = key.rsplit_once('_').map(|(p, _)| p.to_string()).expect("prefix");
    let secret = "hunter2-the-env-value";
    let (s, b) = create_sandbox(&d, &key, json!({"env": {"TOKEN": secret}})).await;
    assert_eq!(s, 202, "{b}");
    let id = b["id"].as_str().expect("id").to_string();
    let exec = json!({"command": "echo audited-argv"});
    let (s, _) = call(&d, &key, "POST", &format!("/v1/sandboxes/{id}/proxy/44772/command"), Some(exec)).await;
    assert_eq!(s, 200);
    let tk = ember_client::Client::new(&d.url, Some(key.clone())).expect("client");
    tk.upload(&id, "/tmp/audited.txt", bytes::Bytes::from_static(b"x"), 0o644).await.expect("upload");
    assert_eq!(call(&d, &key, "POST", &format!("/v1/sandboxes/{id}/pause"), None).await.0, 202);
    assert_eq!(call(&d, &key, "POST", &format!("/v1/sandboxes/{id}/resume"), None).await.0, 202);
    assert_eq!(call(&d, &key, "DELETE", &format!("/v1/sandboxes/{id}"), None).await.0, 204);
    // Refused calls are recorded too.
    assert_eq!(call(&d, &key, "POST", "/v1/images/prune", None).await.0, 403);

    let (s, b) = call(&d, ADMIN, "GET", "/v1/audit?tenant=aud", None).await;
    assert_eq!(s, 200, "{b}");
    conforms("AuditList", &b);
    let recs = b["items"].as_array().cloned().unwrap_or_default();
    let actions: Vec<&str> = recs.iter().filter_map(|r| r["action"].as_str()).collect();
    let want =
        ["sandbox.create", "exec", "file.write", "sandbox.pause", "sandbox.resume", "sandbox.delete", "images.post"];
    assert_eq!(actions, want, "{recs:#?}");
    for r in &recs {
        assert_eq!((r["tenant"].as_str(), r["key"].as_str()), (Some("aud"), Some(prefix.as_str())), "{r}");
        assert!(r["source"].as_str().is_some_and(|s| s.starts_with("127.0.0.1:")), "{r}");
        assert!(!r["requestId"].as_str().unwrap_or("").is_empty(), "{r}");
    }
    assert_eq!(recs[1]["argv"], "echo audited-argv");
    assert_eq!((recs[0]["outcome"].as_str(), recs[6]["outcome"].as_str()), (Some("ok"), Some("denied")));
    let log = std::fs::read_to_string(d.data_dir.join("audit/audit.jsonl")).expect("audit file");
    assert!(!log.contains(secret), "the env value reached the audit log");
    assert!(log.contains("audited-argv"));
    // `ember audit` reads the same records.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["--url", &d.url, "--api-key", ADMIN, "audit", "--tenant", "aud", "--since", "1h"])
        .output()
        .expect("ember audit");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.lines().count() == want.len() && text.contains("exec"), "{text}");
}

/// `ember tenant ...` drives the same routes: create with quotas, a key
/// printed once, inspect with usage, key ls/revoke, rm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_commands_drive_the_api() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let ember = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["--url", &d.url, "--api-key", ADMIN])
            .args(args)
            .output()
            .expect("ember runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "ember {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
        text
    };
    assert_eq!(ember(&["tenant", "create", "cli", "--max-sandboxes", "2", "--max-memory", "1Gi"]).trim(), "cli");
    let key = ember(&["tenant", "key", "create", "cli"]).trim().to_string();
    assert_eq!(create_sandbox(&d, &key, json!({})).await.0, 202);
    let inspect = ember(&["tenant", "inspect", "cli"]);
    assert!(inspect.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["sandboxes", "1", "2"]), "{inspect}");
    let row = |text: &str, what: &[&str]| text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == what);
    let set = ember(&["tenant", "set", "cli", "--max-sandboxes", "3", "--unset", "memory"]);
    let memory_unlimited = set.lines().any(|l| l.trim_start().starts_with("memory bytes") && l.ends_with(" -"));
    assert!(row(&set, &["sandboxes", "1", "3"]) && memory_unlimited, "{set}");
    let both = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["--url", &d.url, "--api-key", ADMIN, "tenant", "set", "cli", "--max-tasks", "1", "--unset", "tasks"])
        .output()
        .expect("ember runs");
    assert!(!both.status.success(), "a quota both given and unset is refused");
    assert!(ember(&["tenant", "ls"]).contains("cli"));
    let prefix = ember(&["tenant", "key", "ls", "cli"]).trim().to_string();
    assert!(key.starts_with(&prefix), "{key} {prefix}");
    ember(&["tenant", "key", "revoke", "cli", &prefix]);
    assert_eq!(call(&d, &key, "GET", "/v1/sandboxes", None).await.0, 401);
    ember(&["tenant", "rm", "cli"]);
    assert!(!ember(&["tenant", "ls"]).contains("cli"));
}

async fn exec(d: &Daemon, cred: (&str, &str), id: &str) -> u16 {
    let addr = d.url.trim_start_matches("http://");
    let body = json!({"command": "true"}).to_string();
    let h = [format!("Host: {addr}"), format!("{}: {}", cred.0, cred.1), "Content-Type: application/json".into()];
    let req = format!("POST /v1/sandboxes/{id}/proxy/44772/command");
    common::raw::exchange(addr, &req, &h, &body, HANG).await.0
}

/// A scoped token opens its sandbox's proxy route within its scope, nothing
/// else; it dies with its sandbox and at its expiry. `secureAccess: true`
/// puts one in the endpoint answer, and that header alone opens execd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_tokens_open_one_sandbox_within_their_scope_until_they_die() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let key = tenant(&d, "tok", json!({})).await;
    let one = create_sandbox(&d, &key, json!({})).await.1["id"].as_str().expect("id").to_string();
    let two = create_sandbox(&d, &key, json!({})).await.1["id"].as_str().expect("id").to_string();
    let mint = |scope: &'static str, ttl: u64| {
        let body = json!({"scope": scope, "ttlSeconds": ttl});
        let path = format!("/v1/sandboxes/{one}/tokens");
        let (d, key) = (&d, key.clone());
        async move {
            let (s, b) = call(d, &key, "POST", &path, Some(body)).await;
            assert_eq!(s, 201, "{b}");
            conforms("ScopedToken", &b);
            b["token"].as_str().expect("token").to_string()
        }
    };
    let exec_only = mint("exec", 600).await;
    assert_eq!(exec(&d, ("OPEN-SANDBOX-API-KEY", &exec_only), &one).await, 200);
    assert_eq!(exec(&d, ("Authorization", &format!("Bearer {exec_only}")), &one).await, 200);
    assert_eq!(exec(&d, ("OPEN-SANDBOX-API-KEY", &exec_only), &two).await, 404, "another sandbox");
    let files = |t: &str| {
        let c = ember_client::Client::new(&d.url, Some(t.to_string())).expect("client");
        let id = one.clone();
        async move { c.upload(&id, "/tmp/t.txt", bytes::Bytes::from_static(b"x"), 0o644).await.map_err(|e| e.to_string()) }
    };
    assert!(files(&exec_only).await.is_err_and(|e| e.contains("403")), "an exec token wrote a file");
    assert_eq!(call(&d, &exec_only, "GET", "/v1/sandboxes", None).await.0, 403);
    assert_eq!(call(&d, &exec_only, "POST", &format!("/v1/sandboxes/{one}/pause"), None).await.0, 403);
    assert_eq!(call(&d, &exec_only, "POST", &format!("/v1/sandboxes/{one}/tokens"), None).await.0, 403);
    let files_only = mint("files", 600).await;
    files(&files_only).await.expect("a files token writes a file");
    assert_eq!(exec(&d, ("OPEN-SANDBOX-API-KEY", &files_only), &one).await, 403);
    // Expiry: a one-second token, used after its second.
    let short = mint("all", 1).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(exec(&d, ("OPEN-SANDBOX-API-KEY", &short), &one).await, 401);
    // The sandbox's end ends its tokens.
    assert_eq!(call(&d, &key, "DELETE", &format!("/v1/sandboxes/{one}"), None).await.0, 204);
    assert_eq!(exec(&d, ("OPEN-SANDBOX-API-KEY", &exec_only), &one).await, 401);

    // secureAccess: the endpoint answer's header alone reaches execd.
    let (s, b) = create_sandbox(&d, &key, json!({"secureAccess": true})).await;
    assert_eq!(s, 202, "{b}");
    let sec = b["id"].as_str().expect("id").to_string();
    let (_, ep) = call(&d, &key, "GET", &format!("/v1/sandboxes/{sec}/endpoints/44772"), None).await;
    let token = ep["headers"]["OpenSandbox-Secure-Access"].as_str().expect("secure-access header").to_string();
    assert_eq!(exec(&d, ("OpenSandbox-Secure-Access", &token), &sec).await, 200);
    assert_eq!(exec(&d, ("X-Nothing", "x"), &sec).await, 401);
    assert_eq!(exec(&d, ("OpenSandbox-Secure-Access", &token), &two).await, 404);
}

/// One request on `s` (kept alive), its answer read by its Content-Length;
/// `None` when the daemon closed the connection instead.
async fn on_conn(s: &mut tokio::net::TcpStream, addr: &str, key: &str, req: &str, body: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let head = format!(
        "{req} HTTP/1.1\r\nHost: {addr}\r\nOPEN-SANDBOX-API-KEY: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.ok()?;
    // The body after the head, as httpx (h11) writes them: a daemon that
    // answers without reading it has answered by now, and closes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(body.as_bytes()).await.ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((h, rest)) = text.split_once("\r\n\r\n") {
            let len = h.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ")?.parse().ok());
            if rest.len() >= len.unwrap_or(0) {
                return h.split(' ').nth(1)?.parse().ok();
            }
        }
        match tokio::time::timeout(HANG, s.read(&mut buf)).await.expect("answer in time") {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A refusal of the guard reads the request's body first, as the router's
/// own fallbacks do: else the connection is closed under a keep-alive client
/// (httpx then fails its next request: "Server disconnected").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_leaves_the_connection_usable() {
    let d = Daemon::start_with(&["--api-key", ADMIN]);
    let key = tenant(&d, "ka", json!({})).await;
    let addr = d.url.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let body = json!({"name": "x"}).to_string();
    assert_eq!(on_conn(&mut s, &addr, &key, "POST /v1/sandboxes/nope/snapshots", &body).await, Some(404));
    assert_eq!(on_conn(&mut s, &addr, &key, "POST /v1/images/prune", &body).await, Some(403));
    assert_eq!(on_conn(&mut s, &addr, &key, "GET /v1/sandboxes", "").await, Some(200), "the connection was closed");
}
