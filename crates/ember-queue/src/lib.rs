//! ember's task queue: one [`TaskQueue`] trait and its backends. Workers pull:
//! nothing here pushes a task to a chosen worker. A task is leased to exactly
//! one worker at a time; a lease carries a deadline that the worker's
//! heartbeats renew, and a lease that is not renewed expires and the task goes
//! back to the queue for its next attempt.
//!
//! The trait is shaped after a NATS JetStream work-queue consumer, so the
//! cluster backend can implement it without changing the workers:
//!
//! | trait | JetStream |
//! |---|---|
//! | [`TaskQueue::submit`] with a key | publish with `Nats-Msg-Id` (dedup window) |
//! | [`TaskQueue::lease`] | pull consumer `fetch(1)` |
//! | [`Lease`] deadline (`TaskSpec::lease_ms`) | `AckWait` |
//! | [`TaskQueue::heartbeat`] | `AckProgress` (`+WPI`) |
//! | [`Outcome::Succeeded`] / [`Outcome::Retry`] / [`Outcome::Fail`] | `Ack` / `Nak` / `Term` |
//! | `TaskSpec::max_attempts` → `DeadLettered` | `MaxDeliver` + advisory |
//! | [`TaskQueue::expire`] | server-side redelivery (a no-op there) |
//! | one live attempt per workspace | a KV bucket with one key per held workspace, created (revision 0) when a fetched task is kept, deleted at its Ack/Nak/Term, TTL = AckWait; a fetched task whose key exists is Nak'd with a delay |
//!
//! Layout: `embedded.rs` (the single-node backend), `journal.rs` (its durable
//! log), `pick.rs` (tier order with aging, pure).
#![forbid(unsafe_code)]

#[cfg(feature = "testing")]
pub mod conformance;
mod embedded;
mod journal;
pub mod pick;
mod sync;

pub use embedded::EmbeddedQueue;

use ember_types::task::{TaskRecord, TaskSpec, TaskState, Tier};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// A grant to run one attempt of one task. Every later call about the attempt
/// carries it; a lease that is no longer the task's current one is refused
/// with [`QueueError::Fenced`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub task: String,
    pub attempt: u32,
    pub worker: String,
}

/// How an attempt ended, as the worker reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The command exited 0 (ack).
    Succeeded,
    /// The attempt failed; retried while attempts remain, else dead-lettered (nak).
    Retry { reason: String, exit_code: Option<i32> },
    /// The task can never run as specified; not retried (term).
    Fail { reason: String },
}

/// A lease that ran out without being renewed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expired {
    pub task: String,
    pub attempt: u32,
    pub worker: String,
    pub tier: Tier,
    /// Time from the last heartbeat to detection: the measured MTTD.
    pub silent_ms: i64,
    /// Where the task went: `Queued` or `DeadLettered`.
    pub now: TaskState,
}

/// Which tasks `list` returns; empty fields match everything.
#[derive(Clone, Debug, Default)]
pub struct TaskFilter {
    pub states: Vec<TaskState>,
    pub tiers: Vec<Tier>,
    pub workspace: Option<String>,
}

impl TaskFilter {
    pub fn matches(&self, r: &TaskRecord) -> bool {
        (self.states.is_empty() || self.states.contains(&r.state))
            && (self.tiers.is_empty() || self.tiers.contains(&r.spec.tier))
            && self.workspace.as_ref().is_none_or(|w| r.spec.workspace.as_ref() == Some(w))
    }
}

/// Queue depth and load, per tier (indexed by [`Tier::rank`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub queued: [u64; 3],
    /// Leased or running.
    pub active: [u64; 3],
}

/// Scheduling and retention settings, fixed at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueConfig {
    /// A task waiting this long moves up one tier in the pick order, so
    /// `batch` waits at most two agings behind a stream of `interactive` work.
    pub aging_ms: i64,
    /// At most this many leased or running tasks per tier (`None`: no cap).
    pub tier_caps: [Option<u32>; 3],
    /// At most this many leased or running tasks per tenant: the tenant's own
    /// entry in `tenant_caps`, else `tenant_cap` (`None`: no cap).
    pub tenant_cap: Option<u32>,
    pub tenant_caps: BTreeMap<String, u32>,
    pub retention: Retention,
}

impl QueueConfig {
    /// The cap on `tenant`'s leased or running tasks.
    pub fn cap_of(&self, tenant: &str) -> Option<u32> {
        self.tenant_caps.get(tenant).copied().or(self.tenant_cap)
    }

    pub(crate) fn caps_tenants(&self) -> bool {
        self.tenant_cap.is_some() || !self.tenant_caps.is_empty()
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            aging_ms: 30_000,
            tier_caps: [None; 3],
            tenant_cap: None,
            tenant_caps: BTreeMap::new(),
            retention: Retention::default(),
        }
    }
}

/// How long finished tasks (Succeeded, Failed, Cancelled, DeadLettered) are
/// kept: [`TaskQueue::prune`] drops those that ended more than `max_age_ms`
/// ago, then the oldest beyond `max_finished`. A dropped task is gone from
/// `get`, `list` and the journal, and its idempotency key is free again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    pub max_age_ms: Option<i64>,
    pub max_finished: Option<usize>,
}

/// A finished task that [`TaskQueue::prune`] dropped; its caller removes
/// what it kept beside the queue (the attempts' logs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pruned {
    pub task: String,
    pub attempts: u32,
}

/// Wall-clock milliseconds. Injected so tests can move time.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
    })
}

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("task {0} not found")]
    NotFound(String),
    #[error("task {task}: attempt {attempt} of worker {worker} no longer holds the lease (task is {state:?}, attempt {current}); its report is refused")]
    Fenced { task: String, attempt: u32, worker: String, current: u32, state: TaskState },
    #[error("task {task} already ended ({state:?})")]
    Finished { task: String, state: TaskState },
    /// The queue's backing service did not answer within the backend's
    /// retry budget (a JetStream cluster without quorum for that long).
    #[error("task queue unavailable: {op} {id}: {reason}")]
    Unavailable { op: &'static str, id: String, reason: String },
    #[error("task journal {path}")]
    Journal {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The queue every backend implements. Calls are synchronous and short; async
/// callers cross over with `spawn_blocking` or accept the few microseconds.
pub trait TaskQueue: Send + Sync {
    /// Enqueues `spec` as task `id`. With a key the queue already knows, the
    /// existing task is returned instead and `false` says so.
    fn submit(&self, id: &str, spec: TaskSpec) -> Result<(TaskRecord, bool), QueueError>;
    /// The next task `worker` may run, leased to it (Queued → Leased), or
    /// `None`. Call only with a free slot. A task whose workspace a live
    /// attempt (leased or running, of any task) holds is not leased until
    /// that attempt ends or its lease expires; one workspace's waiting tasks
    /// start in submission order within a tier (`pick::first_runnable` takes
    /// the held workspaces as input, so a backend supplies them as it can).
    fn lease(&self, worker: &str) -> Result<Option<(Lease, TaskRecord)>, QueueError>;
    /// Whether work may be left to lease, asked right after a lease: a
    /// worker that leased hands its wake-up on to another idle worker only
    /// then. A hint, never a promise; `true` when the backend cannot tell
    /// cheaply (the default). Work that arrives later is found as it always
    /// is: by the node's polling idle worker, a submit on the node, or an
    /// expired lease.
    fn more_queued(&self) -> bool {
        true
    }
    /// Renews the lease's deadline.
    fn heartbeat(&self, lease: &Lease) -> Result<(), QueueError>;
    /// The attempt's command started in `sandbox` (Leased → Running).
    fn started(&self, lease: &Lease, sandbox: &str, workspace_epoch: Option<u64>) -> Result<TaskRecord, QueueError>;
    /// Records that the attempt runs in `sandbox` before it started, so the
    /// next attempt can destroy it even if this one never reports again.
    fn placed(&self, lease: &Lease, sandbox: &str) -> Result<(), QueueError>;
    /// Reports the attempt's end; accepted only from the current lease.
    fn finish(&self, lease: &Lease, outcome: Outcome) -> Result<TaskRecord, QueueError>;
    /// Returns every lease past its deadline to the queue (or dead-letters it).
    fn expire(&self) -> Result<Vec<Expired>, QueueError>;
    fn cancel(&self, id: &str) -> Result<TaskRecord, QueueError>;
    /// Drops finished tasks past the retention (see [`Retention`]).
    fn prune(&self) -> Result<Vec<Pruned>, QueueError>;
    fn get(&self, id: &str) -> Result<TaskRecord, QueueError>;
    /// Matching tasks, oldest first. A queue it cannot read whole is an
    /// error, never a shorter list: a tenant's `tasks` quota counts from it.
    fn list(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>, QueueError>;
    fn stats(&self) -> QueueStats;
}
