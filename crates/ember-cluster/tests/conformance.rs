//! The queue conformance suite (`ember_queue::conformance`) on
//! `JetStreamQueue` against a real 3-server JetStream cluster, streams and
//! buckets R3, one cluster per test.
mod common;

use common::NatsCluster;
use ember_cluster::{JetStreamConfig, JetStreamQueue};
use ember_queue::conformance::Harness;
use ember_queue::{QueueConfig, TaskQueue};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

struct Js {
    cluster: NatsCluster,
    now: Arc<AtomicI64>,
}

fn harness(test: &str) -> Js {
    Js { cluster: NatsCluster::start(test, 3), now: Arc::new(AtomicI64::new(1_000_000)) }
}

impl Harness for Js {
    fn open(&self, cfg: QueueConfig) -> Box<dyn TaskQueue> {
        let js = JetStreamConfig {
            // The conformance spec's lease is 1 s.
            ack_wait: Duration::from_secs(1),
            held_retry: Duration::from_millis(100),
            ..JetStreamConfig::new(self.cluster.urls())
        };
        let now = self.now.clone();
        Box::new(JetStreamQueue::open(js, cfg, Arc::new(move || now.load(Ordering::SeqCst))).expect("open"))
    }

    fn advance(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// The server redelivers after AckWait on its own; `lease_due` waits.
    fn expire_leases(&self, _q: &dyn TaskQueue) {}
}

ember_queue::conformance_tests!(harness);

/// The hand-off hint (`queue/drained.rs`): a lease that left every tier
/// seen drained says so, and a submit or a message still pending says
/// there may be more. The window is an hour here, so no step races it.
#[test]
fn more_queued_says_whether_a_lease_left_work_behind() {
    use ember_queue::conformance::spec;
    use ember_types::task::Tier;
    let cluster = NatsCluster::start("drained", 3);
    let cfg = JetStreamConfig { drained_for: Duration::from_secs(3600), ..JetStreamConfig::new(cluster.urls()) };
    let q = JetStreamQueue::open(cfg, QueueConfig::default(), ember_queue::system_clock()).expect("open");
    assert!(q.more_queued(), "nothing seen yet");
    assert!(q.lease("w1").expect("lease").is_none());
    assert!(!q.more_queued(), "an empty lease saw every tier drained");
    q.submit("t1", spec(Tier::Standard, 1)).expect("submit");
    q.submit("t2", spec(Tier::Standard, 1)).expect("submit");
    assert!(q.more_queued(), "submitted here since");
    assert!(q.lease("w1").expect("lease").is_some());
    assert!(q.more_queued(), "t2 is still pending");
    assert!(q.lease("w2").expect("lease").is_some());
    assert!(!q.more_queued(), "the last one taken, every tier seen drained");
    q.submit("t3", spec(Tier::Batch, 1)).expect("submit");
    assert!(q.more_queued(), "a submit to another tier");
}

/// A listing while tasks change names each task once: the records bucket's
/// listing goes on delivering the writes made while it runs, and a task
/// written meanwhile was listed twice (a cluster's `GET /v1/tasks`, seen in
/// `bins/ember/tests/cluster/tasks.rs`), and under load one was missed.
#[test]
fn a_listing_while_tasks_change_names_each_once() {
    use ember_queue::conformance::spec;
    use ember_types::task::Tier;
    let cluster = NatsCluster::start("listing", 3);
    let q = Arc::new(
        JetStreamQueue::open(JetStreamConfig::new(cluster.urls()), QueueConfig::default(), ember_queue::system_clock())
            .expect("open"),
    );
    let n = 300;
    for i in 0..n {
        q.submit(&format!("t{i}"), spec(Tier::Standard, 1)).expect("submit");
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (q, stop) = (q.clone(), stop.clone());
        // Each lease writes its task's record: leased, then its heartbeat.
        std::thread::spawn(move || {
            let mut leased = 0;
            while !stop.load(Ordering::Relaxed) {
                match q.lease("w1").expect("lease") {
                    Some((l, _)) => {
                        let _ = q.heartbeat(&l);
                        leased += 1;
                    }
                    None => break,
                }
            }
            leased
        })
    };
    let mut listings = 0;
    let mut twice = Vec::new();
    let mut missed = Vec::new();
    while !writer.is_finished() || listings == 0 {
        let all = q.list(&Default::default()).expect("list");
        let ids: std::collections::BTreeSet<&str> = all.iter().map(|t| t.id.as_str()).collect();
        if ids.len() != all.len() {
            twice.push(all.len() - ids.len());
        }
        // None is removed while listed, so each listing names all of them:
        // a key rewritten during the pass once dropped out of it (one of
        // 300, under load, in a fresh clone's run).
        if ids.len() != n {
            missed.push(n - ids.len());
        }
        listings += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let leased = writer.join().expect("the writer");
    assert!(leased > 0, "tasks changed while listed");
    assert!(twice.is_empty(), "of {listings} listings, these named tasks twice: {twice:?}");
    assert!(missed.is_empty(), "of {listings} listings, these missed tasks: {missed:?}");
}
