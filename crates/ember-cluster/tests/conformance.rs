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
