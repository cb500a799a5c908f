//! What the queue's test files share: a temp dir and a clock the test moves.
#![allow(dead_code)] // each test file uses its own part of this

use ember_queue::{EmbeddedQueue, QueueConfig};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

pub struct Fixture {
    pub dir: std::path::PathBuf,
    pub now: Arc<AtomicI64>,
}

impl Fixture {
    pub fn new(name: &str) -> Fixture {
        let dir = std::env::temp_dir().join(format!("ember-queue-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Fixture { dir, now: Arc::new(AtomicI64::new(1_000_000)) }
    }

    pub fn open(&self, cfg: QueueConfig) -> EmbeddedQueue {
        let now = self.now.clone();
        EmbeddedQueue::open(&self.dir, cfg, Arc::new(move || now.load(Ordering::SeqCst))).expect("open")
    }

    pub fn advance(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[allow(unused_imports)] // the conformance test file takes its own from the suite
pub use ember_queue::conformance::spec;
