//! Tasks that share a workspace run exactly once in effect: one attempt per
//! workspace at a time (no attempt steals a live holder's workspace), and an
//! attempt's writes reach the workspace only if it succeeds under a current
//! epoch (its layer is dropped otherwise). Real sandboxes, real kills.
mod common;

use common::Daemon;
use ember_types::task::{SubmitTaskRequest, TaskState};
use std::time::Duration;

fn sh(script: String, ws: &str) -> SubmitTaskRequest {
    SubmitTaskRequest {
        command: vec!["sh".into(), "-c".into(), script],
        workspace: Some(ws.into()),
        ..Default::default()
    }
}

async fn submit_all(d: &Daemon, reqs: Vec<SubmitTaskRequest>) -> Vec<String> {
    let mut ids = Vec::new();
    for r in reqs {
        ids.push(d.client.submit_task(&r).await.expect("submit").0.id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_tasks_on_one_workspace_each_append_their_line_exactly_once() {
    // The default 4 workers.
    let d = Daemon::start();
    d.client.create_workspace("w", "32Mi").await.expect("workspace");
    let reqs = (0..60).map(|i| sh(format!("echo {i} >> /workspace/done"), "w")).collect();
    let ids = submit_all(&d, reqs).await;
    let mut fenced = Vec::new();
    for id in &ids {
        let t = d.wait_task(id, Duration::from_secs(240), |t| t.state.is_terminal()).await;
        assert_eq!(t.state, TaskState::Succeeded, "{t:?}");
        if t.attempts.len() != 1 {
            fenced.push(t);
        }
    }
    assert!(fenced.is_empty(), "no attempt is fenced while its holder lives: {fenced:?}");
    let mut lines: Vec<u32> = d.read_ws("w", "done").await.lines().map(|l| l.parse().expect("a number")).collect();
    lines.sort();
    assert_eq!(lines, (0..60).collect::<Vec<u32>>(), "every task's line exactly once");
}

/// xorshift: the test's random kills, reproducible from the printed seed.
fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_killed_at_random_leave_no_partial_writes() {
    let d = Daemon::start();
    d.client.create_workspace("k", "32Mi").await.expect("workspace");
    let n = 10;
    let reqs = (0..n)
        .map(|i| SubmitTaskRequest {
            lease_ms: Some(1_000),
            heartbeat_ms: Some(200),
            attempts: Some(10),
            ..sh(format!("echo start {i} >> /workspace/log; sleep 0.3; echo end {i} >> /workspace/log"), "k")
        })
        .collect();
    let ids = submit_all(&d, reqs).await;
    let mut seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    println!("seed {seed}");
    let mut kills = 0;
    for id in &ids {
        // Kill the first attempt of about half the tasks, 0-400 ms into its command.
        let running =
            d.wait_task(id, Duration::from_secs(60), |t| t.state == TaskState::Running || t.state.is_terminal());
        let running = running.await;
        if running.state.is_terminal() || next(&mut seed).is_multiple_of(2) {
            continue;
        }
        tokio::time::sleep(Duration::from_millis(next(&mut seed) % 400)).await;
        let sandbox = running.attempts.last().and_then(|a| a.sandbox.clone()).expect("sandbox");
        for p in d.procs(&sandbox) {
            let _ = std::process::Command::new("kill").args(["-9", &p.to_string()]).status();
        }
        kills += 1;
    }
    let mut retried = 0;
    for id in &ids {
        let t = d.wait_task(id, Duration::from_secs(120), |t| t.state.is_terminal()).await;
        assert_eq!(t.state, TaskState::Succeeded, "{t:?}");
        retried += usize::from(t.attempts.len() > 1);
    }
    println!("{kills} attempts killed, {retried} tasks retried");
    let expected: String = (0..n).map(|i| format!("start {i}\nend {i}\n")).collect();
    assert_eq!(d.read_ws("k", "log").await, expected, "whole attempts only, in submission order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_expires_mid_write_drops_the_fenced_attempts_writes() {
    let mut d = Daemon::start_with(&["--task-workers", "2"]);
    d.client.create_workspace("e", "32Mi").await.expect("workspace");
    // Attempt 1 writes until it is stopped; attempt 2 writes once and ends.
    let script = "if [ $EMBER_TASK_ATTEMPT = 1 ]; then while :; do echo a1 >> /workspace/log; sleep 0.05; done; fi; \
        echo a$EMBER_TASK_ATTEMPT >> /workspace/log";
    let req = SubmitTaskRequest { lease_ms: Some(1_500), heartbeat_ms: Some(300), ..sh(script.into(), "e") };
    let id = submit_all(&d, vec![req]).await.remove(0);
    d.wait_task(&id, Duration::from_secs(30), |t| t.state == TaskState::Running).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The worker dies with the daemon; its orphaned sandbox keeps writing,
    // and nothing renews the lease, which expires mid-write.
    d.kill9();
    d.spawn();
    let t = d.wait_task(&id, Duration::from_secs(30), |t| t.state.is_terminal()).await;
    assert_eq!(t.state, TaskState::Succeeded, "{t:?}");
    let reason = t.attempts[0].reason.as_deref().unwrap_or("");
    assert!(reason.starts_with("lease expired"), "attempt 1 ended by {reason:?}");
    assert_eq!(d.read_ws("e", "log").await, "a2\n", "the fenced attempt's writes never appear");
}
