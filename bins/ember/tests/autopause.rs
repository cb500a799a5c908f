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
    let s = d.create(|r| r.auto_pause = Some(AutoPause { after_seconds: 1, ..Default::default() })).await;
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
        auto_pause: Some(AutoPause { after_seconds: 0, ..Default::default() }),
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
            r.auto_pause = Some(AutoPause { after_seconds: 1, ..Default::default() });
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

/// `autoPause: {afterSeconds, checkpoint: true}` on gVisor: the first idle
/// pause is a checkpoint (no process of the sandbox left on the host: its
/// memory is on disk), the next call restores it with its processes (a
/// background process keeps its pid), and the next idle pause is the
/// freezer's (its processes stay, frozen), since only the first restore is
/// reliable on this gVisor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gvisor_sandbox_auto_pauses_by_checkpoint_once_then_by_the_freezer() {
    let d = Daemon::start();
    let s = d
        .create(|r| {
            r.runtime_class = Some("runsc".into());
            r.auto_pause = Some(AutoPause { after_seconds: 2, checkpoint: true });
        })
        .await;
    let (code, pid, err) = d.sh(&s.id, "setsid sleep 100000 </dev/null >/dev/null 2>&1 & echo $!", None).await;
    assert_eq!(code, Some(0), "{err}");
    let pid = pid.trim().to_string();
    assert!(d.tasks("runsc", &s.id) > 0, "a running gVisor sandbox has host tasks");

    let paused = d.wait_state(&s.id, "Paused", Duration::from_secs(60)).await;
    assert_eq!(paused.status.state, "Paused", "no auto-pause");
    assert_eq!(d.tasks("runsc", &s.id), 0, "the first auto-pause left processes on the host: not a checkpoint");

    let (code, out, err) = d.sh(&s.id, &format!("test -d /proc/{pid} && echo kept"), None).await;
    assert_eq!((code, out.as_str()), (Some(0), "kept\n"), "restored without its process: {err}");
    assert_eq!(state(&d, &s.id).await, "Running");

    let paused = d.wait_state(&s.id, "Paused", Duration::from_secs(60)).await;
    assert_eq!(paused.status.state, "Paused", "no second auto-pause");
    assert!(d.tasks("runsc", &s.id) > 0, "the second auto-pause checkpointed again: the freezer keeps the processes");
    let (code, out, _) = d.sh(&s.id, "echo thawed", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "thawed\n"));
    d.client.delete_sandbox(&s.id).await.expect("delete");
}
