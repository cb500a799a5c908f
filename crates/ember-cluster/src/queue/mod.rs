//! [`JetStreamQueue`]: the task queue on a NATS JetStream cluster.
//!
//! | queue | JetStream |
//! |---|---|
//! | a tier's waiting tasks | work-queue stream `<NAME>_TASKS_<TIER>` on `<name>.tasks.<tier>`, one durable pull consumer `workers` each |
//! | a task's record (state, attempts, history) | key `<id>` of bucket `<name>_tasks`, written only by compare-and-set on its revision |
//! | submit | record put, then publish of the id with `Nats-Msg-Id: <id>` |
//! | idempotency key | key of bucket `<name>_task_keys`, created at revision 0 (one winner), naming its task |
//! | lease | `fetch(1)` from the tiers in order, then the record moved Queued → Leased by compare-and-set |
//! | lease deadline | the consumer's `AckWait` ([`JetStreamConfig::ack_wait`]) |
//! | heartbeat | fencing check on the record, then `AckProgress` |
//! | succeeded / retry / fail | record, then `Ack` / `Nak` / `Term` |
//! | dead letter | record DeadLettered, a copy published to `<NAME>_TASKS_DEAD`, then `Term` |
//! | one live attempt per workspace | key `<workspace>` of bucket `<name>_task_workspaces`: the workspace's unfinished tasks in submission order; only the first may be leased, the others are Nak'd with a delay |
//! | expiry | the server redelivers after AckWait; the fetching worker fails the silent attempt |
//!
//! `MaxDeliver` stays unlimited: a Nak for a held workspace is a delivery
//! too, so attempts are counted in the record, which dead-letters at
//! `max_attempts`. Not yet here (refused at open, or ignored where said):
//! tier and tenant caps (refused), aging between tiers (tiers are taken
//! strictly in order), a per-task lease length (the consumer's AckWait is
//! every task's lease). docs/cluster.md has the failure model.
mod drained;
mod kv;
pub(crate) use kv::key_of;
mod lines;
mod ops;
mod setup;

pub(crate) use setup::settle_stream;

use crate::bridge::Bridge;
use ember_queue::{Clock, Expired, Lease, Outcome, Pruned, QueueConfig, QueueError, QueueStats, TaskFilter, TaskQueue};
use ember_types::task::{TaskRecord, TaskSpec};
use kv::Stored;
use ops::Inner;
use std::sync::Arc;
use std::time::Duration;

/// Where the cluster is and how the queue's streams are laid out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JetStreamConfig {
    /// `nats://host:port` of one or more servers of the cluster.
    pub servers: Vec<String>,
    /// Prefix of every stream, subject and bucket (several queues can share
    /// a cluster): `[a-z0-9_]+`.
    pub name: String,
    /// Replicas of every stream and bucket; `None` (the default): as the
    /// cluster keeps them, 3 on a cluster of three servers or more (R3
    /// survives one server), else 1 (`replicas.rs`).
    pub replicas: Option<usize>,
    /// The lease of every task: the consumers' AckWait.
    pub ack_wait: Duration,
    /// How long a task whose workspace another task holds waits (its Nak
    /// delay) before it is offered again.
    pub held_retry: Duration,
    /// Leased tasks per tier at most (the consumers' MaxAckPending).
    pub max_ack_pending: i64,
    /// How long a call retries through an election (see `retry.rs`).
    pub retry_budget: Duration,
    /// How long a tier this process saw drained counts as drained for
    /// [`TaskQueue::more_queued`] (`drained.rs`): the engine's idle poll
    /// interval, so no task waits longer for a worker than it would have.
    pub drained_for: Duration,
}

impl JetStreamConfig {
    pub fn new(servers: Vec<String>) -> JetStreamConfig {
        JetStreamConfig {
            servers,
            name: "ember".into(),
            replicas: None,
            ack_wait: Duration::from_secs(30),
            held_retry: Duration::from_secs(1),
            max_ack_pending: 10_000,
            retry_budget: crate::RETRY_BUDGET,
            drained_for: Duration::from_millis(250),
        }
    }
}

pub struct JetStreamQueue {
    inner: Arc<Inner>,
    bridge: Bridge,
}

impl JetStreamQueue {
    /// Connects, and creates the streams, consumers and buckets that do not
    /// exist yet (an existing one is used as it is, but for the two settings
    /// `setup.rs` settles).
    pub fn open(cfg: JetStreamConfig, queue: QueueConfig, clock: Clock) -> Result<JetStreamQueue, QueueError> {
        let refuse = |reason: &str| QueueError::Unavailable { op: "open", id: cfg.name.clone(), reason: reason.into() };
        if queue.tier_caps.iter().any(Option::is_some) || queue.tenant_cap.is_some() || !queue.tenant_caps.is_empty() {
            return Err(refuse("tier and tenant caps are not implemented by the JetStream backend yet"));
        }
        if cfg.name.is_empty() || !cfg.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
            return Err(refuse("the queue's name must be [a-z0-9_]+"));
        }
        let bridge = Bridge::new(&cfg.name)?;
        let name = cfg.name.clone();
        let inner = bridge.run("open", &name, Inner::connect(cfg, queue, clock))?;
        Ok(JetStreamQueue { inner: Arc::new(inner), bridge })
    }

    fn run<T: Send + 'static, F>(
        &self,
        op: &'static str,
        id: &str,
        f: impl FnOnce(Arc<Inner>) -> F,
    ) -> Result<T, QueueError>
    where
        F: std::future::Future<Output = Result<T, QueueError>> + Send + 'static,
    {
        self.bridge.run(op, id, f(Arc::clone(&self.inner)))
    }
}

impl TaskQueue for JetStreamQueue {
    fn submit(&self, id: &str, spec: TaskSpec) -> Result<(TaskRecord, bool), QueueError> {
        let id_ = id.to_string();
        self.run("submit", id, |q| async move { q.submit(&id_, spec).await })
    }

    fn lease(&self, worker: &str) -> Result<Option<(Lease, TaskRecord)>, QueueError> {
        let w = worker.to_string();
        self.run("lease", worker, |q| async move { q.lease(&w).await })
    }

    /// `false` when every tier was seen drained by this handle within
    /// [`JetStreamConfig::drained_for`] (`drained.rs`).
    fn more_queued(&self) -> bool {
        self.inner.drained.more()
    }

    fn heartbeat(&self, lease: &Lease) -> Result<(), QueueError> {
        let l = lease.clone();
        self.run("heartbeat", &lease.task, |q| async move { q.heartbeat(&l).await })
    }

    fn started(&self, lease: &Lease, sandbox: &str, workspace_epoch: Option<u64>) -> Result<TaskRecord, QueueError> {
        let (l, sb, w) = (lease.clone(), sandbox.to_string(), lease.worker.clone());
        self.run("started", &lease.task, |q| async move {
            q.update_live(&l, move |st: &mut Stored, now| {
                if let Some(a) = st.record.attempts.last_mut() {
                    (a.sandbox, a.workspace_epoch, a.started_at_ms) = (Some(sb.clone()), workspace_epoch, Some(now));
                }
                st.record.transition(ember_types::task::TaskState::Running, now, Some(w.clone()));
            })
            .await
        })
    }

    fn placed(&self, lease: &Lease, sandbox: &str) -> Result<(), QueueError> {
        let (l, sb) = (lease.clone(), sandbox.to_string());
        self.run("placed", &lease.task, |q| async move {
            q.update_live(&l, move |st: &mut Stored, _| {
                if let Some(a) = st.record.attempts.last_mut() {
                    a.sandbox = Some(sb.clone());
                }
            })
            .await
            .map(|_| ())
        })
    }

    fn finish(&self, lease: &Lease, outcome: Outcome) -> Result<TaskRecord, QueueError> {
        let l = lease.clone();
        self.run("finish", &lease.task, |q| async move { q.finish(&l, outcome).await })
    }

    /// Redelivery is the server's: this returns the expiries this handle's
    /// `lease` calls found (a redelivered task whose attempt was still live)
    /// since the last call.
    fn expire(&self) -> Result<Vec<Expired>, QueueError> {
        Ok(std::mem::take(&mut *self.inner.expired.lock().unwrap_or_else(|p| p.into_inner())))
    }

    fn cancel(&self, id: &str) -> Result<TaskRecord, QueueError> {
        let id_ = id.to_string();
        self.run("cancel", id, |q| async move { q.cancel(&id_).await })
    }

    fn prune(&self) -> Result<Vec<Pruned>, QueueError> {
        self.run("prune", "", |q| async move { q.prune().await })
    }

    fn get(&self, id: &str) -> Result<TaskRecord, QueueError> {
        let id_ = id.to_string();
        self.run("get", id, |q| async move {
            let st = q.records.load(&id_).await?;
            st.map(|(s, _)| s.record).ok_or(QueueError::NotFound(id_))
        })
    }

    /// Reads every record in one pass over the records bucket (an ordered
    /// consumer delivering each key's last value, `kv.rs` `values`): O(tasks)
    /// bytes, one request. A read that fails
    /// (through the retry budget: an election is waited out) is the error:
    /// an empty list in an outage passed a tenant's `tasks` quota, and
    /// `GET /v1/tasks` answered no tasks.
    fn list(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>, QueueError> {
        let filter = filter.clone();
        self.run("list", "", |q| async move { q.list(&filter).await })
    }

    /// From the consumers: pending messages (queued, including tasks waiting
    /// on a workspace or a Nak delay) and messages awaiting an ack (leased).
    fn stats(&self) -> QueueStats {
        self.run("stats", "", |q| async move { Ok(q.stats().await) }).unwrap_or_default()
    }
}
