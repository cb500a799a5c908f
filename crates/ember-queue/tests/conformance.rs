//! The conformance suite (`ember_queue::conformance`) on the embedded
//! queue: a temp-dir journal and a clock the test moves. ember-cluster runs
//! the same functions on JetStream.
mod common;

use common::Fixture;
use ember_queue::conformance::Harness;
use ember_queue::{QueueConfig, TaskQueue};

impl Harness for Fixture {
    fn open(&self, cfg: QueueConfig) -> Box<dyn TaskQueue> {
        Box::new(Fixture::open(self, cfg))
    }

    fn advance(&self, ms: i64) {
        Fixture::advance(self, ms);
    }

    fn expire_leases(&self, q: &dyn TaskQueue) {
        Fixture::advance(self, 1_001);
        q.expire().expect("expire");
    }
}

ember_queue::conformance_tests!(Fixture::new);
