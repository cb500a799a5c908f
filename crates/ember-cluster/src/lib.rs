//! ember's cluster mode on NATS JetStream. This first step holds the task
//! queue's cluster backend, [`JetStreamQueue`]: the same [`ember_queue::TaskQueue`]
//! the embedded journal implements, on work-queue streams and key-value
//! buckets replicated across the cluster (docs/cluster.md). The node
//! registry, the sandbox registry and request forwarding come later.
//!
//! Layout: `queue/` (the backend: `mod.rs` the sync API, `ops.rs` the
//! protocol, `kv.rs` the records and compare-and-set), `bridge.rs` (the
//! runtime of its own the sync calls run on), `retry.rs` (the retry policy
//! through a leader election).
#![forbid(unsafe_code)]

mod bridge;
pub mod queue;
mod retry;

pub use queue::{JetStreamConfig, JetStreamQueue};
pub use retry::RETRY_BUDGET;
