//! docs/api/openapi.yaml against the real daemon. Root tests: every documented
//! lifecycle operation is called over raw HTTP/1.1 on a real `ember serve` with
//! real sandboxes, error cases included, and every answer must be documented
//! for its path, method and status, carry the documented headers, and have a
//! body that validates against the declared schema (undeclared keys are errors
//! too). A drift test checks the document's paths and methods against the
//! router sources of the daemon and of the agent.
mod common;
#[path = "openapi/images.rs"]
mod image_ops;
#[path = "../src/bench/registry.rs"]
mod registry;
#[path = "common/schema.rs"]
mod schema;

use common::Daemon;
use schema::Validator;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const EXECD: &str = "/v1/sandboxes/{id}/proxy/44772";

fn repo_file(rel: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

fn load_doc() -> Value {
    serde_yaml::from_str(&repo_file("docs/api/openapi.yaml")).expect("docs/api/openapi.yaml is YAML with string keys")
}

// ------------------------------------------------------------------ raw HTTP

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One request on its own connection (`Connection: close`), read to EOF.
async fn http(base: &str, method: &str, target: &str, headers: &[(String, String)], body: &[u8]) -> Resp {
    let addr = base.strip_prefix("http://").expect("http base url");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect to the daemon");
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.expect("write request");
    s.write_all(body).await.expect("write body");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read response");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response head");
    let head = String::from_utf8(raw[..split].to_vec()).expect("ASCII head");
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Resp { status, headers, body }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
        let size_text = std::str::from_utf8(&b[..eol]).expect("chunk size");
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16).expect("hex size");
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 2 + size + 2..];
    }
}

// ---------------------------------------------------------- the conformance client

/// The daemon, the document, and what has been exercised.
struct Api {
    d: Daemon,
    doc: Value,
    seq: AtomicU32,
    /// (method, documented path, status) of every checked answer.
    seen: Mutex<BTreeSet<(String, String, u16)>>,
    /// Sent with every request (the API-key tests).
    auth: Vec<(String, String)>,
}

struct Req<'a> {
    api: &'a Api,
    method: &'static str,
    template: &'static str,
    args: Vec<String>,
    query: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    bare: bool,
    fallback: Option<&'static str>,
}

impl Api {
    fn new(d: Daemon) -> Api {
        Api { d, doc: load_doc(), seq: AtomicU32::new(0), seen: Mutex::default(), auth: Vec::new() }
    }

    /// A request for the documented `template`; `{...}` are filled from `args`, in order.
    fn req(&self, method: &'static str, template: &'static str, args: &[&str]) -> Req<'_> {
        Req {
            api: self,
            method,
            template,
            args: args.iter().map(|s| s.to_string()).collect(),
            query: String::new(),
            headers: self.auth.clone(),
            body: Vec::new(),
            bare: false,
            fallback: None,
        }
    }
}

impl Req<'_> {
    fn query(mut self, q: &str) -> Self {
        self.query = q.to_string();
        self
    }
    fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.to_string(), v.to_string()));
        self
    }
    fn json(self, v: Value) -> Self {
        self.raw("application/json", v.to_string().into_bytes())
    }
    fn raw(mut self, content_type: &str, body: Vec<u8>) -> Self {
        self.headers.push(("Content-Type".into(), content_type.into()));
        self.body = body;
        self
    }
    /// Send to the path without `/v1` (the documented alias).
    fn bare(mut self) -> Self {
        self.bare = true;
        self
    }
    /// The answer is a router fallback, documented as `components/responses/<name>`.
    fn fallback(mut self, name: &'static str) -> Self {
        self.fallback = Some(name);
        self
    }

    async fn send(self) -> Resp {
        let mut path = String::new();
        let mut args = self.args.iter();
        let mut rest = self.template;
        while let Some(open) = rest.find('{') {
            let close = rest[open..].find('}').expect("closed placeholder") + open;
            path.push_str(&rest[..open]);
            path.push_str(args.next().unwrap_or_else(|| panic!("too few args for {}", self.template)));
            rest = &rest[close + 1..];
        }
        path.push_str(rest);
        if self.bare {
            path = path.strip_prefix("/v1").expect("a /v1 path has a bare alias").to_string();
        }
        if !self.query.is_empty() {
            path = format!("{path}?{}", self.query);
        }
        let rid = format!("oa-{}", self.api.seq.fetch_add(1, Ordering::SeqCst));
        let mut headers = self.headers.clone();
        headers.push(("X-Request-ID".into(), rid.clone()));
        let resp = http(&self.api.d.url, self.method, &path, &headers, &self.body).await;
        let what =
            format!("{} {path} -> {}: {}", self.method, resp.status, resp.text().chars().take(300).collect::<String>());
        assert_eq!(resp.header("x-request-id"), Some(rid.as_str()), "X-Request-ID not echoed: {what}");
        let response = match self.fallback {
            Some(name) => self.api.doc["components"]["responses"][name].clone(),
            None => self.documented_response(resp.status, &what),
        };
        conform(&self.api.doc, &response, &resp, &what);
        self.api.seen.lock().unwrap().insert((self.method.to_string(), self.template.to_string(), resp.status));
        resp
    }

    fn documented_response(&self, status: u16, what: &str) -> Value {
        let op = &self.api.doc["paths"][self.template][self.method.to_ascii_lowercase()];
        assert!(op.is_object(), "{} {} is not documented ({what})", self.method, self.template);
        let responses = &op["responses"];
        let r = responses.get(status.to_string()).or_else(|| responses.get("default"));
        r.unwrap_or_else(|| panic!("status {status} is not documented for {} {} ({what})", self.method, self.template))
            .clone()
    }
}

/// Checks one answer against a Response Object: required headers, the media
/// type, and the body against its schema (per frame for `x-ember-stream`).
fn conform(doc: &Value, response: &Value, resp: &Resp, what: &str) {
    let v = Validator::strict(doc);
    let mut response = response;
    while let Some(r) = response.get("$ref").and_then(Value::as_str) {
        response = v.resolve(r).unwrap_or_else(|e| panic!("{e} ({what})"));
    }
    for (name, h) in response["headers"].as_object().into_iter().flatten() {
        let h = match h.get("$ref").and_then(Value::as_str) {
            Some(r) => v.resolve(r).expect("header $ref"),
            None => h,
        };
        if h["required"] == json!(true) {
            assert!(resp.header(name).is_some(), "documented header {name} is missing: {what}");
        }
    }
    let Some(content) = response.get("content").and_then(Value::as_object) else {
        assert!(resp.body.is_empty(), "no body is documented but one came: {what}");
        return;
    };
    let ctype = resp.header("content-type").unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let media = content
        .get(&ctype)
        .or_else(|| content.get("*/*"))
        .unwrap_or_else(|| panic!("content type {ctype:?} is not documented ({:?}): {what}", content.keys()));
    let schema = &media["schema"];
    let check = |value: &Value| {
        if let Err(errs) = v.validate(schema, value) {
            panic!("body does not match the document: {errs:#?}\n{what}\nbody: {value:#}");
        }
    };
    if media["x-ember-stream"] == json!("frames") {
        let text = resp.text();
        assert!(text.ends_with("\n\n"), "a stream ends with a complete frame: {what}");
        for frame in text.split("\n\n").filter(|f| !f.is_empty()) {
            assert!(!frame.contains('\n'), "a frame is one line: {frame:?}");
            check(&serde_json::from_str(frame).unwrap_or_else(|e| panic!("frame {frame:?} is not JSON: {e}")));
        }
    } else if ctype == "application/json" {
        check(&resp.json());
    } else if schema["type"] == json!("string") {
        assert!(ctype != "application/json", "a JSON body where a string is documented: {what}");
    }
}

// ------------------------------------------------------------------- the tests

fn multipart(boundary: &str, path: &str, contents: &str) -> Vec<u8> {
    format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\n\
         Content-Type: application/json\r\n\r\n{}\r\n--{boundary}\r\n\
         Content-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n{contents}\r\n--{boundary}--\r\n",
        json!({"path": path, "mode": 644})
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_answers_as_documented() {
    let reg = image_ops::registry_with_image();
    let api = Api::new(Daemon::start_with(&["--insecure-registry", &reg.addr]));
    system_routes(&api).await;
    let (a, b) = create_and_read(&api).await;
    change_and_inspect(&api, &a, &b).await;
    execd_through_the_proxy(&api, &a).await;
    pause_resume_and_delete(&api, &a, &b).await;
    router_fallbacks(&api, &a).await;
    pools(&api).await;
    image_ops::images_and_templates(&api, &reg.addr).await;
    workspaces(&api).await;
    tasks(&api).await;

    // Every operation of the lifecycle, ember and system tags was answered with a 2xx.
    let seen = api.seen.lock().unwrap().clone();
    let mut missing = Vec::new();
    for (path, item) in api.doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let tags = op["tags"].as_array().cloned().unwrap_or_default();
            if !tags.iter().any(|t| ["sandboxes", "ember", "system"].contains(&t.as_str().unwrap_or(""))) {
                continue;
            }
            let m = method.to_ascii_uppercase();
            if !seen.iter().any(|(sm, sp, st)| *sm == m && sp == path && (200..300).contains(st)) {
                missing.push(format!("{m} {path}"));
            }
        }
    }
    assert!(missing.is_empty(), "documented operations never exercised: {missing:?}");
}

async fn system_routes(api: &Api) {
    let h = api.req("GET", "/health", &[]).send().await;
    assert_eq!((h.status, h.json()), (200, json!({"status": "healthy"})));
    assert_eq!(api.req("GET", "/version", &[]).send().await.status, 200);
    let rts = api.req("GET", "/v1/runtimes", &[]).send().await;
    assert_eq!(rts.status, 200);
    let items = rts.json()["items"].as_array().cloned().unwrap_or_default();
    assert!(items.iter().any(|r| r["name"] == "native" && r["available"] == true), "{items:?}");
    let m = api.req("GET", "/metrics", &[]).send().await;
    assert_eq!(m.status, 200);
    assert!(m.text().trim_end().ends_with("# EOF"), "OpenMetrics text ends with # EOF");
    let ev = json!({"eventType": "sandbox.create", "createDurationMs": 12, "success": true});
    assert_eq!(api.req("POST", "/v1/metrics/events", &[]).json(ev).send().await.status, 204);
    // Without an X-Request-ID, one is generated.
    let r = http(&api.d.url, "GET", "/health", &[], b"").await;
    let id = r.header("x-request-id").expect("generated X-Request-ID");
    assert!(id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
}

/// Creates A (with expiry, team=a) and B (manual cleanup, team=b) and reads them back.
async fn create_and_read(api: &Api) -> (String, String) {
    let body =
        json!({"template": "host", "timeout": 600, "metadata": {"team": "a"}, "entrypoint": ["sleep", "infinity"]});
    let r = api.req("POST", "/v1/sandboxes", &[]).json(body).send().await;
    assert_eq!(r.status, 202, "{}", r.text());
    let a = r.json();
    assert_eq!(a["status"]["state"], "Running");
    assert!(a["expiresAt"].is_string() && a["launch"]["micros"].is_u64());
    assert_eq!(r.header("x-ember-launch-micros").map(str::to_string), Some(a["launch"]["micros"].to_string()));
    let body = json!({"image": {"uri": "host"}, "metadata": {"team": "b"}, "resourceLimits": {"memory": "256Mi"}});
    let r = api.req("POST", "/v1/sandboxes", &[]).json(body).send().await;
    assert_eq!(r.status, 202, "{}", r.text());
    let b = r.json();
    assert!(b.get("expiresAt").is_none(), "manual cleanup: no expiresAt key, not null");
    assert_eq!(b["entrypoint"], json!([]));
    let (a, b) = (a["id"].as_str().unwrap().to_string(), b["id"].as_str().unwrap().to_string());

    for (body, status, code) in [
        (b"{".to_vec(), 400, "SANDBOX::INVALID_PARAMETER"),
        (br#"{"timeout":"soon"}"#.to_vec(), 400, "SANDBOX::INVALID_PARAMETER"),
        (br#"{"template":"no-such-template"}"#.to_vec(), 400, "SANDBOX::UNKNOWN_TEMPLATE"),
        (br#"{"template":"host","image":{"uri":"other"}}"#.to_vec(), 400, "SANDBOX::INVALID_PARAMETER"),
        (br#"{"template":"host","resourceLimits":{"gpu":"1"}}"#.to_vec(), 400, "SANDBOX::INVALID_PARAMETER"),
        (br#"{"snapshotId":"s1"}"#.to_vec(), 404, "SNAPSHOT::NOT_FOUND"),
        (br#"{"snapshotId":"s1","templateId":"host"}"#.to_vec(), 400, "SANDBOX::INVALID_PARAMETER"),
    ] {
        let r = api.req("POST", "/v1/sandboxes", &[]).raw("application/json", body).send().await;
        assert_eq!((r.status, r.json()["code"].as_str()), (status, Some(code)), "{}", r.text());
    }

    let r = api.req("GET", "/v1/sandboxes/{id}", &[&a]).send().await;
    assert_eq!((r.status, r.json()["id"].as_str()), (200, Some(a.as_str())));
    let r = api.req("GET", "/v1/sandboxes/{id}", &["nope"]).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("SANDBOX::NOT_FOUND")));
    let r = api.req("GET", "/v1/sandboxes/{id}", &[&b]).bare().send().await;
    assert_eq!(r.status, 200);

    let list = |q: &str| api.req("GET", "/v1/sandboxes", &[]).query(q).send();
    let r = list("").await;
    assert_eq!((r.status, r.json()["pagination"]["totalItems"].as_u64()), (200, Some(2)));
    let r = list("state=Running&state=paused").await;
    assert_eq!(r.json()["items"].as_array().map(Vec::len), Some(2));
    let r = list("metadata=team%3Da").await;
    assert_eq!(r.json()["items"][0]["id"].as_str(), Some(a.as_str()));
    assert_eq!(r.json()["pagination"]["totalItems"], 1);
    let p1 = list("page=1&pageSize=1").await.json();
    assert_eq!(
        p1["pagination"],
        json!({"page": 1, "pageSize": 1, "totalItems": 2, "totalPages": 2, "hasNextPage": true})
    );
    let p2 = list("page=2&pageSize=1").await.json();
    assert_eq!(
        (p2["pagination"]["hasNextPage"].as_bool(), p2["items"][0]["id"].as_str()),
        (Some(false), Some(b.as_str()))
    );
    assert_eq!(list("page=3&pageSize=1").await.json()["items"], json!([]));
    for bad in ["pageSize=0", "pageSize=201", "page=0"] {
        assert_eq!(list(bad).await.status, 400, "{bad}");
    }
    // A state ember never enters matches nothing (clients must tolerate unknown
    // state names), alone or OR-ed with a known one.
    assert_eq!(list("state=Pausing").await.json()["items"], json!([]));
    assert_eq!(list("state=Pausing&state=Running").await.json()["pagination"]["totalItems"], 2);
    assert_eq!(api.req("GET", "/v1/sandboxes", &[]).bare().send().await.status, 200);
    (a, b)
}

async fn change_and_inspect(api: &Api, a: &str, b: &str) {
    let patch = |id: &str, body: &[u8]| {
        api.req("PATCH", "/v1/sandboxes/{id}/metadata", &[id]).raw("application/json", body.to_vec()).send()
    };
    let r = patch(a, br#"{"owner":"me","team":null}"#).await;
    assert_eq!((r.status, &r.json()["metadata"]), (200, &json!({"owner": "me"})));
    let r = patch(b, br#"{"team":null}"#).await;
    assert!(r.json().get("metadata").is_none(), "empty metadata is omitted");
    assert_eq!(patch(a, br#"{"opensandbox.io/x":"y"}"#).await.status, 400);
    assert_eq!(patch(a, b"[1]").await.status, 400);
    assert_eq!(patch("nope", b"{}").await.status, 404);

    let renew = |id: &str, at: &str| {
        api.req("POST", "/v1/sandboxes/{id}/renew-expiration", &[id]).json(json!({ "expiresAt": at })).send()
    };
    let r = renew(a, "2099-01-01T00:00:00Z").await;
    assert_eq!((r.status, r.json()["expiresAt"].as_str()), (200, Some("2099-01-01T00:00:00Z")));
    let r = renew(b, "2099-01-01T00:00:00Z").await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("SANDBOX::NO_EXPIRATION")));
    let r = renew(a, "tomorrow").await;
    assert_eq!((r.status, r.json()["code"].as_str()), (400, Some("SANDBOX::INVALID_EXPIRATION")));
    assert_eq!(renew(a, "2000-01-01T00:00:00Z").await.status, 400);
    assert_eq!(renew("nope", "2099-01-01T00:00:00Z").await.status, 404);
    let r = api.req("POST", "/v1/sandboxes/{id}/renew-expiration", &[a]).json(json!({})).send().await;
    assert_eq!(r.status, 400);

    let endpoint = |id: &str, port: &str| api.req("GET", "/v1/sandboxes/{id}/endpoints/{port}", &[id, port]);
    for port in ["44772", "18080"] {
        let r = endpoint(a, port).query("use_server_proxy=true").send().await;
        let want = format!("{}/v1/sandboxes/{a}/proxy/{port}", api.d.url.trim_start_matches("http://"));
        assert_eq!((r.status, r.json()), (200, json!({ "endpoint": want })));
    }
    assert_eq!(endpoint("nope", "44772").send().await.status, 404);
    assert_eq!(endpoint(a, "not-a-port").send().await.status, 400);
    assert_eq!(endpoint(a, "70000").send().await.status, 400);

    for kind in ["logs", "events"] {
        let t = if kind == "logs" {
            "/v1/sandboxes/{id}/diagnostics/logs"
        } else {
            "/v1/sandboxes/{id}/diagnostics/events"
        };
        let r = api.req("GET", t, &[a]).query("scope=lifecycle").send().await;
        assert_eq!(
            (r.status, r.json()["kind"].as_str(), r.json()["scope"].as_str()),
            (200, Some(kind), Some("lifecycle"))
        );
        assert_eq!(api.req("GET", t, &["nope"]).send().await.status, 404);
    }
    let r = api.req("GET", "/v1/sandboxes/{id}/diagnostics/events", &[a]).send().await;
    assert!(r.json()["content"].as_str().unwrap_or("").contains("Running"), "{}", r.text());
    sandbox_snapshots(api, a).await;

    let r = api.req("GET", "/v1/sandboxes/{id}/boundary", &[a]).send().await;
    assert_eq!((r.status, r.json()["runtimeClass"].as_str()), (200, Some("native")));
    assert_eq!(api.req("GET", "/v1/sandboxes/{id}/boundary", &["nope"]).send().await.status, 404);
}

async fn execd_through_the_proxy(api: &Api, a: &str) {
    let x = |method: &'static str, op: &'static str| api.req(method, op, &[a]);
    let r = x("GET", "/v1/sandboxes/{id}/proxy/44772/ping").send().await;
    assert_eq!((r.status, r.body.len()), (200, 0));

    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/command")
        .json(json!({"command": "echo hi; echo oops >&2"}))
        .send()
        .await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").is_some_and(|c| c.starts_with("text/event-stream")));
    let frames: Vec<Value> =
        r.text().split("\n\n").filter(|f| !f.is_empty()).map(|f| serde_json::from_str(f).unwrap()).collect();
    let kinds: Vec<&str> = frames.iter().filter_map(|f| f["type"].as_str()).filter(|k| *k != "ping").collect();
    assert_eq!(kinds.first(), Some(&"init"));
    assert_eq!(kinds.last(), Some(&"execution_complete"));
    assert!(frames.iter().any(|f| f["type"] == "stdout" && f["text"] == "hi"));
    let cid = frames[0]["text"].as_str().expect("init carries the command id").to_string();
    let r =
        x("POST", "/v1/sandboxes/{id}/proxy/44772/command").json(json!({"argv": ["sh", "-c", "exit 3"]})).send().await;
    assert!(r.text().contains(r#""evalue":"3""#), "{}", r.text());
    let r =
        x("POST", "/v1/sandboxes/{id}/proxy/44772/command").json(json!({"command": "x", "argv": ["y"]})).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (400, Some("INVALID_REQUEST_BODY")));

    let status =
        |id: &str| api.req("GET", "/v1/sandboxes/{id}/proxy/44772/command/status/{commandId}", &[a, id]).send();
    let s = status(&cid).await.json();
    assert_eq!((s["running"].as_bool(), s["exit_code"].as_i64()), (Some(false), Some(0)));
    assert_eq!(status("no-such-command").await.status, 404);
    let r = api.req("GET", "/v1/sandboxes/{id}/proxy/44772/command/{commandId}/logs", &[a, &cid]).send().await;
    assert!(r.status == 200 && r.text().contains("hi"), "{}", r.text());
    let r = x("DELETE", "/v1/sandboxes/{id}/proxy/44772/command").query(&format!("id={cid}")).send().await;
    assert_eq!(r.status, 200);
    assert_eq!(x("DELETE", "/v1/sandboxes/{id}/proxy/44772/command").send().await.status, 400);

    let body = multipart("XyZ", "/tmp/oa/a.txt", "hello openapi\n");
    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/files/upload")
        .raw("multipart/form-data; boundary=XyZ", body)
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/files/upload")
        .raw("multipart/form-data; boundary=XyZ", b"--XyZ--\r\n".to_vec())
        .send()
        .await;
    assert_eq!(r.status, 400);
    let dl = |q: &str| x("GET", "/v1/sandboxes/{id}/proxy/44772/files/download").query(q);
    let r = dl("path=/tmp/oa/a.txt").send().await;
    assert_eq!((r.status, r.text().as_str()), (200, "hello openapi\n"));
    let r = dl("path=/tmp/oa/a.txt").header("Range", "bytes=0-4").send().await;
    assert_eq!((r.status, r.text().as_str(), r.header("content-range")), (206, "hello", Some("bytes 0-4/14")));
    assert_eq!(dl("path=/tmp/oa/a.txt").header("Range", "bytes=99-").send().await.status, 416);
    assert_eq!(dl("path=/tmp/oa/a.txt&offset=1&limit=1").send().await.status, 200);
    assert_eq!(dl("path=/tmp/oa/missing").send().await.status, 404);
    assert_eq!(dl("").send().await.status, 400);

    let r = x("GET", "/v1/sandboxes/{id}/proxy/44772/files/info").query("path=/tmp/oa/a.txt").send().await;
    assert_eq!((r.status, r.json()["/tmp/oa/a.txt"]["mode"].as_u64()), (200, Some(644)));
    let r =
        x("POST", "/v1/sandboxes/{id}/proxy/44772/directories").json(json!({"/tmp/oa/d": {"mode": 700}})).send().await;
    assert_eq!(r.status, 200);
    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/files/permissions")
        .json(json!({"/tmp/oa/a.txt": {"mode": 600}}))
        .send()
        .await;
    assert_eq!(r.status, 200);
    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/files/replace")
        .query("verbose=true")
        .json(json!({"/tmp/oa/a.txt": {"old": "hello", "new": "bye"}}))
        .send()
        .await;
    assert_eq!((r.status, r.json()), (200, json!({"/tmp/oa/a.txt": {"replacedCount": 1}})));
    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/files/mv")
        .json(json!([{"src": "/tmp/oa/a.txt", "dest": "/tmp/oa/d/b.txt"}]))
        .send()
        .await;
    assert_eq!(r.status, 200);
    let r = x("GET", "/v1/sandboxes/{id}/proxy/44772/directories/list").query("path=/tmp/oa&depth=2").send().await;
    assert_eq!((r.status, r.json().as_array().map(Vec::len)), (200, Some(2)));
    let r = x("GET", "/v1/sandboxes/{id}/proxy/44772/files/search").query("path=/tmp/oa&pattern=*.txt").send().await;
    assert_eq!((r.status, r.json()[0]["path"].as_str()), (200, Some("/tmp/oa/d/b.txt")));
    assert_eq!(
        x("GET", "/v1/sandboxes/{id}/proxy/44772/directories/list").query("path=/tmp/nope").send().await.status,
        404
    );
    assert_eq!(
        x("DELETE", "/v1/sandboxes/{id}/proxy/44772/files").query("path=/tmp/oa/d/b.txt").send().await.status,
        200
    );
    assert_eq!(
        x("DELETE", "/v1/sandboxes/{id}/proxy/44772/directories").query("path=/tmp/oa").send().await.status,
        200
    );
    assert_eq!(x("GET", "/v1/sandboxes/{id}/proxy/44772/metrics").send().await.status, 200);

    // The generic proxy route: unknown agent path, other ports, bad port, unknown sandbox.
    let proxy =
        |id: &str, port: &str, rest: &str| api.req("GET", "/v1/sandboxes/{id}/proxy/{port}/{path}", &[id, port, rest]);
    let r = proxy(a, "44772", "no/such/route").send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("NOT_SUPPORTED")));
    // Port 18080 is the egress port, answered by the daemon; any other port goes
    // through the agent to 127.0.0.1:port in the sandbox (nothing listens: 502).
    let r = proxy(a, "18080", "policy").send().await;
    assert_eq!((r.status, r.json()["enforcementMode"].as_str()), (200, Some("none")));
    let r = proxy(a, "18080", "credential-vault").send().await;
    assert_eq!(r.status, 404);
    let r = proxy(a, "8080", "x").send().await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(proxy(a, "port", "ping").send().await.status, 400);
    assert_eq!(proxy("nope", "44772", "ping").send().await.status, 404);
    assert_eq!(api.req("GET", "/v1/sandboxes/{id}/proxy/{port}", &[a, "44772"]).send().await.status, 404);
    assert_eq!(api.req("POST", "/v1/sandboxes/{id}/proxy/{port}", &[a, "8080"]).send().await.status, 502);
}

/// Sandbox snapshots: create (202 + Location), list, get, restore via
/// `snapshotId`, the refusals, delete (204).
async fn sandbox_snapshots(api: &Api, a: &str) {
    let r = api.req("POST", "/v1/sandboxes/{id}/snapshots", &[a]).json(json!({"name": "s1"})).send().await;
    assert_eq!(r.status, 202, "{}", r.text());
    let sid = r.json()["id"].as_str().expect("snapshot id").to_string();
    assert_eq!(r.header("location"), Some(format!("/v1/snapshots/{sid}").as_str()));
    let r = api.req("POST", "/v1/sandboxes/{id}/snapshots", &[a]).bare().send().await;
    assert_eq!(r.status, 202, "no body is fine: {}", r.text());
    let other = r.json()["id"].as_str().expect("snapshot id").to_string();
    assert_eq!(api.req("POST", "/v1/sandboxes/{id}/snapshots", &["nope"]).send().await.status, 404);
    let r = api.req("GET", "/v1/snapshots", &[]).query(&format!("sandboxId={a}&name=s1&state=Ready")).send().await;
    assert_eq!(r.json()["items"][0]["id"], sid.as_str(), "{}", r.text());
    assert_eq!(api.req("GET", "/v1/snapshots", &[]).query("page=0").send().await.status, 400);
    assert_eq!(api.req("GET", "/v1/snapshots/{snapshotId}", &[&sid]).send().await.status, 200);
    assert_eq!(api.req("GET", "/v1/snapshots/{snapshotId}", &["nope"]).bare().send().await.status, 404);
    let r = api.req("POST", "/v1/sandboxes", &[]).json(json!({"snapshotId": sid, "metadata": {"r": "1"}})).send().await;
    assert_eq!(r.status, 202, "{}", r.text());
    let restored = r.json()["id"].as_str().expect("id").to_string();
    assert_eq!(api.req("DELETE", "/v1/sandboxes/{id}", &[&restored]).send().await.status, 204);
    assert_eq!(api.req("DELETE", "/v1/snapshots/{snapshotId}", &[&sid]).send().await.status, 204);
    assert_eq!(api.req("DELETE", "/v1/snapshots/{snapshotId}", &[&other]).bare().send().await.status, 204);
    assert_eq!(api.req("DELETE", "/v1/snapshots/{snapshotId}", &[&sid]).send().await.status, 404);
}

async fn pause_resume_and_delete(api: &Api, a: &str, b: &str) {
    let op = |method: &'static str, t: &'static str, id: &str| api.req(method, t, &[id]).send();
    assert_eq!(op("POST", "/v1/sandboxes/{id}/pause", a).await.status, 202);
    assert_eq!(op("GET", "/v1/sandboxes/{id}", a).await.json()["status"]["state"], "Paused");
    let r = op("POST", "/v1/sandboxes/{id}/pause", a).await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("SANDBOX::NOT_RUNNING")));
    let r = op("GET", "/v1/sandboxes/{id}/proxy/44772/ping", a).await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("SANDBOX::NOT_RUNNING")));
    let r = api.req("GET", "/v1/sandboxes", &[]).query("state=Paused").send().await;
    assert_eq!(r.json()["items"][0]["id"].as_str(), Some(a));
    assert_eq!(op("POST", "/v1/sandboxes/{id}/resume", a).await.status, 202);
    let r = op("POST", "/v1/sandboxes/{id}/resume", a).await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("SANDBOX::NOT_PAUSED")));
    assert_eq!(op("POST", "/v1/sandboxes/{id}/pause", "nope").await.status, 404);
    assert_eq!(op("POST", "/v1/sandboxes/{id}/resume", "nope").await.status, 404);
    assert_eq!(api.req("POST", "/v1/sandboxes/{id}/pause", &[b]).bare().send().await.status, 202);

    assert_eq!(op("DELETE", "/v1/sandboxes/{id}", a).await.status, 204);
    assert_eq!(api.req("DELETE", "/v1/sandboxes/{id}", &[b]).bare().send().await.status, 204);
    assert_eq!(op("DELETE", "/v1/sandboxes/{id}", a).await.status, 404);
    assert_eq!(op("GET", "/v1/sandboxes/{id}", b).await.status, 404);
    assert_eq!(api.req("GET", "/v1/sandboxes", &[]).send().await.json()["items"], json!([]));
}

async fn pools(api: &Api) {
    let body = json!({"template": "host", "min": 1, "max": 2, "target": "auto"});
    let r = api.req("POST", "/v1/pools", &[]).json(body.clone()).send().await;
    assert_eq!((r.status, r.json()["name"].as_str()), (201, Some("host")));
    let r = api.req("POST", "/v1/pools", &[]).json(body).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("POOL::ALREADY_EXISTS")));
    let r = api
        .req("POST", "/v1/pools", &[])
        .json(json!({"template": "host", "name": "p2", "min": 3, "max": 1}))
        .send()
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(api.req("GET", "/v1/pools", &[]).send().await.json()["items"][0]["name"], "host");
    let r = api.req("GET", "/v1/pools/{name}", &["host"]).send().await;
    assert_eq!(r.json()["sizing"]["windowSecs"], 60);
    let r = api.req("PUT", "/v1/pools/{name}", &["host"]).json(json!({"target": 2})).send().await;
    assert_eq!((r.status, r.json()["target"].clone()), (200, json!(2)));
    let r = api.req("PUT", "/v1/pools/{name}", &["host"]).json(json!({"target": "lots"})).send().await;
    assert_eq!(r.status, 400);
    assert_eq!(api.req("GET", "/v1/pools/{name}", &["nope"]).send().await.status, 404);
    assert_eq!(api.req("DELETE", "/v1/pools/{name}", &["host"]).send().await.status, 204);
    assert_eq!(api.req("DELETE", "/v1/pools/{name}", &["host"]).send().await.status, 404);
}

async fn workspaces(api: &Api) {
    let r = api.req("POST", "/v1/workspaces", &[]).json(json!({"name": "ws1", "size": "32Mi"})).send().await;
    assert_eq!((r.status, r.json()["name"].as_str()), (201, Some("ws1")));
    let r = api.req("POST", "/v1/workspaces", &[]).json(json!({"name": "ws1", "size": "32Mi"})).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("WORKSPACE::ALREADY_EXISTS")));
    let r = api.req("POST", "/v1/workspaces", &[]).json(json!({"name": "Bad", "size": "32Mi"})).send().await;
    assert_eq!(r.status, 400);
    assert_eq!(api.req("GET", "/v1/workspaces", &[]).send().await.json()["items"][0]["name"], "ws1");
    let body = json!({"template": "host", "workspaces": [{"name": "ws1"}]});
    let s = api.req("POST", "/v1/sandboxes", &[]).json(body).send().await;
    assert_eq!(s.status, 202);
    let id = s.json()["id"].as_str().expect("id").to_string();
    let r = api.req("GET", "/v1/workspaces/{name}", &["ws1"]).send().await;
    assert_eq!(r.json()["lease"]["holder"].as_str(), Some(id.as_str()));
    let r = api.req("DELETE", "/v1/workspaces/{name}", &["ws1"]).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("WORKSPACE::IN_USE")));
    let r = api.req("POST", "/v1/workspaces/{name}/snapshots", &["ws1"]).send().await;
    assert_eq!(r.status, 201);
    let snap = r.json()["id"].as_str().expect("snapshot id").to_string();
    let r = api
        .req("POST", "/v1/workspaces/{name}/snapshots", &["ws1"])
        .json(json!({"holder": "x", "epoch": 9}))
        .send()
        .await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("WORKSPACE::FENCED")));
    assert_eq!(api.req("POST", "/v1/workspaces/{name}/snapshots", &["nope"]).send().await.status, 404);
    assert_eq!(api.req("GET", "/v1/workspace-snapshots", &[]).send().await.json()["items"][0]["id"], snap.as_str());
    assert_eq!(api.req("GET", "/v1/workspace-snapshots/{id}", &[&snap]).send().await.status, 200);
    let r = api.req("POST", "/v1/workspace-snapshots/{id}/restore", &[&snap]).json(json!({"name": "ws2"})).send().await;
    assert_eq!((r.status, r.json()["name"].as_str()), (201, Some("ws2")));
    let r = api
        .req("POST", "/v1/workspace-snapshots/{id}/fork", &[&snap])
        .json(json!({"count": 2, "prefix": "kid"}))
        .send()
        .await;
    assert_eq!((r.status, r.json()["items"][1]["name"].as_str()), (201, Some("kid-2")));
    for w in ["ws2", "kid-1", "kid-2"] {
        assert_eq!(api.req("DELETE", "/v1/workspaces/{name}", &[w]).send().await.status, 204);
    }
    assert_eq!(api.req("DELETE", "/v1/workspace-snapshots/{id}", &[&snap]).send().await.status, 204);
    assert_eq!(api.req("GET", "/v1/workspace-snapshots/{id}", &[&snap]).send().await.status, 404);
    assert_eq!(api.req("DELETE", "/v1/sandboxes/{id}", &[&id]).send().await.status, 204);
    assert_eq!(api.req("GET", "/v1/workspaces/{name}", &["nope"]).send().await.status, 404);
    assert_eq!(api.req("DELETE", "/v1/workspaces/{name}", &["ws1"]).send().await.status, 204);
}

async fn tasks(api: &Api) {
    let body = json!({"command": ["sh", "-c", "echo hi"], "key": "k1", "tier": "interactive"});
    let r = api.req("POST", "/v1/tasks", &[]).json(body.clone()).send().await;
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["id"].as_str().expect("id").to_string();
    assert_eq!(api.req("POST", "/v1/tasks", &[]).json(body).send().await.status, 200, "same key, same task");
    let r = api.req("POST", "/v1/tasks", &[]).json(json!({"command": []})).send().await;
    assert_eq!(r.status, 400);
    let r = api.req("POST", "/v1/tasks", &[]).json(json!({"command": ["true"], "workspace": "nope"})).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("WORKSPACE::NOT_FOUND")));
    for _ in 0..200 {
        if api.req("GET", "/v1/tasks/{id}", &[&id]).send().await.json()["state"] == "Succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let r = api.req("GET", "/v1/tasks/{id}/logs", &[&id]).query("follow=true").send().await;
    assert_eq!((r.status, r.text().as_str(), r.header("x-ember-attempt")), (200, "hi\n", Some("1")));
    let r = api.req("GET", "/v1/tasks", &[]).query("state=Succeeded&tier=interactive").send().await;
    assert_eq!(r.json()["items"][0]["id"].as_str(), Some(id.as_str()));
    assert_eq!(api.req("GET", "/v1/tasks", &[]).query("tier=urgent").send().await.status, 400);
    let r = api.req("POST", "/v1/tasks/{id}/cancel", &[&id]).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("TASK::ALREADY_ENDED")));
    let long = json!({"command": ["sleep", "600"], "tier": "batch"});
    let long = api.req("POST", "/v1/tasks", &[]).json(long).send().await.json()["id"].as_str().unwrap().to_string();
    let r = api.req("POST", "/v1/tasks/{id}/cancel", &[&long]).send().await;
    assert_eq!((r.status, r.json()["state"].as_str()), (200, Some("Cancelled")));
    assert_eq!(api.req("GET", "/v1/tasks/{id}", &["t-nope"]).send().await.status, 404);
    assert_eq!(api.req("GET", "/v1/tasks/{id}/logs", &["t-nope"]).send().await.status, 404);
    assert_eq!(api.req("POST", "/v1/tasks/{id}/cancel", &["t-nope"]).send().await.status, 404);
}

async fn router_fallbacks(api: &Api, a: &str) {
    for (method, template, args) in [
        ("PUT", "/v1/sandboxes/{id}", vec![a]),
        ("DELETE", "/v1/sandboxes", vec![]),
        ("GET", "/v1/sandboxes/{id}/pause", vec![a]),
        ("GET", "/v1/metrics/events", vec![]),
        ("POST", "/health", vec![]),
    ] {
        let op = &api.doc["paths"][template][method.to_ascii_lowercase()];
        assert!(op.is_null(), "{method} {template} is documented, so 405 would be wrong");
        let r = api.req(method, template, &args).fallback("MethodNotAllowed").send().await;
        assert_eq!(
            (r.status, r.json()["code"].as_str()),
            (405, Some("GENERAL::METHOD_NOT_ALLOWED")),
            "{method} {template}"
        );
    }
    let r = api.req("PUT", "/v1/sandboxes/{id}", &[a]).bare().fallback("MethodNotAllowed").send().await;
    assert_eq!(r.status, 405);
    for path in ["/v1/nope", "/v1", "/v1/sandboxes/x/y/z", "/v2/sandboxes"] {
        let r = api.req("GET", path, &[]).fallback("RouteNotFound").send().await;
        assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("GENERAL::NOT_FOUND")), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_answers_as_documented() {
    let mut api = Api::new(Daemon::start_with(&["--api-key", "s3cret"]));
    let r = api.req("GET", "/v1/sandboxes", &[]).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (401, Some("MISSING_API_KEY")));
    let r = api.req("GET", "/metrics", &[]).header("OPEN-SANDBOX-API-KEY", "wrong").send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (401, Some("INVALID_API_KEY")));
    let r = api.req("GET", "/v1/sandboxes/{id}/proxy/44772/ping", &["x"]).send().await;
    assert_eq!(r.status, 401);
    assert_eq!(api.req("GET", "/health", &[]).send().await.status, 200);
    assert_eq!(api.req("GET", "/version", &[]).send().await.status, 200);
    let r = api.req("GET", "/v1/sandboxes", &[]).header("Authorization", "Bearer s3cret").send().await;
    assert_eq!(r.status, 200);
    api.auth = vec![("OPEN-SANDBOX-API-KEY".into(), "s3cret".into())];
    assert_eq!(api.req("GET", "/v1/sandboxes/{id}", &["nope"]).send().await.status, 404);
    let r = api.req("POST", "/v1/sandboxes", &[]).json(json!({"template": "host"})).send().await;
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let r = api.req("GET", "/v1/sandboxes/{id}/endpoints/{port}", &[&id, "44772"]).send().await;
    assert_eq!(r.json()["headers"], json!({"OPEN-SANDBOX-API-KEY": "s3cret"}));
    // The key is accepted by the proxy route and not forwarded to the agent.
    assert_eq!(api.req("GET", "/v1/sandboxes/{id}/proxy/44772/ping", &[&id]).send().await.status, 200);
    assert_eq!(api.req("DELETE", "/v1/sandboxes/{id}", &[&id]).send().await.status, 204);
}

// ------------------------------------------------------------------ drift

/// `.route("path", methods)` calls in `src`: (byte offset, path, methods).
fn routes_in(src: &str) -> Vec<(usize, String, BTreeSet<String>)> {
    let mut out = Vec::new();
    for (at, _) in src.match_indices(".route(") {
        let start = at + ".route(".len();
        let mut depth = 1;
        let mut end = start;
        for (i, c) in src[start..].char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = start + i;
                break;
            }
        }
        let call = &src[start..end];
        let q1 = call.find('"').expect("a path literal");
        let q2 = call[q1 + 1..].find('"').expect("closing quote") + q1 + 1;
        let path = call[q1 + 1..q2].to_string();
        let rest = &call[q2 + 1..];
        let mut methods = BTreeSet::new();
        for m in ["get", "post", "put", "patch", "delete", "any"] {
            for (i, _) in rest.match_indices(&format!("{m}(")) {
                let before = rest[..i].chars().last().unwrap_or(' ');
                if !(before.is_alphanumeric() || before == '_') {
                    methods.insert(m.to_string());
                }
            }
        }
        if methods.remove("any") {
            methods.extend(["get", "post", "put", "patch", "delete"].map(String::from));
        }
        out.push((at, path, methods));
    }
    out
}

/// `{anything}` → `{}`, `{*rest}` included: names do not matter, shapes do.
fn shape(path: &str) -> String {
    let mut out = String::new();
    let mut skip = false;
    for c in path.chars() {
        match c {
            '{' => {
                skip = true;
                out.push_str("{}");
            }
            '}' => skip = false,
            _ if !skip => out.push(c),
            _ => {}
        }
    }
    out
}

#[test]
fn the_document_has_every_route_and_only_routes() {
    let lib = repo_file("crates/ember-api/src/lib.rs");
    assert!(
        lib.contains(".nest(\"/v1\", v1)") && lib.contains(".merge(lifecycle())"),
        "the document says lifecycle routes are served under /v1 and bare: the router changed"
    );
    let span = |from: &str, to: &str| {
        let a = lib.find(from).unwrap_or_else(|| panic!("{from:?} not in lib.rs"));
        (a, a + lib[a..].find(to).expect("end of span"))
    };
    let lifecycle = span("fn lifecycle()", "\n}\n");
    let v1 = span("let v1 =", ";");
    let mut router: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (at, path, methods) in routes_in(&lib) {
        let in_v1 = (lifecycle.0..lifecycle.1).contains(&at) || (v1.0..v1.1).contains(&at);
        let full = if in_v1 { format!("/v1{path}") } else { path };
        router.entry(shape(&full.replace("{*rest}", "{path}"))).or_default().extend(methods);
    }
    let agent = repo_file("bins/ember-agent/src/server.rs");
    assert!(
        agent.contains(".nest(\"/v1/filesystem/{uid}/{gid}\", file_routes()"),
        "the document says the file routes are also served under /v1/filesystem/{{uid}}/{{gid}}: the agent changed"
    );
    let files_at = agent.find("fn file_routes()").expect("fn file_routes in the agent");
    for (at, path, methods) in routes_in(&agent) {
        // `/ember/...` are the daemon's private control routes; the proxy refuses them.
        if path.starts_with("/ember/") {
            continue;
        }
        if at > files_at {
            let scoped = shape(&format!("{EXECD}/v1/filesystem/{{uid}}/{{gid}}{path}"));
            router.entry(scoped).or_default().extend(methods.clone());
        }
        router.entry(shape(&format!("{EXECD}{path}"))).or_default().extend(methods);
    }

    let doc = load_doc();
    let mut documented: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let methods = item.as_object().expect("path item").keys();
        let ops = methods.filter(|m| ["get", "post", "put", "patch", "delete"].contains(&m.as_str()));
        documented.entry(shape(path)).or_default().extend(ops.cloned());
    }
    let only_router: Vec<_> = router.iter().filter(|(p, m)| documented.get(*p) != Some(m)).collect();
    let only_doc: Vec<_> = documented.iter().filter(|(p, m)| router.get(*p) != Some(m)).collect();
    assert!(
        only_router.is_empty() && only_doc.is_empty(),
        "router and document disagree\n in the router: {only_router:#?}\n in the document: {only_doc:#?}"
    );
    assert!(router.len() >= 30, "the route parser found too little: {router:#?}");
}

#[test]
fn every_response_declares_x_request_id_and_every_ref_resolves() {
    let doc = load_doc();
    let v = Validator::new(&doc);
    fn refs<'a>(x: &'a Value, out: &mut Vec<&'a str>) {
        match x {
            Value::Object(m) => m.iter().for_each(|(k, v)| match (k.as_str(), v) {
                ("$ref", Value::String(r)) => out.push(r),
                _ => refs(v, out),
            }),
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let mut all = Vec::new();
    refs(&doc, &mut all);
    for r in all {
        v.resolve(r).unwrap_or_else(|e| panic!("{e}"));
    }
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("item").iter().filter(|(_, op)| op.get("responses").is_some()) {
            for (status, r) in op["responses"].as_object().expect("responses") {
                let r = r.get("$ref").and_then(Value::as_str).map_or(r, |x| v.resolve(x).expect("ref"));
                assert!(r["headers"]["X-Request-ID"].is_object(), "{method} {path} {status} lacks X-Request-ID");
                checked += 1;
            }
        }
    }
    assert!(checked > 100);
}
