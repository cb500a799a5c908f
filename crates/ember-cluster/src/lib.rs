//! ember's cluster mode on NATS JetStream. This first step holds the task
//! queue's cluster backend, [`JetStreamQueue`]: the same [`ember_queue::TaskQueue`]
//! the embedded journal implements, on work-queue streams and key-value
//! buckets replicated across the cluster (docs/cluster.md); and a cluster
//! node (`node/`): the node and sandbox registries and [`ClusterPlane`], the
//! engine's `ControlPlane` routed to the node holding each sandbox.
//!
//! Layout: `queue/` (the backend: `mod.rs` the sync API, `ops.rs` the
//! protocol, `kv.rs` the records and compare-and-set), `bridge.rs` (the
//! runtime of its own the sync calls run on), `retry.rs` (the retry policy
//! through a leader election), `store/` ([`NatsStore`]: the snapshot
//! store on the JetStream object store).
#![forbid(unsafe_code)]

mod bridge;
pub mod connect;
pub mod node;
pub mod queue;
pub mod replicas;
mod retry;
pub mod store;

pub use node::{ClusterPlane, NodeConfig};
pub use queue::{JetStreamConfig, JetStreamQueue};
pub use retry::RETRY_BUDGET;
pub use store::{NatsBucket, NatsStore, NatsStoreConfig};
