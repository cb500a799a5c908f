//! A hostile agent: what root inside an OCI sandbox can put in place of the
//! agent's socket. Each scenario serves a reply that never ends, or ends too
//! slowly, and checks that the exchange ends with the error naming the cap or
//! deadline it hit, and that this process's memory stays flat although the
//! peer offers far more than any cap.
use ember_agent_client::{AgentClient, AgentError};
use ember_types::execd::RunCommandRequest;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// What a hostile peer offers after its prefix: far beyond every cap, so a
/// reader that buffers it would grow by this much.
const OFFERED: usize = 256 << 20;

/// A fake agent that answers every connection with `prefix`, then `filler`
/// repeated until `OFFERED` bytes went out or the client hung up. Returns the
/// socket and the count of bytes written.
async fn serve(dir: &Path, prefix: &'static [u8], filler: &'static [u8]) -> (PathBuf, Arc<AtomicUsize>) {
    let sent = Arc::new(AtomicUsize::new(0));
    let count = sent.clone();
    let sock = listen(dir, move |mut s| {
        let count = count.clone();
        async move {
            if s.write_all(prefix).await.is_err() {
                return;
            }
            let block = filler.repeat((64 << 10) / filler.len());
            while count.load(Ordering::Relaxed) < OFFERED {
                if s.write_all(&block).await.is_err() {
                    return;
                }
                count.fetch_add(block.len(), Ordering::Relaxed);
            }
        }
    });
    (sock, sent)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn tempdir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ember-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn command() -> RunCommandRequest {
    RunCommandRequest { argv: Some(vec!["true".into()]), ..Default::default() }
}

async fn ping(c: AgentClient) -> Result<(), AgentError> {
    c.ping().await
}

async fn run(c: AgentClient) -> Result<(), AgentError> {
    c.run_command(&command(), Duration::from_secs(60), |_| {}).await.map(drop)
}

/// A fake agent at `dir/agent.sock` that reads each request and hands the
/// connection to `reply`.
fn listen<F, Fut>(dir: &Path, reply: F) -> PathBuf
where
    F: Fn(UnixStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let sock = dir.join("agent.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.read(&mut [0u8; 4096]).await;
            tokio::spawn(reply(s));
        }
    });
    sock
}

/// Runs `call` against a fake agent serving `prefix` + endless `filler`, and
/// returns its error, after checking the peer was cut off well before it was
/// done and memory did not grow with what it offered.
async fn cut_off<F, Fut>(name: &str, prefix: &'static [u8], filler: &'static [u8], call: F) -> AgentError
where
    F: FnOnce(AgentClient) -> Fut,
    Fut: std::future::Future<Output = Result<(), AgentError>>,
{
    let dir = tempdir(name);
    let (sock, sent) = serve(&dir, prefix, filler).await;
    let before = rss_kib();
    let err = call(AgentClient::new(&sock).with_timeout(Duration::from_secs(60))).await.expect_err(name);
    let grown = rss_kib().saturating_sub(before);
    let sent = sent.load(Ordering::Relaxed);
    assert!(sent < OFFERED, "{name}: the client read all {sent} bytes the peer offered");
    assert!(grown < 32 << 10, "{name}: RSS grew by {grown} KiB while the peer offered {OFFERED} bytes");
    let _ = std::fs::remove_dir_all(&dir);
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_head_is_cut_at_the_head_cap() {
    let err = cut_off("head", b"HTTP/1.1 200 OK\r\nX-Endless: ", b"a", ping).await;
    assert!(matches!(err, AgentError::HeadTooLarge { .. }), "{}", err.report());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_error_body_is_cut_at_the_body_cap() {
    let prefix = b"HTTP/1.1 500 Internal Server Error\r\nConnection: close\r\n\r\n";
    let err = cut_off("body", prefix, b"oops ", ping).await;
    assert!(matches!(err, AgentError::BodyTooLarge { .. }), "{}", err.report());
    let err = cut_off("body-cmd", prefix, b"oops ", run).await;
    assert!(matches!(err, AgentError::BodyTooLarge { .. }), "{}", err.report());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_event_line_is_cut_at_the_frame_cap() {
    let prefix = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{\"type\":\"stdout\",\"text\":\"";
    let err = cut_off("line", prefix, b"a", run).await;
    assert!(matches!(err, AgentError::FrameTooLarge { .. }), "{}", err.report());
}

/// A peer that trickles its head one byte at a time never completes it: the
/// exchange ends at its deadline, for a ping and for a command's head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_loris_head_ends_at_the_deadline() {
    let dir = tempdir("loris");
    let sock = listen(&dir, |mut s| async move {
        for b in b"HTTP/1.1 200 OK\r\nX: ".iter().chain(std::iter::repeat(&b'a')) {
            if s.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let client = AgentClient::new(&sock).with_timeout(Duration::from_millis(500));
    let err = client.ping().await.expect_err("a head that never completes");
    assert!(matches!(err, AgentError::Timeout { step: "reply", .. }), "{}", err.report());
    let err = client.run_command(&command(), Duration::from_secs(60), |_| {}).await.expect_err("no head");
    assert!(matches!(err, AgentError::Timeout { step: "reply head", .. }), "{}", err.report());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A peer that sends a head and then keeps the stream alive with blank
/// lines, never a verdict: the command ends at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_a_verdict_ends_at_the_deadline() {
    let dir = tempdir("verdict");
    let sock = listen(&dir, |mut s| async move {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n").await;
        while s.write_all(b"\n").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let client = AgentClient::new(&sock);
    let err = client.run_command(&command(), Duration::from_millis(500), |_| {}).await.expect_err("no verdict");
    assert!(matches!(err, AgentError::Timeout { step: "command verdict", .. }), "{}", err.report());
    let _ = std::fs::remove_dir_all(&dir);
}
