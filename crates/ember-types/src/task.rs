//! Tasks: work queued for pull-based workers. The task record is both what the
//! queue persists and what `GET /v1/tasks/{id}` answers (one shape, so a
//! client sees exactly the history the queue keeps).
//!
//! Lifecycle: `Queued → Leased → Running → Succeeded | Failed | Cancelled |
//! DeadLettered`. A lease that expires, or an attempt that fails while attempts
//! remain, goes back to `Queued` for the next attempt.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Priority tier. Workers drain `interactive` before `standard` before
/// `batch`; aging keeps `batch` from starving.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Interactive,
    #[default]
    Standard,
    Batch,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Interactive, Tier::Standard, Tier::Batch];

    /// 0 for the most urgent tier.
    pub fn rank(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Interactive => "interactive",
            Tier::Standard => "standard",
            Tier::Batch => "batch",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskState {
    Queued,
    Leased,
    Running,
    Succeeded,
    /// A permanent error: the task cannot run as specified (unknown template,
    /// missing workspace). Not retried.
    Failed,
    Cancelled,
    /// Every attempt failed (or its lease expired); each reason is kept.
    DeadLettered,
}

impl TaskState {
    pub const ALL: [TaskState; 7] = [
        TaskState::Queued,
        TaskState::Leased,
        TaskState::Running,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Cancelled,
        TaskState::DeadLettered,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled | TaskState::DeadLettered)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Queued => "Queued",
            TaskState::Leased => "Leased",
            TaskState::Running => "Running",
            TaskState::Succeeded => "Succeeded",
            TaskState::Failed => "Failed",
            TaskState::Cancelled => "Cancelled",
            TaskState::DeadLettered => "DeadLettered",
        }
    }

    pub fn parse(s: &str) -> Option<TaskState> {
        TaskState::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// `POST /v1/tasks`. Only `command` is required.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubmitTaskRequest {
    /// argv of the command, run in a fresh sandbox of `template`.
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Mounted read-write at `/workspace`, under a lease taken by the attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Tier>,
    /// Idempotency key: a resubmission with the same key returns the same task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Seconds one attempt may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// Attempts before the task is dead-lettered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Lease duration in ms (ack wait); default from the daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// Heartbeat interval in ms; default from the daemon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Who the task is for; each tenant's running tasks are capped by the
    /// daemon's `--task-tenant-cap`. Absent: the tenant `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Opt-in: the task may run in a sandbox an earlier task of the same
    /// tenant and template ran in (and leave its own for a later one), where
    /// both allowed it and neither has a workspace. Every process of the
    /// earlier task is killed first; files it wrote are still there (see
    /// docs/tasks.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse_sandbox: Option<bool>,
}

/// The tenant of tasks submitted without one.
pub const DEFAULT_TENANT: &str = "default";

/// A task as validated and frozen at submit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskSpec {
    pub command: Vec<String>,
    pub template: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    pub tier: Tier,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub timeout_secs: u64,
    pub max_attempts: u32,
    pub lease_ms: u64,
    pub heartbeat_ms: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reuse_sandbox: bool,
}

impl TaskSpec {
    /// The tenant this task's running count is charged to.
    pub fn tenant(&self) -> &str {
        self.tenant.as_deref().unwrap_or(DEFAULT_TENANT)
    }

    /// The name under which the queue keeps this task's idempotency key:
    /// the key within its tenant (`tenant/key`), so two tenants' keys never
    /// meet (a second tenant's submit of a key answered the first tenant's
    /// task). A task of no tenant keeps the bare key, as before, unless the
    /// key has a `/`: then `/key`. Kept bare, the admin's key `acme/k` was
    /// tenant acme's key `k`, and either submit answered the other's task.
    /// A tenant's name has no `/` and is never empty, so no two scopes meet.
    pub fn idempotency_scope(&self) -> Option<String> {
        let key = self.key.as_ref()?;
        Some(match &self.tenant {
            Some(t) => format!("{t}/{key}"),
            None if key.contains('/') => format!("/{key}"),
            None => key.clone(),
        })
    }
}

/// One state change, with who made it and in which attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskTransition {
    pub state: TaskState,
    pub at_ms: i64,
    /// 0 before the first lease.
    pub attempt: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
}

/// One attempt: who ran it, where, and how it ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskAttempt {
    pub attempt: u32,
    pub worker: String,
    pub leased_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<i64>,
    /// The sandbox the attempt ran in; the next attempt destroys it before
    /// taking over the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// The workspace lease epoch this attempt wrote under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_epoch: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it did not succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl TaskAttempt {
    /// The node whose worker ran the attempt (its log is there): a worker is
    /// named `<node>-w<slot>.<generation>` (`worker_name`).
    pub fn node(&self) -> &str {
        worker_node(&self.worker)
    }
}

/// A worker's name: slot `slot` of node `node`, in its `generation`th life.
pub fn worker_name(node: &str, slot: u32, generation: u32) -> String {
    format!("{node}-w{slot}.{generation}")
}

/// The node part of a worker's name (the whole name if it is not one).
pub fn worker_node(worker: &str) -> &str {
    let Some((node, rest)) = worker.rsplit_once("-w") else { return worker };
    let ok = rest
        .split_once('.')
        .is_some_and(|(s, g)| !s.is_empty() && !g.is_empty() && s.bytes().chain(g.bytes()).all(|b| b.is_ascii_digit()));
    if ok {
        node
    } else {
        worker
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRecord {
    pub id: String,
    pub spec: TaskSpec,
    pub state: TaskState,
    pub submitted_at_ms: i64,
    /// Every state change, oldest first.
    pub transitions: Vec<TaskTransition>,
    pub attempts: Vec<TaskAttempt>,
}

impl TaskRecord {
    /// The current (latest) attempt number; 0 before the first lease.
    pub fn attempt(&self) -> u32 {
        self.attempts.len() as u32
    }

    pub fn transition(&mut self, state: TaskState, at_ms: i64, worker: Option<String>) {
        self.state = state;
        self.transitions.push(TaskTransition { state, at_ms, attempt: self.attempt(), worker });
    }

    /// When the given attempt reached `Running`.
    pub fn started_at(&self, attempt: u32) -> Option<i64> {
        self.attempts.get(attempt.checked_sub(1)? as usize)?.started_at_ms
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskList {
    pub items: Vec<TaskRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_and_states_round_trip_their_names() {
        for t in Tier::ALL {
            assert_eq!(Tier::parse(t.as_str()), Some(t));
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
        for s in TaskState::ALL {
            assert_eq!(TaskState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        assert!(Tier::Interactive.rank() < Tier::Batch.rank());
        assert_eq!(TaskState::ALL.iter().filter(|s| s.is_terminal()).count(), 4);
    }

    #[test]
    fn a_worker_name_names_its_node() {
        for node in ["a", "node-west", "n-w1", "host_2"] {
            assert_eq!(worker_node(&worker_name(node, 3, 12)), node);
        }
        // Not a worker's name: kept whole.
        for other in ["node", "node-w", "node-w1", "node-wx.1", "node-w1."] {
            assert_eq!(worker_node(other), other);
        }
    }
}
