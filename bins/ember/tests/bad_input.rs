//! Absurd values from a request against a real daemon: every duration and count
//! is capped (ember_types::limits) and refused with a `{code, message}` 400,
//! never turned into a wrapped deadline; `--max-ttl` bounds every sandbox.
//! A request naming a `Host` the daemon does not answer to (DNS rebinding) is
//! a `{code, message}` 421.
mod common;

use common::Daemon;
use ember_client::ClientError;
use ember_types::api::{CreateSandboxRequest, SandboxInfo};
use ember_types::task::SubmitTaskRequest;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

fn at(s: &str) -> OffsetDateTime {
    OffsetDateTime::parse(s, &Rfc3339).unwrap_or_else(|e| panic!("{s:?} is not RFC 3339: {e}"))
}

/// Seconds from `createdAt` to `expiresAt`.
fn lifetime(s: &SandboxInfo) -> i64 {
    let exp = s.expires_at.as_deref().unwrap_or_else(|| panic!("sandbox {} has no expiresAt", s.id));
    (at(exp) - at(&s.created_at)).whole_seconds()
}

fn refused<T: std::fmt::Debug>(r: Result<T, ClientError>, code: &str, what: &str) {
    match r {
        Err(ClientError::Api { status, code: c, message }) => {
            assert_eq!((status, c.as_str()), (400, code), "{what}: {message}");
            assert!(!message.is_empty(), "{what}: empty message");
        }
        other => panic!("{what}: expected a 400 {code}, got {other:?}"),
    }
}

fn create_req(timeout: Option<u64>) -> CreateSandboxRequest {
    CreateSandboxRequest { template: Some("host".into()), timeout, ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_timeouts_and_counts_are_refused() {
    let d = Daemon::start();
    for t in [i64::MAX as u64, u64::MAX, 99_999_999_999_999, 0] {
        refused(
            d.client.create_sandbox(&create_req(Some(t))).await,
            "SANDBOX::INVALID_PARAMETER",
            &format!("timeout {t}"),
        );
    }
    // A sane timeout still expires after its creation, by that much.
    let (s, _) = d.client.create_sandbox(&create_req(Some(600))).await.expect("create with timeout 600");
    assert_eq!(lifetime(&s), 600, "{s:?}");
    d.client.delete_sandbox(&s.id).await.expect("delete");

    let task = |f: fn(&mut SubmitTaskRequest)| {
        let mut r = SubmitTaskRequest { command: vec!["true".into()], ..Default::default() };
        f(&mut r);
        r
    };
    type Mutate = fn(&mut SubmitTaskRequest);
    let bad_tasks: [(&str, Mutate); 5] = [
        ("timeout", |r| r.timeout = Some(u64::MAX)),
        ("timeout", |r| r.timeout = Some(i64::MAX as u64)),
        ("leaseMs", |r| r.lease_ms = Some(u64::MAX)),
        ("heartbeatMs", |r| r.heartbeat_ms = Some(u64::MAX)),
        ("attempts", |r| r.attempts = Some(u32::MAX)),
    ];
    for (what, f) in bad_tasks {
        refused(d.client.submit_task(&task(f)).await, "SANDBOX::INVALID_PARAMETER", what);
    }
    refused(d.client.fork_snapshot("s1", u32::MAX, "f").await, "SANDBOX::INVALID_PARAMETER", "fork count");
    // Found by the API fuzzer: a size past what the host filesystem can hold
    // was a 500 from truncate(2).
    for size in ["2045412870.2109M", "20Ti"] {
        refused(d.client.create_workspace("huge", size).await, "WORKSPACE::INVALID_PARAMETER", size);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_id_that_is_not_ascii_is_a_400() {
    let d = Daemon::start();
    // "snäp", percent-encoded as a client sends it.
    let id = "sn%C3%A4p";
    refused(d.client.get_snapshot(id).await, "SNAPSHOT::INVALID_ID", "get");
    refused(d.client.delete_snapshot(id).await, "SNAPSHOT::INVALID_ID", "delete");
    refused(d.client.fork_snapshot(id, 1, "f").await, "SNAPSHOT::INVALID_ID", "fork");
    refused(d.client.restore_snapshot(id, "w", None).await, "SNAPSHOT::INVALID_ID", "restore");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_ttl_bounds_a_sandbox_created_without_timeout() {
    let d = Daemon::start_with(&["--max-ttl", "10m"]);
    let (s, _) = d.client.create_sandbox(&create_req(None)).await.expect("create without timeout");
    assert_eq!(lifetime(&s), 600, "{s:?}");
    refused(d.client.create_sandbox(&create_req(Some(601))).await, "SANDBOX::INVALID_PARAMETER", "timeout 601");
    // A task's sandbox outlives the task by its grace: the task timeout is
    // capped below --max-ttl by that much, so its sandbox can start.
    let mut t = SubmitTaskRequest { command: vec!["true".into()], timeout: Some(600), ..Default::default() };
    refused(d.client.submit_task(&t).await, "SANDBOX::INVALID_PARAMETER", "task timeout 600");
    t.timeout = Some(480);
    d.client.submit_task(&t).await.expect("task timeout 480");
    d.client.delete_sandbox(&s.id).await.expect("delete");
}

/// The status line and body of `GET /health` sent raw with `Host: host`.
async fn get_with_host(url: &str, host: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = url.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    (head.lines().next().unwrap_or("").to_string(), body.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_host_is_refused() {
    let d = Daemon::start_with(&["--allowed-host", "ember.test"]);
    let port = d.url.rsplit(':').next().unwrap().to_string();
    for host in ["evil.example", &format!("rebind.example:{port}"), "127.0.0.1.nip.io"] {
        let (status, body) = get_with_host(&d.url, host).await;
        assert!(status.contains(" 421 "), "{host}: {status}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{host}: {body:?}: {e}"));
        assert_eq!(v["code"], "GENERAL::MISDIRECTED_HOST", "{host}");
        assert!(v["message"].as_str().unwrap_or("").contains("--allowed-host"), "{body}");
    }
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("ember.test:{port}")] {
        let (status, _) = get_with_host(&d.url, &host).await;
        assert!(status.contains(" 200 "), "{host}: {status}");
    }
}
