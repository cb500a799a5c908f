//! Per-tenant caps on running tasks, retention of finished tasks, and opt-in
//! sandbox reuse between tasks of one tenant, against a real daemon.
mod common;

use common::Daemon;
use ember_client::ClientError;
use ember_types::task::{SubmitTaskRequest, TaskRecord, TaskState};
use std::time::{Duration, Instant};

fn sh(script: &str, tenant: Option<&str>) -> SubmitTaskRequest {
    SubmitTaskRequest {
        command: vec!["sh".into(), "-c".into(), script.into()],
        tenant: tenant.map(String::from),
        attempts: Some(1),
        ..Default::default()
    }
}

async fn wait_done(d: &Daemon, ids: &[String], within: Duration) -> Vec<TaskRecord> {
    let deadline = Instant::now() + within;
    loop {
        let mut out = Vec::new();
        for id in ids {
            out.push(d.client.get_task(id).await.expect("get"));
        }
        if out.iter().all(|t| t.state.is_terminal()) {
            for t in &out {
                assert_eq!(t.state, TaskState::Succeeded, "{}: {:?}", t.id, t.attempts);
            }
            return out;
        }
        assert!(Instant::now() < deadline, "tasks unfinished: {:?}", out.iter().map(|t| t.state).collect::<Vec<_>>());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The most attempts of `tasks` that ran at the same time.
fn peak(tasks: &[&TaskRecord]) -> i32 {
    let mut edges: Vec<(i64, i32)> = tasks
        .iter()
        .flat_map(|t| {
            let a = &t.attempts[0];
            [(a.started_at_ms.expect("started"), 1), (a.ended_at_ms.expect("ended"), -1)]
        })
        .collect();
    edges.sort();
    let (mut cur, mut peak) = (0, 0);
    for (_, d) in edges {
        cur += d;
        peak = peak.max(cur);
    }
    peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cap_bounds_that_tenants_running_tasks_while_others_run() {
    let d = Daemon::start_with(&["--task-workers", "6", "--task-tenant-cap", "1", "--task-tenant-cap", "big=2"]);
    let mut ids = Vec::new();
    for tenant in ["small", "small", "small", "big", "big", "big", "big"] {
        ids.push(d.client.submit_task(&sh("sleep 3", Some(tenant))).await.expect("submit").0.id);
    }
    let done = wait_done(&d, &ids, Duration::from_secs(120)).await;
    let of = |t: &str| done.iter().filter(|r| r.spec.tenant.as_deref() == Some(t)).collect::<Vec<_>>();
    assert_eq!(peak(&of("small")), 1, "tenant small is capped at 1 (the default cap)");
    assert_eq!(peak(&of("big")), 2, "tenant big has its own cap of 2, and six workers to fill it");
    assert_eq!(peak(&done.iter().collect::<Vec<_>>()), 3, "the caps are per tenant, not one for all");
    match d.client.submit_task(&sh("true", Some("no spaces"))).await {
        Err(ClientError::Api { status: 400, .. }) => {}
        other => panic!("a bad tenant name was accepted: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_tasks_and_their_logs_are_dropped_after_the_retention() {
    let d = Daemon::start_with(&["--task-workers", "2", "--task-retention", "2s"]);
    let (t, _) = d.client.submit_task(&sh("echo kept for a while", None)).await.expect("submit");
    wait_done(&d, std::slice::from_ref(&t.id), Duration::from_secs(60)).await;
    let (long, _) = d.client.submit_task(&sh("sleep 20", None)).await.expect("submit");
    let log = d.data_dir.join(format!("tasks/logs/{}.1.log", t.id));
    assert!(log.exists(), "the log is kept after the task ends");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match d.client.get_task(&t.id).await {
            Err(ClientError::Api { status: 404, .. }) => break,
            Ok(_) => assert!(Instant::now() < deadline, "task {} outlived its retention", t.id),
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!log.exists(), "its log went with it");
    let still = d.client.get_task(&long.id).await.expect("the unfinished task is never dropped");
    assert!(!still.state.is_terminal(), "{:?}", still.state);
    // A restart reads the journal: the dropped task stays dropped.
    let mut d = d;
    d.kill9();
    d.spawn();
    match d.client.get_task(&t.id).await {
        Err(ClientError::Api { status: 404, .. }) => {}
        other => panic!("a restart brought the dropped task back: {other:?}"),
    }
    d.client.get_task(&long.id).await.expect("the unfinished task survives the restart");
    d.client.cancel_task(&long.id).await.expect("cancel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opted_in_tasks_of_one_tenant_share_a_sandbox_and_no_one_else_does() {
    let d = Daemon::start_with(&["--task-workers", "1"]);
    let reuse =
        |script: &str, tenant: &str| SubmitTaskRequest { reuse_sandbox: Some(true), ..sh(script, Some(tenant)) };
    // One worker takes them in submission order.
    let first = "echo mark > /tmp/mark; sleep 30 >/dev/null 2>&1 & echo started";
    let look = "cat /tmp/mark 2>/dev/null || echo no-mark; for p in /proc/[0-9]*; do cat $p/comm; done | grep -c '^sleep$' || true";
    let reqs = [reuse(first, "t1"), reuse(look, "t1"), reuse(look, "t2"), sh(look, Some("t1"))];
    let mut ids = Vec::new();
    for r in &reqs {
        ids.push(d.client.submit_task(r).await.expect("submit").0.id);
    }
    let done = wait_done(&d, &ids, Duration::from_secs(120)).await;
    let sb: Vec<String> = done.iter().map(|t| t.attempts[0].sandbox.clone().expect("sandbox")).collect();
    assert_eq!(sb[0], sb[1], "same tenant, both opted in: one sandbox");
    assert_ne!(sb[2], sb[1], "another tenant never shares");
    assert!(sb[3] != sb[1] && sb[3] != sb[2], "a task that did not opt in gets its own");
    let mut out = Vec::new();
    for id in &ids[1..] {
        let mut o = Vec::new();
        d.client.task_logs(id, None, false, |b| o.extend_from_slice(b)).await.expect("logs");
        out.push(String::from_utf8_lossy(&o).into_owned());
    }
    assert_eq!(out[0], "mark\n0\n", "files are kept, the earlier task's processes are not");
    assert_eq!(out[1], "no-mark\n0\n");
    assert_eq!(out[2], "no-mark\n0\n");
    // An idle worker gives its kept sandbox up: nothing is left behind.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !d.client.list_sandboxes("").await.expect("list").is_empty() {
        assert!(Instant::now() < deadline, "task sandboxes left behind");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    match d.client.submit_task(&SubmitTaskRequest { workspace: Some("w".into()), ..reuse("true", "t1") }).await {
        Err(ClientError::Api { status: 400, .. }) => {}
        other => panic!("reuse with a workspace was accepted: {other:?}"),
    }
}
