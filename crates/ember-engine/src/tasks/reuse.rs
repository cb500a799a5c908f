//! The attempt's sandbox: its own (created or claimed warm, `own_sandbox`),
//! or one its worker kept; and what happens to it once the result is recorded.
//!
//! By default it is removed. For a task without a workspace the removal runs
//! in the background (the reaper), so the worker's slot frees as soon as the
//! result is recorded; at most one removal per worker is in flight, so they
//! cannot pile up. For a task with a workspace the worker removes it itself
//! before pulling again: its processes must be gone before anyone else could
//! take that workspace.
//!
//! Opt-in reuse (`reuseSandbox`): after a task that succeeded, its worker may
//! keep the sandbox for its next task when both tasks allowed it, belong to
//! the same tenant, use the same template and have no workspace. Before the
//! next task runs, every process in the sandbox but the agent is killed
//! (`Runtime::reset`); its files are kept. Only a succeeded task's sandbox is
//! kept: no later attempt of it exists, so nothing will fence (destroy) the
//! sandbox while the next task runs in it.
use super::TaskService;
use super::Tasks;
use crate::{CreateSandbox, EngineError, WorkspaceRequest};
use ember_queue::{Lease, Outcome};
use ember_types::limits;
use ember_types::task::{TaskRecord, TaskSpec};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A worker gives a kept sandbox up after being idle this long.
pub(super) const KEEP_IDLE: Duration = Duration::from_secs(2);

/// A sandbox a worker kept after a task that succeeded and allowed reuse.
pub(super) struct Kept {
    pub id: String,
    pub template: String,
    pub tenant: String,
}

impl Kept {
    pub fn after(id: String, spec: &TaskSpec) -> Kept {
        Kept { id, template: spec.template.clone(), tenant: spec.tenant().to_string() }
    }

    /// Whether a task with `spec` may run in this sandbox.
    pub fn fits(&self, spec: &TaskSpec) -> bool {
        reusable(spec) && self.template == spec.template && self.tenant == spec.tenant()
    }
}

/// Whether a task with `spec` may share its sandbox at all.
pub(super) fn reusable(spec: &TaskSpec) -> bool {
    spec.reuse_sandbox && spec.workspace.is_none()
}

/// Removes sandbox `id`: `inline` waits for it, else the reaper does it.
pub(super) async fn release(e: &Arc<Tasks>, svc: &Arc<TaskService>, id: String, inline: bool) {
    if inline {
        return remove(e, &id).await;
    }
    // The semaphore is never closed; a failure to acquire falls back to inline.
    let Ok(permit) = svc.reapers.clone().acquire_owned().await else { return remove(e, &id).await };
    let e = e.clone();
    tokio::spawn(async move {
        remove(&e, &id).await;
        drop(permit);
    });
}

async fn remove(e: &Arc<Tasks>, id: &str) {
    match e.sandboxes.remove(id).await {
        Ok(()) | Err(EngineError::NotFound(_)) => {}
        Err(err) => tracing::warn!(sandbox = %id, error = %err, "removing a task sandbox failed"),
    }
}

/// Creates (or claims warm) the attempt's own sandbox, workspace mounted with
/// a fresh epoch; on failure, the outcome to report.
pub(super) async fn own_sandbox(
    e: &Arc<Tasks>,
    svc: &Arc<TaskService>,
    lease: &Lease,
    rec: &TaskRecord,
) -> Result<(String, Option<u64>), Outcome> {
    let spec = &rec.spec;
    let req = CreateSandbox {
        template: Some(spec.template.clone()),
        ttl_secs: Some(spec.timeout_secs.saturating_add(limits::TASK_GRACE_SECS)),
        metadata: BTreeMap::from([
            (super::TASK_LABEL.to_string(), rec.id.clone()),
            ("ember.task.attempt".to_string(), lease.attempt.to_string()),
        ]),
        workspaces: spec
            .workspace
            .iter()
            .map(|w| WorkspaceRequest {
                name: w.clone(),
                path: "/workspace".into(),
                read_only: false,
                steal: true,
                create_size: None,
                // The attempt's writes reach the workspace only if it succeeds.
                layered: true,
            })
            .collect(),
        // Warm only from the task's tenant's pools.
        tenant: Some(spec.tenant().to_string()),
        ..Default::default()
    };
    // Not raced against a refused heartbeat: a create dropped half-way would
    // leave a sandbox nobody removes. A fenced attempt learns it just below.
    let t = Instant::now();
    let created = e.provision.create(req).await;
    svc.metrics.phase("sandbox", t);
    let sb = match created {
        Ok(sb) => sb,
        Err(err @ (EngineError::UnknownTemplate(_) | EngineError::InvalidRequest { .. })) => {
            return Err(Outcome::Fail { reason: format!("cannot create the sandbox: {err}") });
        }
        Err(err) => {
            return Err(Outcome::Retry { reason: format!("cannot create the sandbox: {err}"), exit_code: None });
        }
    };
    let epoch = sb.workspaces.iter().find_map(|w| w.epoch);
    Ok((sb.id.to_string(), epoch))
}
