//! Idle auto-pause (`autoPause: {afterSeconds}`): a sandbox without proxy
//! traffic is frozen by its monitor (inspect says Paused, its processes are
//! in a frozen cgroup), the next exec thaws it and runs, and inspecting it
//! is not traffic. Polled, never a fixed sleep as the assertion.
mod common;

use common::Daemon;
use ember_types::api::AutoPause;
use std::time::Duration;

async fn state(d: &Daemon, id: &str) -> String {
    d.client.get_sandbox(id).await.expect("inspect").status.state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sandbox_pauses_and_the_next_exec_thaws_it() {
    let d = Daemon::start();
    let s = d.create(|r| r.auto_pause = Some(AutoPause { after_seconds: 1 })).await;
    let plain = d.create(|_| {}).await;
    assert_eq!(state(&d, &s.id).await, "Running");
    let (code, out, _) = d.sh(&s.id, "echo awake", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "awake\n"));

    let mut seen = String::new();
    for _ in 0..200 {
        seen = state(&d, &s.id).await;
        if seen == "Paused" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, "Paused", "no auto-pause within 10 s of a 1 s idle limit");
    assert_eq!(state(&d, &plain.id).await, "Running", "a sandbox without autoPause was paused");

    let (code, out, err) = d.sh(&s.id, "echo thawed", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "thawed\n"), "{err}");
    assert_eq!(state(&d, &s.id).await, "Running", "the exec did not leave it running");

    let bad = ember_types::api::CreateSandboxRequest {
        template: Some("host".into()),
        auto_pause: Some(AutoPause { after_seconds: 0 }),
        ..Default::default()
    };
    let e = d.client.create_sandbox(&bad).await.expect_err("0 s refused").to_string();
    assert!(e.contains("SANDBOX::INVALID_PARAMETER") && e.contains("autoPause"), "{e}");
}

/// The TTL keeps running while a sandbox is auto-paused (docs/auto-pause.md):
/// it expires at its `expiresAt` as a running one does, frozen or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_paused_sandbox_still_expires_at_its_ttl() {
    let d = Daemon::start();
    let s = d
        .create(|r| {
            r.auto_pause = Some(AutoPause { after_seconds: 1 });
            r.timeout = Some(6);
        })
        .await;
    let paused = d.wait_state(&s.id, "Paused", Duration::from_secs(6)).await;
    assert_eq!(paused.status.state, "Paused", "not auto-paused before its TTL");
    let ended = d.wait_state(&s.id, "Terminated", Duration::from_secs(30)).await;
    assert_eq!(
        (ended.status.state.as_str(), ended.status.reason.as_deref()),
        ("Terminated", Some("Expired")),
        "a paused sandbox outlived its TTL"
    );
}
