//! Sandbox web content never runs on the API's origin (issue 14 §1): the path
//! route's pages get a sandboxing `Content-Security-Policy`, and with
//! `ember serve --sandbox-domain` a port's own host name reaches that port
//! whole (paths like `/v1/...` included), never the API's routes. A real
//! daemon, a real sandbox running a Python server, raw HTTP with chosen `Host`s.
mod common;

use common::Daemon;
use futures_util::StreamExt;
use serde_json::Value;
use std::time::Duration;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// A guard against a hang, not a performance threshold.
const HANG: Duration = Duration::from_secs(30);
const KEY: &str = "k3y";
const DOMAIN: &str = "sb.test";
/// ember-api's `PATH_ROUTE_CSP`, spelled out: the test checks the wire.
const CSP: &str = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads";

/// Echoes method, path and body, with a policy of its own the path route must
/// replace; `/cookie` echoes the `Cookie` it got and sets one.
const SERVER: &str = r#"
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def reply(self, body):
        if self.path == "/cookie":
            body = "cookie=" + str(self.headers.get("Cookie"))
        body = f"{self.command} {self.path} {body}".encode()
        self.send_response(200)
        self.send_header("Content-Security-Policy", "default-src *; report-uri http://collector.test/r")
        if self.path == "/cookie":
            self.send_header("Set-Cookie", "session=from-the-sandbox; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.reply("")
    def do_POST(self):
        self.reply(self.rfile.read(int(self.headers["Content-Length"])).decode())
http.server.HTTPServer(("127.0.0.1", 8080), H).serve_forever()
"#;

/// One request with `Connection: close` to the daemon at `addr`, naming
/// `host`; `key` sent as the API key. Returns status, lowercased head, body.
async fn send(addr: &str, host: &str, req: &str, key: Option<&str>, body: &str) -> (u16, String, String) {
    send_with(addr, host, req, "", key, body).await
}

/// [`send`] with `extra` header lines (each ending in `\r\n`).
async fn send_with(
    addr: &str,
    host: &str,
    req: &str,
    extra: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let mut headers = vec![format!("Host: {host}")];
    headers.extend(key.map(|k| format!("OPEN-SANDBOX-API-KEY: {k}")));
    headers.extend(extra.split("\r\n").filter(|l| !l.is_empty()).map(str::to_string));
    common::raw::exchange(addr, req, &headers, body, HANG).await
}

fn csp_values(head: &str) -> Vec<&str> {
    head.lines().filter_map(|l| l.strip_prefix("content-security-policy: ")).collect()
}

struct Fixture {
    d: Daemon,
    addr: String,
    id: String,
}

/// A keyed daemon with `--sandbox-domain`, one sandbox serving [`SERVER`] on 8080.
async fn fixture() -> Fixture {
    let mut d = Daemon::start_with(&["--api-key", KEY, "--sandbox-domain", DOMAIN]);
    d.client = ember_client::Client::new(&d.url, Some(KEY.into())).expect("client");
    let sb = d.create(|r| r.entrypoint = Some(["python3", "-c", SERVER].map(String::from).to_vec())).await;
    let addr = d.url.strip_prefix("http://").expect("http url").to_string();
    let path = format!("GET /v1/sandboxes/{}/proxy/8080/up", sb.id);
    // The server starts with the sandbox; until it listens the proxy answers 502.
    for _ in 0..300 {
        if send(&addr, &addr, &path, Some(KEY), "").await.0 == 200 {
            return Fixture { d, addr, id: sb.id };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the sandbox's server never answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_route_pages_run_as_an_opaque_origin_and_ports_have_origins_of_their_own() {
    let Fixture { d, addr, id } = fixture().await;
    let own = format!("8080-{id}.{DOMAIN}:{}", addr.rsplit_once(':').unwrap().1);

    // The path route: our policy alone, the sandbox's replaced.
    let (status, head, body) =
        send(&addr, &addr, &format!("GET /v1/sandboxes/{id}/proxy/8080/p?q=1"), Some(KEY), "").await;
    assert_eq!((status, body.as_str()), (200, "GET /p?q=1 "), "{head}");
    assert_eq!(csp_values(&head), [CSP], "{head}");
    // An error of the path route is on the API's origin too.
    let (status, head, _) = send(&addr, &addr, &format!("GET /v1/sandboxes/{id}/proxy/8081/x"), Some(KEY), "").await;
    assert_eq!((status, csp_values(&head)), (502, vec![CSP]), "{head}");

    // The port's own name: the whole request is the sandbox's, `/v1/...` included.
    let (status, head, body) = send(&addr, &own, "GET /v1/sandboxes?x=y", Some(KEY), "").await;
    assert_eq!((status, body.as_str()), (200, "GET /v1/sandboxes?x=y "), "{head}");
    assert_eq!(csp_values(&head), ["default-src *; report-uri http://collector.test/r"], "the sandbox's own policy");
    let (status, _, body) = send(&addr, &own, "POST /form", Some(KEY), "a=1&b=2").await;
    assert_eq!((status, body.as_str()), (200, "POST /form a=1&b=2"));
    // The same key rule as the path route; `/health` is the sandbox's, so keyed too.
    for path in ["GET /", "GET /health"] {
        let (status, _, body) = send(&addr, &own, path, None, "").await;
        assert_eq!(status, 401, "{path}: {body}");
        assert!(body.contains("MISSING_API_KEY"), "{body}");
    }
    // The agent's private routes stay the daemon's, however spelled.
    let execd = format!("44772-{id}.{DOMAIN}");
    for req in ["POST /ember/v1/claim", "POST /%65mber/v1/claim", "POST //ember/v1/claim"] {
        let (status, _, body) = send(&addr, &execd, req, Some(KEY), "{}").await;
        assert_eq!(status, 404, "{req}: {body}");
        assert!(body.contains("GENERAL::NOT_FOUND"), "the daemon refuses {req}, not the agent: {body}");
    }

    // Names that are no sandbox port of this server.
    for host in ["evil.test", DOMAIN, &format!("8080-{id}.other.test"), &format!("8080-{id}.{DOMAIN}.evil.test")] {
        let (status, _, body) = send(&addr, host, "GET /v1/sandboxes", Some(KEY), "").await;
        assert_eq!(status, 421, "{host}: {body}");
        assert!(body.contains("GENERAL::MISDIRECTED_HOST"), "{body}");
    }
    let unknown = format!("8080-00000000-0000-4000-8000-000000000000.{DOMAIN}");
    assert_eq!(send(&addr, &unknown, "GET /", Some(KEY), "").await.0, 404);

    // Endpoints: the port's origin, but execd's stays on the path route for the SDKs.
    let ep = |port: u16| {
        let (addr, id) = (addr.clone(), id.clone());
        async move {
            let (s, _, b) =
                send(&addr, &addr, &format!("GET /v1/sandboxes/{id}/endpoints/{port}"), Some(KEY), "").await;
            assert_eq!(s, 200, "{b}");
            serde_json::from_str::<Value>(&b).unwrap()["endpoint"].as_str().unwrap().to_string()
        }
    };
    assert_eq!(ep(8080).await, own);
    assert_eq!(ep(44772).await, format!("{addr}/v1/sandboxes/{id}/proxy/44772"));
    drop(d);
}

/// Every sandbox shares the API's host for cookies on the path route, so
/// there neither the browser's cookies reach the sandbox nor does a cookie
/// the sandbox sets reach the browser; a port's own origin keeps both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_path_route_neither_forwards_nor_sets_cookies() {
    let Fixture { d, addr, id } = fixture().await;
    let own = format!("8080-{id}.{DOMAIN}:{}", addr.rsplit_once(':').unwrap().1);
    let cookie = "Cookie: other=from-another-sandbox\r\n";
    let path = format!("GET /v1/sandboxes/{id}/proxy/8080/cookie");
    let (status, head, body) = send_with(&addr, &addr, &path, cookie, Some(KEY), "").await;
    assert_eq!((status, body.as_str()), (200, "GET /cookie cookie=None"), "{head}");
    assert!(!head.contains("set-cookie"), "{head}");
    let (status, head, body) = send_with(&addr, &own, "GET /cookie", cookie, Some(KEY), "").await;
    assert_eq!((status, body.as_str()), (200, "GET /cookie cookie=other=from-another-sandbox"), "{head}");
    assert!(head.contains("set-cookie: session=from-the-sandbox"), "{head}");
    drop(d);
}

/// A WebSocket (execd's PTY) through the port's own name, and through the
/// path route, where the 101 carries no policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_goes_through_a_sandbox_origin() {
    let Fixture { d, addr, id } = fixture().await;
    let execd = format!("44772-{id}.{DOMAIN}");
    let routes = [(execd.clone(), String::new()), (addr.clone(), format!("/v1/sandboxes/{id}/proxy/44772"))];
    for (host, base) in routes {
        let (status, _, body) = send(&addr, &host, &format!("POST {base}/pty"), Some(KEY), r#"{"cwd":"/tmp"}"#).await;
        assert_eq!(status, 201, "{host}: {body}");
        let sid = serde_json::from_str::<Value>(&body).unwrap()["session_id"].as_str().unwrap().to_string();
        let mut req = format!("ws://{host}{base}/pty/{sid}/ws").into_client_request().expect("ws request");
        req.headers_mut().insert("open-sandbox-api-key", KEY.parse().unwrap());
        let tcp = tokio::net::TcpStream::connect(&addr).await.expect("connect");
        let (mut ws, resp) = tokio::time::timeout(HANG, tokio_tungstenite::client_async(req, tcp))
            .await
            .expect("upgrade hung")
            .unwrap_or_else(|e| panic!("upgrade via {host}: {e}"));
        assert!(resp.headers().get("content-security-policy").is_none(), "{host}: {:?}", resp.headers());
        let first = tokio::time::timeout(HANG, ws.next()).await.expect("no frame in time");
        let Some(Ok(Message::Text(t))) = first else { panic!("{host}: {first:?}") };
        let v: Value = serde_json::from_str(t.as_str()).unwrap();
        assert_eq!(v["type"], "connected", "{host}: {v}");
    }
    drop(d);
}
