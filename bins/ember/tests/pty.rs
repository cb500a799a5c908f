//! An execd PTY session through `ember serve`'s proxy (daemon → agent socket →
//! agent), with a real WebSocket client: the upgrade is spliced through both
//! hops, and frames flow both ways on a real terminal inside the sandbox.
mod common;

use common::Daemon;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

/// A guard against a hang, not a performance threshold.
const HANG: Duration = Duration::from_secs(30);

/// One request with `Connection: close`; returns status and body.
async fn http(base: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let addr = base.strip_prefix("http://").expect("http url");
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("status line");
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_session_through_the_proxy() {
    let d = Daemon::start();
    let sb = d.create(|_| {}).await;
    let base = format!("/v1/sandboxes/{}/proxy/44772", sb.id);
    let (status, body) = http(&d.url, "POST", &format!("{base}/pty"), r#"{"cwd":"/tmp/term"}"#).await;
    assert_eq!(status, 201, "{body}");
    let sid = serde_json::from_str::<Value>(&body).unwrap()["session_id"].as_str().unwrap().to_string();

    let ws_url = format!("{}{base}/pty/{sid}/ws", d.url.replacen("http://", "ws://", 1));
    let (mut ws, _) = tokio::time::timeout(HANG, tokio_tungstenite::connect_async(ws_url.as_str()))
        .await
        .expect("connect hung")
        .expect("upgrade through the proxy");
    ws.send(Message::Binary(b"\x00echo in-$((6*7)) $(pwd) $(hostname); tty\n".to_vec().into())).await.unwrap();
    let mut seen = String::new();
    let mut connected = false;
    while !seen.contains("/dev/pts/") || !seen.contains("in-42 /tmp/term") {
        match tokio::time::timeout(HANG, ws.next()).await.expect("no frame in time") {
            Some(Ok(Message::Binary(b))) if b[0] == 1 => seen.push_str(&String::from_utf8_lossy(&b[1..])),
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                connected |= v["type"] == "connected" && v["mode"] == "pty";
            }
            Some(Ok(_)) => {}
            other => panic!("the stream ended after {seen:?}: {other:?}"),
        }
    }
    assert!(connected, "the connected frame came through");

    // The 409 of a second client comes back through the proxy as JSON.
    match tokio_tungstenite::connect_async(ws_url.as_str()).await {
        Err(WsError::Http(r)) => assert_eq!(r.status().as_u16(), 409),
        other => panic!("expected 409, got {:?}", other.map(|_| ())),
    }
    ws.send(Message::Text(r#"{"type":"stdin","data":"exit 5\n"}"#.into())).await.unwrap();
    let code = loop {
        match tokio::time::timeout(HANG, ws.next()).await.expect("no frame in time") {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                if v["type"] == "exit" {
                    break v["exit_code"].as_i64();
                }
            }
            Some(Ok(_)) => {}
            other => panic!("closed before the exit frame: {other:?}"),
        }
    };
    assert_eq!(code, Some(5));
    let (status, body) = http(&d.url, "GET", &format!("{base}/pty/{sid}"), "").await;
    let st: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, st["running"].as_bool()), (200, Some(false)));
    assert!(st["output_offset"].as_u64().unwrap() > 0);
    assert_eq!(http(&d.url, "DELETE", &format!("{base}/pty/{sid}"), "").await.0, 200);
    assert_eq!(http(&d.url, "GET", &format!("{base}/pty/{sid}"), "").await.0, 404);
}

/// The headers a server saw, as JSON, with `Connection: X-Resp-Hop` and an
/// `X-Resp-Hop` header of its own on the reply.
const ECHO_SERVER: &str = r#"
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
        self.send_response(200)
        self.send_header("Connection", "X-Resp-Hop")
        self.send_header("X-Resp-Hop", "reply-secret")
        self.send_header("X-Resp-Keep", "yes")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", 8080), H).serve_forever()
"#;

/// RFC 9110 §7.6.1: a header the `Connection` header names is hop-by-hop and
/// stops at each proxy (daemon and agent), in both directions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_named_by_connection_stop_at_each_proxy_hop() {
    let d = Daemon::start();
    let sb = d.create(|r| r.entrypoint = Some(["python3", "-c", ECHO_SERVER].map(String::from).to_vec())).await;
    let addr = d.url.strip_prefix("http://").expect("http url").to_string();
    let get = || async {
        let mut s = tokio::net::TcpStream::connect(&addr).await.expect("connect");
        let head = format!(
            "GET /v1/sandboxes/{}/proxy/8080/h HTTP/1.1\r\nHost: {addr}\r\nConnection: close, X-Hop\r\n\
             X-Hop: request-secret\r\nX-Keep: yes\r\n\r\n",
            sb.id
        );
        s.write_all(head.as_bytes()).await.expect("write");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.expect("read");
        String::from_utf8_lossy(&raw).into_owned()
    };
    // The server starts with the sandbox; until it listens the proxy answers 502.
    let mut reply = String::new();
    for _ in 0..300 {
        reply = tokio::time::timeout(HANG, get()).await.expect("proxy answers");
        if reply.split(' ').nth(1) == Some("200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no 200 from the server: {reply}"));
    let head = head.to_ascii_lowercase();
    assert_eq!(head.split(' ').nth(1), Some("200"), "{reply}");
    let seen: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(seen["x-keep"], "yes", "an end-to-end header reaches the server: {seen}");
    assert!(seen.get("x-hop").is_none(), "a header named by Connection was forwarded: {seen}");
    assert!(head.contains("x-resp-keep: yes"), "{head}");
    assert!(!head.contains("reply-secret"), "a reply header named by Connection came back: {head}");
}
