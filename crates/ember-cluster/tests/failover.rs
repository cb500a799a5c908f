//! A leader SIGKILLed mid-burst (the tier stream's, or its consumer's): a
//! submitter keeps submitting and a worker keeps draining while the Raft
//! group elects a new leader (4–9 s of election timeout). Every submit
//! must be answered without an error (the election is latency:
//! `retry.rs`), every acknowledged task must be leased and finished, and
//! no task may be finished twice in effect (one accepted `Succeeded`
//! report each). And a pull request lost with its consumer's leader must
//! not hang the worker (the stall these drills once showed).
mod common;

use common::NatsCluster;
use ember_cluster::{JetStreamConfig, JetStreamQueue};
use ember_queue::conformance::spec;
use ember_queue::{system_clock, Outcome, QueueConfig, TaskQueue};
use ember_types::task::{TaskState, Tier};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const STREAM: &str = "EMBER_TASKS_STANDARD";
const TASKS: usize = 120;
/// The submit after which the leader is killed: mid-burst.
const KILL_AFTER: usize = 40;

fn open(cluster: &NatsCluster) -> JetStreamQueue {
    let cfg = JetStreamConfig { ack_wait: Duration::from_secs(5), ..JetStreamConfig::new(cluster.urls()) };
    JetStreamQueue::open(cfg, QueueConfig::default(), system_clock()).expect("open")
}

/// A pull request that no server answers (here: the tier consumer's
/// leader is frozen by SIGSTOP right after the request is routed to it;
/// in the drills' stall below, the leader or the worker's server died with
/// the request in flight) must not hang the worker: the fetch is retried
/// until the consumer's new leader answers. Before the fix a fetch had no
/// deadline and `lease` never returned. The bound below only turns that
/// hang into a failure; the lease is expected well inside it.
#[test]
fn a_pull_request_lost_with_the_consumer_leader_does_not_hang_the_worker() {
    let cluster = NatsCluster::start("lostpull", 3);
    let submitter = open(&cluster);
    submitter.submit("t0", spec(Tier::Standard, 3)).expect("submit");
    let leader = cluster.consumer_leader(STREAM, "workers");
    // The worker talks to a server that stays up: only the consumer's
    // leader is lost, not the worker's connection.
    let other = cluster.servers.iter().find(|s| s.name != leader).expect("another server").name.clone();
    let cfg = JetStreamConfig { ack_wait: Duration::from_secs(5), ..JetStreamConfig::new(vec![cluster.url(&other)]) };
    let worker = JetStreamQueue::open(cfg, QueueConfig::default(), system_clock()).expect("open");
    cluster.signal(&leader, "STOP");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(worker.lease("w").map(|l| l.map(|(lease, _)| lease.task)));
    });
    let got = rx.recv_timeout(Duration::from_secs(120));
    cluster.signal(&leader, "CONT");
    let got = got.expect("lease never returned: a fetch whose pull request nobody answers waits forever");
    assert_eq!(got.expect("lease"), Some("t0".to_string()), "the task is leased from the consumer's new leader");
}

#[test]
fn the_stream_leader_killed_mid_burst_loses_no_task_and_runs_none_twice() {
    drill("failover", |c| c.stream_leader(STREAM));
}

/// The consumer's leader holds the worker's pull requests: one in flight
/// when it dies is never answered. Before the fetch had a deadline this
/// stalled the worker (seen here: 18 of 120 tasks in 60 s).
#[test]
fn the_consumer_leader_killed_mid_burst_loses_no_task_and_runs_none_twice() {
    drill("failover-consumer", |c| c.consumer_leader(STREAM, "workers"));
}

/// Submits [`TASKS`] tasks while a worker drains, SIGKILLs the server that
/// `leader` names after the [`KILL_AFTER`]th, and checks every task ends
/// once, by one accepted report, with no error seen by either side.
fn drill(test: &str, leader: impl Fn(&NatsCluster) -> String) {
    let mut cluster = NatsCluster::start(test, 3);
    let submitter = open(&cluster);
    let worker = Arc::new(open(&cluster));
    let submitted = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));

    // The worker: lease, report Succeeded; count every report the queue accepted.
    let drain = {
        let (worker, done) = (Arc::clone(&worker), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut accepted: HashMap<String, u32> = HashMap::new();
            let mut errors = Vec::new();
            while !done.load(Ordering::SeqCst) {
                match worker.lease("w") {
                    Ok(Some((lease, _))) => match worker.finish(&lease, Outcome::Succeeded) {
                        Ok(_) => *accepted.entry(lease.task).or_default() += 1,
                        Err(e) => errors.push(format!("finish {}: {e}", lease.task)),
                    },
                    Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                    Err(e) => errors.push(format!("lease: {e}")),
                }
            }
            (accepted, errors)
        })
    };

    let mut slowest = Duration::ZERO;
    let mut killed = None;
    for i in 0..TASKS {
        if i == KILL_AFTER {
            let leader = leader(&cluster);
            cluster.kill(&leader);
            killed = Some(leader);
        }
        let t = Instant::now();
        let (rec, created) =
            submitter.submit(&format!("t{i:03}"), spec(Tier::Standard, 3)).expect("a submit is never an error");
        assert!(created && rec.state == TaskState::Queued);
        slowest = slowest.max(t.elapsed());
        submitted.fetch_add(1, Ordering::SeqCst);
    }
    let killed = killed.expect("the leader was killed");
    eprintln!("killed {killed}; slowest submit {slowest:?}");

    // Every acknowledged task ends Succeeded (a lease lost with the leader
    // comes back after AckWait), within a bound that fails loudly.
    let start = Instant::now();
    loop {
        let ok =
            (0..TASKS).filter(|i| submitter.get(&format!("t{i:03}")).unwrap().state == TaskState::Succeeded).count();
        if ok == TASKS {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "{ok} of {TASKS} tasks succeeded");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_ne!(leader(&cluster), killed, "a new leader was elected");
    done.store(true, Ordering::SeqCst);
    let (accepted, errors) = drain.join().expect("worker thread");
    assert!(errors.is_empty(), "the worker saw errors: {errors:?}");
    let twice: Vec<_> = accepted.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "finished more than once: {twice:?}");
    assert_eq!(accepted.len(), TASKS, "every task finished by an accepted report");
    for i in 0..TASKS {
        let r = submitter.get(&format!("t{i:03}")).unwrap();
        let ends = r.transitions.iter().filter(|t| t.state == TaskState::Succeeded).count();
        assert_eq!(ends, 1, "{}: {:?}", r.id, r.transitions);
    }
}

/// A listing the queue cannot read is an error, never a shorter list: the
/// API answers 503, and a tenant's `tasks` quota, which counts from it,
/// does not pass on an empty count. Here every server is frozen (SIGSTOP)
/// past the retry budget. Before, the listing answered `Ok([])`.
#[test]
fn a_listing_the_queue_cannot_read_is_an_error_not_an_empty_list() {
    let cluster = NatsCluster::start("listdown", 3);
    let cfg = JetStreamConfig { retry_budget: Duration::from_secs(3), ..JetStreamConfig::new(cluster.urls()) };
    let q = JetStreamQueue::open(cfg, QueueConfig::default(), system_clock()).expect("open");
    q.submit("t0", spec(Tier::Standard, 3)).expect("submit");
    assert_eq!(q.list(&Default::default()).expect("list").len(), 1);
    let names: Vec<String> = cluster.servers.iter().map(|s| s.name.clone()).collect();
    names.iter().for_each(|n| cluster.signal(n, "STOP"));
    let listed = q.list(&Default::default());
    names.iter().for_each(|n| cluster.signal(n, "CONT"));
    let e = listed.map(|l| l.len()).expect_err("a frozen queue listed");
    assert!(matches!(e, ember_queue::QueueError::Unavailable { .. }), "{e}");
    assert_eq!(q.list(&Default::default()).expect("list after").len(), 1, "the task is still there");
}

/// A submit that died after writing its task's record and before its
/// message was published (its node SIGKILLed, or the publish given up in
/// an election) left a record no worker could fetch: the task stayed
/// Queued for good, though the client's retry, finding the record, was
/// answered as submitted (5 tasks of a 300-session drill). The half-done
/// submit is written here as the queue writes it (the record, and for a
/// keyed task the key's claim; no message). A retry of the submit, by its
/// id or by its idempotency key, must leave the task leasable. Before the
/// fix neither was ever leased.
#[test]
fn a_submit_that_died_before_publishing_is_finished_by_its_retry() {
    let cluster = NatsCluster::start("halfsubmit", 3);
    let q = open(&cluster);
    half_submit(&cluster.urls(), "t0", None);
    half_submit(&cluster.urls(), "t1", Some("k1"));

    let (r0, created) = q.submit("t0", spec(Tier::Standard, 3)).expect("the retry by id");
    assert_eq!((r0.id.as_str(), created, r0.state), ("t0", false, TaskState::Queued));
    let keyed = ember_types::task::TaskSpec { key: Some("k1".into()), ..spec(Tier::Standard, 3) };
    let (r1, created) = q.submit("t2", keyed).expect("the retry by key");
    assert_eq!((r1.id.as_str(), created), ("t1", false), "the key's task answers");

    let mut leased = Vec::new();
    while let Some((lease, _)) = q.lease("w").expect("lease") {
        q.finish(&lease, Outcome::Succeeded).expect("finish");
        leased.push(lease.task);
    }
    leased.sort();
    assert_eq!(leased, ["t0", "t1"], "each half-submitted task is leased once its submit is retried");
    // A retry of a task that was leased publishes nothing more.
    q.submit("t0", spec(Tier::Standard, 3)).expect("a later retry");
    assert!(q.lease("w").expect("lease").is_none(), "a finished task is not leased again");
}

/// Writes what a submit of task `id` leaves when it dies right after its
/// record: the key's claim (keyed tasks), the Queued record, no message.
fn half_submit(urls: &[String], id: &str, key: Option<&str>) {
    let mut spec = spec(Tier::Standard, 3);
    spec.key = key.map(str::to_string);
    let now = system_clock()();
    let mut record = ember_types::task::TaskRecord {
        id: id.into(),
        spec,
        state: TaskState::Queued,
        submitted_at_ms: now,
        transitions: Vec::new(),
        attempts: Vec::new(),
    };
    record.transition(TaskState::Queued, now, None);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let client = async_nats::ConnectOptions::new().connect(urls).await.expect("connect");
        let js = async_nats::jetstream::new(client);
        if let Some(k) = key {
            let claim = serde_json::json!({ "task": id, "at_ms": now });
            let keys = js.get_key_value("ember_task_keys").await.expect("keys bucket");
            keys.create(k, serde_json::to_vec(&claim).unwrap().into()).await.expect("claim the key");
        }
        let records = js.get_key_value("ember_tasks").await.expect("records bucket");
        let stored = serde_json::json!({ "record": record });
        records.create(id, serde_json::to_vec(&stored).unwrap().into()).await.expect("write the record");
    });
}
