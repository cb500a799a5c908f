//! Tasks under failure: a worker's sandbox SIGKILLed mid-task (lease expiry,
//! retry by another worker, the workspace holds only the retry's writes) and
//! `kill -9` of the daemon with tasks in every state.
mod common;

use common::Daemon;
use ember_types::task::{SubmitTaskRequest, TaskRecord, TaskState};
use std::time::Duration;

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Attempt 1 writes a partial result and hangs; attempt 2 writes the result.
const TWO_PHASE: &str = "echo start $EMBER_TASK_ATTEMPT >> /workspace/log; \
    if [ $EMBER_TASK_ATTEMPT = 1 ]; then echo partial > /workspace/result; sleep 600; fi; \
    echo result $EMBER_TASK_ATTEMPT > /workspace/result";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_detected_by_lease_expiry_and_the_retry_owns_the_workspace() {
    let d = Daemon::start_with(&["--task-workers", "4"]);
    d.client.create_workspace("job", "32Mi").await.expect("workspace");
    let req = SubmitTaskRequest {
        command: vec!["sh".into(), "-c".into(), TWO_PHASE.into()],
        workspace: Some("job".into()),
        lease_ms: Some(1_000),
        heartbeat_ms: Some(200),
        ..Default::default()
    };
    let (t, _) = d.client.submit_task(&req).await.expect("submit");
    let running = d.wait_task(&t.id, Duration::from_secs(30), |t| t.state == TaskState::Running).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // the partial result is written
    let sandbox = running.attempts[0].sandbox.clone().expect("sandbox");
    let killed = now_ms();
    for p in d.procs(&sandbox) {
        let _ = std::process::Command::new("kill").args(["-9", &p.to_string()]).status();
    }
    let t = d.wait_task(&t.id, Duration::from_secs(30), |t| t.state.is_terminal()).await;
    assert_eq!(t.state, TaskState::Succeeded, "{t:?}");
    let (a1, a2) = (&t.attempts[0], &t.attempts[1]);
    let reason = a1.reason.as_deref().unwrap_or("");
    assert!(reason.starts_with("lease expired"), "attempt 1 ended by {reason:?}, not by its lease");
    let mttd = a1.ended_at_ms.unwrap() - killed;
    // The lease was renewed at most one heartbeat (200 ms) before the kill, so it
    // cannot have expired sooner than 800 ms after it: an earlier end would mean
    // something other than the lease ended the attempt. No upper bound: how late
    // the expiry is seen depends on the machine's load, and it is printed below.
    assert!(mttd >= 800, "MTTD {mttd} ms: the attempt ended before its 1 s lease could have lapsed");
    assert_ne!(a1.worker, a2.worker, "the retry is another worker's");
    assert!(a2.workspace_epoch > a1.workspace_epoch, "the retry writes under a newer epoch: {a1:?} {a2:?}");
    assert_eq!(d.read_ws("job", "result").await, "result 2\n", "the second attempt's result, not a mix");
    assert_eq!(d.read_ws("job", "log").await, "start 2\n", "the killed attempt's writes were dropped");
    let (_, m) = d.client.get_raw("/metrics").await.expect("metrics");
    let m = String::from_utf8_lossy(&m);
    assert!(m.contains("ember_task_lease_expiries_total 1"), "{m}");
    assert!(m.contains("ember_task_mttd_seconds_count 1"));
    println!("MTTD {mttd} ms (lease 1000 ms, heartbeat 200 ms)");
}

/// A task that logs its start and end in its workspace around a sleep.
fn bracketed(ws: &str, secs: u32) -> SubmitTaskRequest {
    let script = format!(
        "echo start $EMBER_TASK_ATTEMPT >> /workspace/log; sleep {secs}; echo end $EMBER_TASK_ATTEMPT >> /workspace/log"
    );
    SubmitTaskRequest {
        command: vec!["sh".into(), "-c".into(), script],
        workspace: Some(ws.into()),
        lease_ms: Some(2_000),
        heartbeat_ms: Some(300),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_daemon_loses_no_task_and_runs_none_twice_at_once() {
    let mut d = Daemon::start_with(&["--task-workers", "2"]);
    let c = d.client.clone();
    let sub = |req: SubmitTaskRequest| {
        let c = c.clone();
        async move { c.submit_task(&req).await.expect("submit").0.id }
    };
    let cmd = |s: &str| SubmitTaskRequest { command: vec!["sh".into(), "-c".into(), s.into()], ..Default::default() };
    let ok = sub(cmd("echo ok")).await;
    let dead = sub(SubmitTaskRequest { attempts: Some(1), ..cmd("exit 1") }).await;
    d.wait_task(&ok, Duration::from_secs(30), |t| t.state == TaskState::Succeeded).await;
    d.wait_task(&dead, Duration::from_secs(30), |t| t.state == TaskState::DeadLettered).await;
    for ws in ["r1", "r2"] {
        d.client.create_workspace(ws, "32Mi").await.expect("workspace");
    }
    let (r1, r2) = (sub(bracketed("r1", 8)).await, sub(bracketed("r2", 8)).await);
    for r in [&r1, &r2] {
        d.wait_task(r, Duration::from_secs(30), |t| t.state == TaskState::Running).await;
    }
    let queued: Vec<String> = vec![sub(cmd("echo q1")).await, sub(cmd("echo q2")).await];
    let cancelled = sub(cmd("echo never")).await;
    assert_eq!(d.client.cancel_task(&cancelled).await.expect("cancel").state, TaskState::Cancelled);
    let before: Vec<TaskRecord> = d.client.list_tasks("").await.expect("list");
    let states = |l: &[TaskRecord]| l.iter().map(|t| (t.id.clone(), t.state)).collect::<Vec<_>>();
    assert!(states(&before).iter().filter(|(_, s)| *s == TaskState::Queued).count() == 2, "{:?}", states(&before));

    d.kill9();
    d.spawn();
    let after = d.client.list_tasks("").await.expect("list after restart");
    assert_eq!(after.len(), before.len(), "every task survives kill -9");
    for (b, a) in before.iter().zip(&after) {
        // The history is kept; the restarted workers may already have moved
        // a queued task on, but nothing ended stays ended.
        assert_eq!((&a.id, &a.transitions[..b.transitions.len()]), (&b.id, &b.transitions[..]), "history kept");
        assert!(!b.state.is_terminal() || a.state == b.state, "{} was {:?}, now {:?}", b.id, b.state, a.state);
    }
    for r in [&r1, &r2] {
        let t = after.iter().find(|t| &t.id == r).expect("running task");
        assert_eq!(t.state, TaskState::Running, "an orphaned attempt keeps its lease until it expires");
    }

    let all: Vec<String> = after.iter().map(|t| t.id.clone()).collect();
    for id in &all {
        d.wait_task(id, Duration::from_secs(60), |t| t.state.is_terminal()).await;
    }
    let get = |id: &String| {
        let c = d.client.clone();
        let id = id.clone();
        async move { c.get_task(&id).await.expect("get") }
    };
    for q in &queued {
        let t = get(q).await;
        assert_eq!((t.state, t.attempts.len()), (TaskState::Succeeded, 1), "{t:?}");
    }
    assert_eq!(get(&cancelled).await.attempts.len(), 0, "a cancelled task never ran");
    assert_eq!(get(&ok).await.attempts.len(), 1, "a finished task is not run again");
    for (r, ws) in [(&r1, "r1"), (&r2, "r2")] {
        let t = get(r).await;
        assert_eq!(t.state, TaskState::Succeeded, "{t:?}");
        assert!(t.attempts[0].reason.as_deref().unwrap_or("").starts_with("lease expired"), "{:?}", t.attempts);
        // The orphaned first attempt was destroyed before the retry began,
        // and its layer dropped: none of its writes appear.
        assert_eq!(d.read_ws(ws, "log").await, "start 2\nend 2\n", "task {r}");
    }
}
