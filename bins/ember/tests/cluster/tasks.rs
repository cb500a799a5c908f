//! Tasks on a cluster: one JetStream queue for every node's workers, logs
//! read where the attempt ran, a SIGKILLed node's leased tasks re-run by the
//! survivor after their lease, its late report refused.
use super::common::Daemon;
use super::{assert_node_unavailable, eventually, nats, node, runtime};
use ember_queue::{Lease, Outcome, QueueError, TaskQueue};
use ember_types::task::{SubmitTaskRequest, TaskRecord, TaskState};
use std::collections::BTreeSet;
use std::time::Duration;

fn task(script: &str) -> SubmitTaskRequest {
    SubmitTaskRequest { command: vec!["sh".into(), "-c".into(), script.into()], ..Default::default() }
}

/// Polls `d` until every task of `ids` has ended (a bound on a hang).
async fn all_ended(d: &Daemon, ids: &[String]) -> Vec<TaskRecord> {
    eventually(Duration::from_secs(600), "every task ended", || async {
        let all = d.client.list_tasks("").await.ok()?;
        let mine: Vec<TaskRecord> = all.into_iter().filter(|t| ids.contains(&t.id)).collect();
        assert!(mine.len() <= ids.len());
        (mine.len() == ids.len() && mine.iter().all(|t| t.state.is_terminal())).then_some(mine)
    })
    .await
}

/// Exactly once in effect: every task succeeded, and exactly one of its
/// attempts reported a success (exit 0 recorded, no failure reason).
fn once_each(done: &[TaskRecord]) {
    for t in done {
        assert_eq!(t.state, TaskState::Succeeded, "{t:?}");
        let ok = t.attempts.iter().filter(|a| a.exit_code == Some(0) && a.reason.is_none()).count();
        assert_eq!(ok, 1, "{} successful attempts of {t:?}", ok);
    }
}

async fn log(d: &Daemon, id: &str, attempt: Option<u32>) -> String {
    let mut out = Vec::new();
    d.client.task_logs(id, attempt, false, |b| out.extend_from_slice(b)).await.expect("task log");
    String::from_utf8_lossy(&out).into_owned()
}

/// The first task whose latest attempt ran on `node`.
fn ran_on<'a>(done: &'a [TaskRecord], node: &str) -> &'a TaskRecord {
    done.iter().find(|t| t.attempts.last().is_some_and(|a| a.node() == node)).expect("a task that ran there")
}

#[test]
fn tasks_submitted_through_one_node_run_once_across_both_nodes_and_logs_read_through_either() {
    let nats = nats::NatsCluster::start("tasks", 3);
    let a = node(&nats, "a", &["--task-workers", "2"]);
    let b = node(&nats, "b", &["--task-workers", "2"]);
    runtime().block_on(async {
        let mut ids = Vec::new();
        for _ in 0..200 {
            let req = SubmitTaskRequest { reuse_sandbox: Some(true), ..task("echo ran-$EMBER_TASK_ID") };
            ids.push(a.client.submit_task(&req).await.expect("submit through a").0.id);
        }
        let done = all_ended(&b, &ids).await;
        once_each(&done);
        let nodes: BTreeSet<&str> = done.iter().flat_map(|t| t.attempts.iter().map(|a| a.node())).collect();
        assert_eq!(nodes, BTreeSet::from(["a", "b"]), "both nodes' workers ran some");
        let on = |n: &str| done.iter().filter(|t| t.attempts[0].node() == n).count();
        eprintln!("tasks whose first attempt ran on a: {}, on b: {}", on("a"), on("b"));
        // Each log read through the node that did not run the attempt.
        for (ran, through) in [("a", &b), ("b", &a)] {
            let t = ran_on(&done, ran);
            assert_eq!(log(through, &t.id, None).await, format!("ran-{}\n", t.id), "{ran}'s log through the other");
        }
        assert_eq!(b.client.get_task(&ids[0]).await.expect("inspect through b").id, ids[0]);
    });
}

#[test]
fn a_node_killed_mid_burst_has_its_leased_tasks_rerun_by_the_survivor() {
    let nats = nats::NatsCluster::start("tasks-kill", 3);
    let short = ["--task-workers", "2", "--task-lease", "3s", "--task-heartbeat", "500ms"];
    let a = node(&nats, "a", &short);
    let mut b = node(&nats, "b", &short);
    runtime().block_on(async {
        let on_b = b.create(|_| {}).await.id;
        let mut ids = Vec::new();
        for _ in 0..12 {
            ids.push(a.client.submit_task(&task("sleep 2; echo done")).await.expect("submit").0.id);
        }
        // B's workers hold running attempts: kill B then.
        let running_on_b = eventually(Duration::from_secs(120), "an attempt running on b", || async {
            let all = a.client.list_tasks("").await.ok()?;
            let mine: Vec<TaskRecord> = all
                .into_iter()
                .filter(|t| t.state == TaskState::Running && t.attempts.last().is_some_and(|x| x.node() == "b"))
                .collect();
            (!mine.is_empty()).then_some(mine)
        })
        .await;
        b.kill9();
        let killed = std::time::Instant::now();
        // Before and after B is noticed dead: its sandbox answers 503.
        let err = a.client.get_sandbox(&on_b).await.expect_err("b's sandbox");
        assert_node_unavailable(&err, "b");

        let done = all_ended(&a, &ids).await;
        eprintln!("{} attempts lost with b; every task done {:?} after the kill", running_on_b.len(), killed.elapsed());
        once_each(&done);
        for lost in &running_on_b {
            let t = done.iter().find(|t| t.id == lost.id).expect("listed");
            let last = t.attempts.last().expect("attempts");
            assert!(t.attempts.len() >= 2 && last.node() == "a", "b's attempt re-run by a: {t:?}");
            assert!(t.attempts[0].reason.as_deref().is_some_and(|r| r.contains("lease expired")), "{t:?}");
        }
        let err = a.client.get_sandbox(&on_b).await.expect_err("b's sandbox, b dead");
        assert_node_unavailable(&err, "b");
        let err = a.client.task_logs(&running_on_b[0].id, Some(1), false, |_| {}).await.expect_err("b's log is on b");
        assert_node_unavailable(&err, "b");

        // The dead attempt's report, come back late, is refused (fenced): the
        // record keeps the survivor's success.
        let lost = &running_on_b[0];
        let first = lost.attempts.last().expect("b's attempt");
        let mut cfg = ember_cluster::JetStreamConfig::new(nats.urls());
        cfg.ack_wait = Duration::from_secs(3);
        let q = tokio::task::spawn_blocking(move || {
            ember_cluster::JetStreamQueue::open(cfg, Default::default(), ember_queue::system_clock())
        })
        .await
        .expect("join")
        .expect("open the cluster's queue");
        let late = Lease { task: lost.id.clone(), attempt: first.attempt, worker: first.worker.clone() };
        let q = std::sync::Arc::new(q);
        let qq = q.clone();
        let refused = tokio::task::spawn_blocking(move || qq.finish(&late, Outcome::Succeeded)).await.expect("join");
        let stale = first.attempt;
        assert!(matches!(refused, Err(QueueError::Fenced { current, .. }) if current > stale), "{refused:?}");
        let after = a.client.get_task(&lost.id).await.expect("inspect");
        assert_eq!(after.attempts.last().map(|x| x.node()), Some("a"));
        once_each(std::slice::from_ref(&after));
    });
}
