//! Raw HTTP/1.1 to a daemon: one request written as given (`Connection:
//! close`), the whole answer read. For tests that choose headers no client
//! would send (a `Host`, the sandbox-router's).
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `request` ("METHOD /path") with `headers` (each "Name: value") and `body`
/// to `addr`; status, lowercased head and body (as sent: chunked stays so).
/// `hang` guards against a daemon that never answers, it is no threshold.
pub async fn exchange(
    addr: &str,
    request: &str,
    headers: &[String],
    body: &str,
    hang: Duration,
) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    let head =
        format!("{request} HTTP/1.1\r\nConnection: close\r\n{extra}Content-Length: {}\r\n\r\n{body}", body.len());
    s.write_all(head.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(hang, s.read_to_end(&mut raw)).await.expect("answer in time").expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head: {text:?}"));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{head}"));
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// One call with `key` (as `OPEN-SANDBOX-API-KEY`) to the daemon at `url`
/// (`http://host:port`), `body` sent as JSON: status and the answer's JSON
/// (`Null` when it is none).
pub async fn json_call(
    url: &str,
    key: &str,
    (method, path): (&str, &str),
    body: Option<serde_json::Value>,
    hang: Duration,
) -> (u16, serde_json::Value) {
    let addr = url.trim_start_matches("http://");
    let mut headers = vec![format!("Host: {addr}"), format!("OPEN-SANDBOX-API-KEY: {key}")];
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    if !body.is_empty() {
        headers.push("Content-Type: application/json".into());
    }
    let (status, _, text) = exchange(addr, &format!("{method} {path}"), &headers, &body, hang).await;
    (status, serde_json::from_str(&text).unwrap_or(serde_json::Value::Null))
}
