//! kubernetes-sigs/agent-sandbox's sandbox-router header contract on `ember
//! serve` (crates/ember-api/src/agent_sandbox.rs), without Kubernetes: a real
//! keyed daemon, a real sandbox carrying the metadata the operator writes for
//! a claim, raw HTTP with the router's headers. Under the API key; the
//! Sandbox found by namespace and name only; `POST /execute` on the runtime's
//! port answered through the agent, its output capped; other ports proxied;
//! every refusal a `{code, message}`.
mod common;

use common::Daemon;
use ember_types::agent_sandbox::{NAMESPACE_KEY, SANDBOX_KEY};
use serde_json::Value;
use std::time::Duration;

/// A guard against a hang, not a performance threshold.
const HANG: Duration = Duration::from_secs(120);
const KEY: &str = "k3y";

/// Answers every GET with its path, on 8080 in the sandbox.
const SERVER: &str = r#"
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"GET {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 8080), H).serve_forever()
"#;

/// One request with the router's headers: status and body (dechunked).
async fn send(addr: &str, req: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut all = vec![format!("Host: {addr}"), "Content-Type: application/json".to_string()];
    all.extend(headers.iter().map(|(k, v)| format!("{k}: {v}")));
    let (status, head, body) = common::raw::exchange(addr, req, &all, body, HANG).await;
    // The body may be chunked: the tests read JSON or short text out of it.
    (status, if head.contains("transfer-encoding: chunked") { dechunk(&body) } else { body })
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

fn code(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert!(v["message"].is_string(), "{v}");
    v["code"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_headers_reach_the_claimed_sandbox_under_the_api_key() {
    let mut d = Daemon::start_with(&["--api-key", KEY]);
    d.client = ember_client::Client::new(&d.url, Some(KEY.into())).expect("client");
    let sb = d
        .create(|r| {
            r.entrypoint = Some(["python3", "-c", SERVER].map(String::from).to_vec());
            r.metadata = Some([(NAMESPACE_KEY.into(), "team".into()), (SANDBOX_KEY.into(), "sb1".into())].into());
        })
        .await;
    let addr = d.url.strip_prefix("http://").expect("http url").to_string();
    let route = [("X-Sandbox-ID", "sb1"), ("X-Sandbox-Namespace", "team"), ("OPEN-SANDBOX-API-KEY", KEY)];
    let exec = |cmd: &str| serde_json::json!({ "command": cmd }).to_string();

    // The key is the API's: without it, nothing is routed.
    let (status, body) = send(&addr, "POST /execute", &route[..2], &exec("true")).await;
    assert_eq!((status, code(&body).as_str()), (401, "MISSING_API_KEY"));

    let (status, body) = send(&addr, "POST /execute", &route, &exec("echo hi; echo err >&2; exit 4")).await;
    assert_eq!(status, 200, "{body}");
    let out: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (out["stdout"].as_str(), out["stderr"].as_str(), out["exit_code"].as_i64()),
        (Some("hi\n"), Some("err\n"), Some(4))
    );

    // The same name in another namespace is another Sandbox: none.
    let other = [("X-Sandbox-ID", "sb1"), ("X-Sandbox-Namespace", "default"), ("OPEN-SANDBOX-API-KEY", KEY)];
    let (status, body) = send(&addr, "POST /execute", &other, &exec("true")).await;
    assert_eq!((status, code(&body).as_str()), (404, "SANDBOX::NOT_FOUND"), "{body}");
    let bad_port = [route[0], route[1], route[2], ("X-Sandbox-Port", "http")];
    let (status, body) = send(&addr, "POST /execute", &bad_port, &exec("true")).await;
    assert_eq!((status, code(&body).as_str()), (400, "SANDBOX::INVALID_PARAMETER"), "{body}");
    let (status, body) = send(&addr, "GET /nope", &route, "").await;
    assert_eq!((status, code(&body).as_str()), (404, "GENERAL::NOT_FOUND"), "{body}");
    let (status, body) = send(&addr, "POST /execute", &route, "{\"cmd\": 1}").await;
    assert_eq!((status, code(&body).as_str()), (400, "SANDBOX::INVALID_PARAMETER"), "{body}");

    files(&addr, &route).await;

    // Another port is the sandbox's own, through the proxy.
    let web = [route[0], route[1], route[2], ("X-Sandbox-Port", "8080")];
    let mut answer = (0, String::new());
    for _ in 0..300 {
        answer = send(&addr, "GET /hello?x=1", &web, "").await;
        if answer.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(answer, (200, "GET /hello?x=1".to_string()));

    // Output past the cap is dropped, not held: 17 MiB written, at most 16 kept.
    let (status, body) = send(&addr, "POST /execute", &route, &exec("yes 0123456789abcde | head -c 17825792")).await;
    assert_eq!(status, 200);
    let out: Value = serde_json::from_str(&body).expect("json");
    let kept = out["stdout"].as_str().map_or(0, str::len);
    assert!(kept > 0 && kept <= 16 << 20, "{kept} bytes kept");
    assert_eq!(out["exit_code"].as_i64(), Some(0));
    drop(sb);
}

/// The runtime's file routes, as its Python client sends them: a multipart
/// `/upload` whose filename is the path, then `/download/`, `/exists/` and
/// `/list/` of the path as one percent-encoded segment; the file is where
/// `/execute`'s commands see it.
async fn files(addr: &str, route: &[(&str, &str)]) {
    let form = "--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"notes/a.txt\"\r\n\
                Content-Type: application/octet-stream\r\n\r\nfile body\r\n--b0undary--\r\n";
    let mut headers = vec![format!("Host: {addr}"), "Content-Type: multipart/form-data; boundary=b0undary".into()];
    headers.extend(route.iter().map(|(k, v)| format!("{k}: {v}")));
    let (status, _, body) = common::raw::exchange(addr, "POST /upload", &headers, form, HANG).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = send(addr, "GET /download/notes%2Fa.txt", route, "").await;
    assert_eq!((status, body.as_str()), (200, "file body"));
    let (status, body) = send(addr, "GET /download/notes%2Fnone.txt", route, "").await;
    assert_eq!(status, 404, "{body}");
    let (_, body) = send(addr, "GET /exists/notes%2Fa.txt", route, "").await;
    assert_eq!(serde_json::from_str::<Value>(&body).expect("json")["exists"], true, "{body}");
    let (_, body) = send(addr, "GET /exists/notes%2Fnone.txt", route, "").await;
    assert_eq!(serde_json::from_str::<Value>(&body).expect("json")["exists"], false, "{body}");
    let (status, body) = send(addr, "GET /list/notes", route, "").await;
    assert_eq!(status, 200, "{body}");
    let list: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (list[0]["name"].as_str(), list[0]["type"].as_str(), list[0]["size"].as_i64()),
        (Some("a.txt"), Some("file"), Some(9))
    );
    assert!(list[0]["mod_time"].as_f64().is_some_and(|t| t > 1.7e9), "{list}");
    let exec = serde_json::json!({ "command": "cat notes/a.txt" }).to_string();
    let (_, body) = send(addr, "POST /execute", route, &exec).await;
    assert_eq!(serde_json::from_str::<Value>(&body).expect("json")["stdout"], "file body\n", "{body}");
}
