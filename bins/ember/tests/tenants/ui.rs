//! The dashboard under a tenant's key: its session is that tenant's, so its
//! snapshot shows the tenant's sandboxes alone, another tenant's sandbox is
//! a 404 on the dashboard's routes too, and its calls are audited as the
//! tenant's.
use super::{call, create_sandbox, tenant, ADMIN, HANG};
use crate::common::{raw, Daemon};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

/// The session cookie (`ember_ui=...`) of a login with `key`.
async fn login(addr: &str, key: &str) -> String {
    let h = ["Content-Type: application/x-www-form-urlencoded".to_string(), format!("Host: {addr}")];
    let (status, head, _) = raw::exchange(addr, "POST /ui/login", &h, &format!("key={key}"), HANG).await;
    assert_eq!(status, 303, "{head}");
    let line = head.lines().find_map(|l| l.strip_prefix("set-cookie: ")).expect("cookie");
    line.split(';').next().expect("cookie value").to_string()
}

/// The first snapshot `/ui/events` sends to `cookie`'s session.
async fn first_snapshot(addr: &str, cookie: &str) -> Value {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET /ui/events HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(data) = text.lines().find_map(|l| l.strip_prefix("data: ")) {
            if let Ok(v) = serde_json::from_str(data) {
                return v;
            }
        }
        let n = tokio::time::timeout(HANG, s.read(&mut buf)).await.expect("an event in time").expect("read");
        assert!(n > 0, "the stream ended: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

async fn ui_call(addr: &str, cookie: &str, req: &str) -> u16 {
    let h = [format!("Host: {addr}"), format!("Cookie: {cookie}"), "Content-Type: application/json".into()];
    raw::exchange(addr, req, &h, "{}", HANG).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_dashboard_session_sees_and_touches_its_own_alone() {
    let d = Daemon::start_with(&["--ui", "--api-key", ADMIN]);
    let addr = d.url.trim_start_matches("http://").to_string();
    let a = tenant(&d, "ua", json!({})).await;
    let b = tenant(&d, "ub", json!({})).await;
    let mine = create_sandbox(&d, &a, json!({})).await.1["id"].as_str().expect("id").to_string();
    let theirs = create_sandbox(&d, &b, json!({})).await.1["id"].as_str().expect("id").to_string();
    let cookie = login(&addr, &a).await;
    let snap = first_snapshot(&addr, &cookie).await;
    let ids: Vec<&str> =
        snap["sandboxes"].as_array().expect("sandboxes").iter().filter_map(|s| s["id"].as_str()).collect();
    assert_eq!(ids, [mine.as_str()], "{snap}");
    assert_eq!(ui_call(&addr, &cookie, &format!("GET /ui/sandboxes/{mine}/boundary")).await, 200);
    assert_eq!(ui_call(&addr, &cookie, &format!("GET /ui/sandboxes/{theirs}/boundary")).await, 404);
    assert_eq!(ui_call(&addr, &cookie, &format!("POST /ui/sandboxes/{theirs}/pty")).await, 404);
    let opened = ui_call(&addr, &cookie, &format!("POST /ui/sandboxes/{mine}/pty")).await;
    assert!((200..300).contains(&opened), "{opened}");
    assert_eq!(ui_call(&addr, &cookie, "GET /ui/reports/x.md").await, 403);
    // The admin's session sees both.
    let admin = login(&addr, ADMIN).await;
    let snap = first_snapshot(&addr, &admin).await;
    assert_eq!(snap["sandboxes"].as_array().map(Vec::len), Some(2), "{snap}");
    // The pty calls are the tenant's in the audit log.
    let (_, log) = call(&d, ADMIN, "GET", "/v1/audit?tenant=ua", None).await;
    let ptys: Vec<u64> = log["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["action"] == "sandbox.pty")
        .filter_map(|r| r["status"].as_u64())
        .collect();
    assert_eq!(ptys, [404, u64::from(opened)], "{log}");
}

/// A session ends with the key it logged in with: once the key is revoked
/// its event stream and its terminal, open before, end, and its calls are
/// 401s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dashboard_session_ends_with_its_key() {
    let d = Daemon::start_with(&["--ui", "--api-key", ADMIN]);
    let addr = d.url.trim_start_matches("http://").to_string();
    let a = tenant(&d, "ur", json!({})).await;
    let mine = create_sandbox(&d, &a, json!({})).await.1["id"].as_str().expect("id").to_string();
    let cookie = login(&addr, &a).await;
    // The stream, open: its first snapshot read, then left reading.
    let mut s = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let req = format!("GET /ui/events HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    while !String::from_utf8_lossy(&got).contains("data: ") {
        let n = tokio::time::timeout(HANG, s.read(&mut buf)).await.expect("an event in time").expect("read");
        assert!(n > 0, "the stream ended before its first event");
        got.extend_from_slice(&buf[..n]);
    }
    let mut term = open_terminal(&addr, &cookie, &mine).await;
    let boundary = format!("GET /ui/sandboxes/{mine}/boundary");
    assert_eq!(ui_call(&addr, &cookie, &boundary).await, 200);
    let (_, t) = call(&d, ADMIN, "GET", "/v1/tenants/ur", None).await;
    let prefix = t["keys"][0]["prefix"].as_str().expect("prefix").to_string();
    assert_eq!(call(&d, ADMIN, "DELETE", &format!("/v1/tenants/ur/keys/{prefix}"), None).await.0, 204);
    assert_eq!(ui_call(&addr, &cookie, &boundary).await, 401, "the session outlived its key");
    assert_eq!(ui_call(&addr, &cookie, &format!("POST /ui/sandboxes/{mine}/pty")).await, 401);
    // The open stream ends (the server closes it: `Connection: close`).
    loop {
        let n = tokio::time::timeout(HANG, s.read(&mut buf)).await.expect("the stream to end").expect("read");
        if n == 0 {
            break;
        }
    }
    // So does the terminal's WebSocket (it was spliced through before).
    loop {
        match tokio::time::timeout(HANG, term.next()).await.expect("the terminal to close with its key") {
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
            Some(Ok(_)) => {}
        }
    }
}

type Terminal = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A PTY session in sandbox `id` through the dashboard, its WebSocket open
/// and its `connected` frame read.
async fn open_terminal(addr: &str, cookie: &str, id: &str) -> Terminal {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let h = [format!("Host: {addr}"), format!("Cookie: {cookie}"), "Content-Type: application/json".into()];
    let (status, _, body) = raw::exchange(addr, &format!("POST /ui/sandboxes/{id}/pty"), &h, "{}", HANG).await;
    assert_eq!(status, 201, "{body}");
    let sid = serde_json::from_str::<Value>(&body).expect("json")["session_id"].as_str().expect("sid").to_string();
    let mut req = format!("ws://{addr}/ui/sandboxes/{id}/pty/{sid}/ws").into_client_request().expect("request");
    req.headers_mut().insert("cookie", cookie.parse().expect("cookie header"));
    let (mut ws, _) = tokio::time::timeout(HANG, tokio_tungstenite::connect_async(req))
        .await
        .expect("connect hung")
        .expect("the terminal's upgrade");
    loop {
        match tokio::time::timeout(HANG, ws.next()).await.expect("a frame in time") {
            Some(Ok(Message::Text(t))) if t.contains("connected") => return ws,
            Some(Ok(_)) => {}
            other => panic!("the terminal ended before it connected: {other:?}"),
        }
    }
}
