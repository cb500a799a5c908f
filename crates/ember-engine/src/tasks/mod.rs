//! Tasks: queued work that the node's workers pull. See `worker.rs` for an
//! attempt's protocol and `ember_queue` for the queue and its leases.
//!
//! Layout: `mod.rs` (configuration, submit/get/list/cancel/logs),
//! `worker.rs` (the pull loop and one attempt), `commit.rs` (an attempt's
//! workspace layer committed or dropped), `execd.rs` (the command's outcome,
//! its stream read by `ember_agent_client`), `log.rs` (an attempt's log:
//! capped writes, reads from an offset), `metrics.rs`.
mod commit;
mod execd;
mod idle;
mod log;
mod metrics;
mod reuse;
#[cfg(test)]
mod upkeep_tests;
mod worker;

use crate::create::Provisioner;
use crate::sandbox::Sandboxes;
use crate::workspaces::Workspaces;
use crate::EngineError;
use ember_queue::{EmbeddedQueue, TaskQueue};
use ember_types::limits;
use ember_types::task::{SubmitTaskRequest, TaskRecord, TaskSpec, Tier};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

pub use ember_queue::{QueueConfig, QueueError, Retention, TaskFilter};
pub use ember_types::task::TaskState;
pub use log::{DEFAULT_LOG_LIMIT, LOG_READ_CHUNK};

/// Task settings of this node, validated by the binary and fixed at start.
#[derive(Clone, Debug)]
pub struct TaskConfig {
    /// Worker slots: at most this many attempts run at once on this node.
    pub workers: u32,
    /// Names this node's workers (`<node>-w<slot>.<generation>`).
    pub node: String,
    /// Default lease (ack wait) and heartbeat interval.
    pub lease: Duration,
    pub heartbeat: Duration,
    pub queue: QueueConfig,
    pub default_attempts: u32,
    pub default_timeout: Duration,
    /// Cap on one attempt's log; output past it is dropped after a marker.
    pub log_limit: u64,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            workers: 2,
            node: "node0".into(),
            lease: Duration::from_secs(10),
            heartbeat: Duration::from_secs(2),
            queue: QueueConfig::default(),
            default_attempts: 3,
            default_timeout: Duration::from_secs(3600),
            log_limit: log::DEFAULT_LOG_LIMIT,
        }
    }
}

/// The node's task machinery: the queue, its workers' wake-up, the logs.
pub struct TaskService {
    cfg: TaskConfig,
    queue: Arc<dyn TaskQueue>,
    logs: PathBuf,
    /// Wakes one idle worker (a permit is kept if none waits).
    wake: Notify,
    /// One idle worker at a time polls the queue (`worker.rs`, `idle_wait`).
    poller: std::sync::atomic::AtomicBool,
    metrics: metrics::TaskMetrics,
    /// Background removals of task sandboxes in flight (see `reuse.rs`).
    reapers: Arc<tokio::sync::Semaphore>,
}

/// The metadata key marking a sandbox as a task attempt's.
pub const TASK_LABEL: &str = "ember.task";

/// The node's tasks: the task machinery and what an attempt uses of the
/// node (its sandboxes, workspaces, the create path). Its loops hold it
/// weakly, so they end with the engine that owns it.
pub(crate) struct Tasks {
    svc: Arc<TaskService>,
    sandboxes: Arc<Sandboxes>,
    workspaces: Arc<Workspaces>,
    provision: Arc<Provisioner>,
    /// Upper bound on a sandbox's TTL, which bounds a task's timeout.
    max_ttl: Option<Duration>,
}

impl Tasks {
    /// Starts this node's workers and the upkeep thread (lease expiry,
    /// retention) on `queue`, or (`None`) on the embedded journal in the
    /// data dir.
    pub fn start(
        engine: &crate::EngineConfig,
        cfg: TaskConfig,
        queue: Option<Arc<dyn TaskQueue>>,
        services: (Arc<Sandboxes>, Arc<Workspaces>, Arc<Provisioner>),
    ) -> Result<Arc<Tasks>, EngineError> {
        let (sandboxes, workspaces, provision) = services;
        let queue = match queue {
            Some(q) => q,
            None => {
                let dir = engine.data_dir.join("state/tasks");
                let q = EmbeddedQueue::open(&dir, cfg.queue.clone(), ember_queue::system_clock())?;
                if q.damaged > 0 {
                    tracing::warn!(lines = q.damaged, "task journal: damaged lines skipped");
                }
                Arc::new(q) as Arc<dyn TaskQueue>
            }
        };
        let logs = engine.data_dir.join("tasks/logs");
        std::fs::create_dir_all(&logs).map_err(|source| EngineError::Store { path: logs.clone(), source })?;
        let svc = Arc::new(TaskService {
            cfg: cfg.clone(),
            queue,
            logs,
            wake: Notify::new(),
            poller: Default::default(),
            metrics: metrics::TaskMetrics::new(),
            reapers: Arc::new(tokio::sync::Semaphore::new(cfg.workers.max(1) as usize)),
        });
        let tasks = Arc::new(Tasks { svc: svc.clone(), sandboxes, workspaces, provision, max_ttl: engine.max_ttl });
        for slot in 0..cfg.workers {
            tokio::spawn(worker::worker_loop(Arc::downgrade(&tasks), svc.clone(), slot));
        }
        let engine = Arc::downgrade(&tasks);
        worker::spawn_upkeep(move || engine.strong_count() > 0, svc)
            .map_err(|e| EngineError::Internal(format!("starting the task upkeep's thread: {e}")))?;
        Ok(tasks)
    }

    /// Validates and enqueues a task; `false` when its key named an existing one.
    pub async fn submit_task(&self, req: SubmitTaskRequest) -> Result<(TaskRecord, bool), EngineError> {
        let svc = &self.svc;
        let c = &svc.cfg;
        if req.command.is_empty() || req.command[0].is_empty() {
            return Err(EngineError::invalid("command", "an argv with at least the program is required"));
        }
        if req.reuse_sandbox == Some(true) && req.workspace.is_some() {
            return Err(EngineError::invalid(
                "reuseSandbox",
                "a task with a workspace always gets a sandbox of its own",
            ));
        }
        let template = req.template.unwrap_or_else(|| "host".into());
        crate::templates::builtin(&template).ok_or_else(|| EngineError::UnknownTemplate(template.clone()))?;
        if let Some(w) = &req.workspace {
            self.workspaces.meta(w)?;
        }
        let max_attempts = req.attempts.unwrap_or(c.default_attempts);
        limits::check("attempts", max_attempts.into(), 1, limits::MAX_TASK_ATTEMPTS.into(), "")?;
        // The attempt's sandbox lives TASK_GRACE_SECS longer than the task
        // may run, within the same caps.
        let max_sandbox = self.max_ttl.map_or(limits::MAX_TIMEOUT_SECS, |m| m.as_secs());
        let max = max_sandbox.saturating_sub(limits::TASK_GRACE_SECS);
        let timeout_secs =
            limits::timeout_secs("timeout", req.timeout.unwrap_or(c.default_timeout.as_secs().min(max)), Some(max))?;
        let lease_ms = req.lease_ms.unwrap_or(c.lease.as_millis() as u64);
        let lease_ms = limits::check("leaseMs", lease_ms, limits::MIN_LEASE_MS, limits::MAX_LEASE_MS, " ms")?;
        let heartbeat_ms = req.heartbeat_ms.unwrap_or(c.heartbeat.as_millis() as u64);
        limits::check("heartbeatMs", heartbeat_ms, limits::MIN_HEARTBEAT_MS, lease_ms - 1, " ms (below leaseMs)")?;
        if req.key.as_ref().is_some_and(|k| k.is_empty() || k.len() > 256) {
            return Err(EngineError::invalid("key", "1 to 256 characters"));
        }
        if let Some(t) = &req.tenant {
            check_tenant(t).map_err(|m| EngineError::invalid("tenant", m))?;
        }
        let spec = TaskSpec {
            command: req.command,
            template,
            workspace: req.workspace,
            tier: req.tier.unwrap_or(Tier::Standard),
            key: req.key,
            timeout_secs,
            max_attempts,
            lease_ms,
            heartbeat_ms,
            env: req.env,
            tenant: req.tenant,
            reuse_sandbox: req.reuse_sandbox.unwrap_or(false),
        };
        let id = task_id(&spec);
        let out = svc.call("submit", &id.clone(), move |q| q.submit(&id, spec)).await?;
        if out.1 {
            svc.wake.notify_one();
        }
        Ok(out)
    }

    pub async fn task(&self, id: &str) -> Result<TaskRecord, EngineError> {
        let id_ = id.to_string();
        Ok(self.svc.call("get", id, move |q| q.get(&id_)).await?)
    }

    pub async fn list_tasks(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>, EngineError> {
        let f = filter.clone();
        Ok(self.svc.call("list", "", move |q| q.list(&f)).await?)
    }

    /// Cancels a task; a running attempt's sandbox is destroyed.
    pub async fn cancel_task(&self, id: &str) -> Result<TaskRecord, EngineError> {
        let id_ = id.to_string();
        let rec = self.svc.call("cancel", id, move |q| q.cancel(&id_)).await?;
        if let Some(sb) = rec.attempts.last().and_then(|a| a.sandbox.clone()) {
            let _ = self.sandboxes.remove(&sb).await;
        }
        Ok(rec)
    }

    /// At most `LOG_READ_CHUNK` bytes of an attempt's log (default: the
    /// latest) from `offset`, and whether that attempt had ended before the
    /// read (then an empty read is the end of the log).
    pub async fn task_log(
        &self,
        id: &str,
        attempt: Option<u32>,
        offset: u64,
    ) -> Result<(Vec<u8>, bool, u32), EngineError> {
        let svc = &self.svc;
        let rec = self.task(id).await?;
        let n = attempt.unwrap_or(rec.attempt());
        if n > rec.attempt() {
            return Err(EngineError::invalid("attempt", format!("task {id} has {} attempts", rec.attempt())));
        }
        let ended = rec.state.is_terminal()
            || n == 0
            || rec.attempts.get(n as usize - 1).is_some_and(|a| a.ended_at_ms.is_some());
        let data = log::read_from(&svc.log_path(id, n), offset).await?;
        Ok((data, ended, n))
    }

    /// The task metrics' text exposition, or `None` when tasks are off.
    pub fn encode_task_metrics(&self) -> Option<String> {
        Some(self.svc.metrics.encode(&self.svc.queue.stats()))
    }
}

impl TaskService {
    /// Runs a queue call on the blocking pool: a cluster queue's call may
    /// wait through a leader election (its retry budget, up to 30 s), which
    /// must not hold one of the few async workers the API runs on.
    async fn call<T: Send + 'static>(
        &self,
        op: &'static str,
        id: &str,
        f: impl FnOnce(&dyn TaskQueue) -> Result<T, QueueError> + Send + 'static,
    ) -> Result<T, QueueError> {
        let q = self.queue.clone();
        tokio::task::spawn_blocking(move || f(&*q)).await.map_err(|e| QueueError::Unavailable {
            op,
            id: id.to_string(),
            reason: format!("the queue call did not finish: {e}"),
        })?
    }

    fn log_path(&self, id: &str, attempt: u32) -> PathBuf {
        self.logs.join(format!("{id}.{attempt}.log"))
    }
}

/// A new task's id: random, or for a task with an idempotency key derived
/// from the key within its tenant, so that a retry of a submit whose node
/// died half-way continues that submit under the same id. With a random id
/// the retry found the key claimed by a task whose record never came, and
/// waited out the queue's retry budget (30 s) before taking the key over: a
/// session's submit hung 30 s across its node's SIGKILL in the drill.
fn task_id(spec: &TaskSpec) -> String {
    use sha2::Digest;
    match spec.idempotency_scope() {
        Some(scope) => format!("t-{}", hex(&sha2::Sha256::digest(scope.as_bytes())[..8])),
        None => format!("t-{}", hex(&crate::create::random16()[..8])),
    }
}

/// A tenant name: 1 to 64 of `[A-Za-z0-9._-]` (it appears in flags and metrics).
pub fn check_tenant(t: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    ok.then_some(()).ok_or_else(|| format!("tenant {t:?}: 1 to 64 of A-Z a-z 0-9 . _ -"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl From<QueueError> for EngineError {
    fn from(e: QueueError) -> Self {
        EngineError::Task(e)
    }
}

#[cfg(test)]
mod id_tests {
    use super::task_id;
    use ember_types::task::{TaskSpec, Tier};

    fn keyed(key: Option<&str>, tenant: Option<&str>) -> TaskSpec {
        TaskSpec {
            command: vec!["true".into()],
            template: "host".into(),
            workspace: None,
            tier: Tier::Standard,
            key: key.map(Into::into),
            timeout_secs: 60,
            max_attempts: 1,
            lease_ms: 1_000,
            heartbeat_ms: 300,
            env: Default::default(),
            tenant: tenant.map(Into::into),
            reuse_sandbox: false,
        }
    }

    /// A retry of a keyed submit names the same task; another tenant's
    /// key, another task; no key, a new id each time.
    #[test]
    fn a_keyed_task_id_is_its_key_within_its_tenant() {
        let a = task_id(&keyed(Some("k"), Some("acme")));
        assert_eq!(a, task_id(&keyed(Some("k"), Some("acme"))));
        assert_ne!(a, task_id(&keyed(Some("k"), Some("globex"))));
        assert_ne!(a, task_id(&keyed(Some("k"), None)));
        assert_ne!(task_id(&keyed(None, None)), task_id(&keyed(None, None)));
        assert!(a.starts_with("t-") && a.len() == 18, "{a}");
    }
}
