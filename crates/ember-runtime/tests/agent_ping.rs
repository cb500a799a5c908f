//! The readiness ping against a peer that is not our agent (what root inside
//! an OCI sandbox can bind in place of the agent's socket).
use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::time::Duration;

/// A "200" status line followed by a header that never ends is no ready
/// agent: the ping fails at the head cap instead of reading the status and
/// calling the sandbox ready.
#[test]
fn a_ping_answered_by_an_endless_head_fails_at_the_head_cap() {
    let dir = std::env::temp_dir().join(format!("ember-ping-head-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("agent.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let _ = s.read(&mut [0u8; 4096]);
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nX-Endless: ");
        let block = [b'a'; 64 << 10];
        for _ in 0..1024 {
            if s.write_all(&block).is_err() {
                return;
            }
        }
    });
    let err = ember_runtime::ping_agent(&sock, Duration::from_secs(30)).expect_err("an endless head is not ready");
    assert!(err.contains("head exceeds"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
