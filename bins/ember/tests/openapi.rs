//! docs/api/openapi.yaml against the real daemon. Root tests: every documented
//! lifecycle operation is called over raw HTTP/1.1 on a real `ember serve` with
//! real sandboxes, error cases included, and every answer must be documented
//! for its path, method and status, carry the documented headers, and have a
//! body that validates against the declared schema (undeclared keys are errors
//! too). A drift test checks the document's paths and methods against the
//! router sources of the daemon and of the agent.
mod common;
#[path = "openapi/drift.rs"]
mod drift;
#[path = "openapi/execd.rs"]
mod execd;
#[path = "openapi/images.rs"]
mod image_ops;
#[path = "openapi/lifecycle.rs"]
mod lifecycle;
#[path = "../src/bench/registry.rs"]
mod registry;
#[path = "openapi/resources.rs"]
mod resources;
#[path = "common/schema.rs"]
mod schema;

use common::Daemon;
use execd::*;
use lifecycle::*;
use parking_lot::Mutex;
use resources::*;
use schema::Validator;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
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
        self.api.seen.lock().insert((self.method.to_string(), self.template.to_string(), resp.status));
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
    cluster_call(&api, &a).await;
    pause_resume_and_delete(&api, &a, &b).await;
    checkpoint_and_restore(&api).await;
    router_fallbacks(&api, &a).await;
    pools(&api).await;
    image_ops::images_and_templates(&api, &reg.addr).await;
    workspaces(&api).await;
    tasks(&api).await;

    // Every operation of the lifecycle, ember and system tags was answered with a 2xx.
    let seen = api.seen.lock().clone();
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
