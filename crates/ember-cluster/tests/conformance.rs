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
