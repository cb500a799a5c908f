//! Workers: each is one slot that pulls a task only when it is free.
//!
//! One attempt, in steps:
//! 1. lease the task (the queue picks by tier, with aging);
//! 2. fence earlier attempts: destroy every sandbox an earlier attempt of this
//!    task ran in, so none of them can write the workspace again;
//! 3. heartbeat every `heartbeatMs` while the attempt's sandbox lives; a
//!    refused heartbeat (lease expired, task cancelled) aborts the attempt;
//! 4. create (or claim warm) a sandbox of the task's template, mounting the
//!    workspace read-write with `steal` (a fresh lease epoch);
//! 5. run the command through the agent, appending its output to the log;
//! 6. report the outcome, accepted only while this lease is current (and
//!    only while the workspace epoch is still this attempt's);
//! 7. remove the sandbox.
//!
//! A worker whose sandbox died under it (the command's stream was cut)
//! behaves as a crashed worker would: it reports nothing, and its lease
//! expires, which is the one failure-detection path (MTTD). It then restarts
//! as a new generation, so the retry is always another worker's.
use super::execd::{self, ExecEnd};
use super::TaskService;
use crate::{CreateSandbox, Engine, EngineError, WorkspaceRequest};
use ember_queue::{Lease, Outcome, QueueError};
use ember_types::execd::RunCommandRequest;
use ember_types::task::{TaskRecord, TaskState};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// The pull loop of worker `slot`.
pub(super) async fn worker_loop(engine: Weak<Engine>, svc: Arc<TaskService>, slot: u32) {
    let mut generation = 1u32;
    loop {
        let name = format!("{}-w{slot}.{generation}", svc.cfg.node);
        let t = Instant::now();
        match svc.queue.lease(&name) {
            Ok(Some((lease, rec))) => {
                svc.metrics.phase("lease", t);
                // There may be more: pass the wake-up on to another idle worker.
                svc.wake.notify_one();
                let Some(e) = engine.upgrade() else { return };
                if !run_attempt(&e, &svc, lease, rec).await {
                    generation += 1;
                }
            }
            Ok(None) => {
                if engine.strong_count() == 0 {
                    return;
                }
                tokio::select! {
                    _ = svc.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
            Err(err) => {
                tracing::error!(worker = %name, error = %err, "leasing a task failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Returns expired leases to the queue, counting them and their MTTD.
pub(super) async fn expiry_loop(engine: Weak<Engine>, svc: Arc<TaskService>) {
    loop {
        tokio::time::sleep(Duration::from_millis(25)).await;
        if engine.strong_count() == 0 {
            return;
        }
        match svc.queue.expire() {
            Ok(expired) => {
                for x in &expired {
                    svc.metrics.lease_expiries.inc();
                    svc.metrics.outcome("expired");
                    svc.metrics.mttd_seconds.observe(x.silent_ms as f64 / 1e3);
                    tracing::info!(task = %x.task, attempt = x.attempt, worker = %x.worker, silent_ms = x.silent_ms, now = ?x.now, "task lease expired");
                }
                if expired.iter().any(|x| x.now == TaskState::Queued) {
                    svc.wake.notify_one();
                }
            }
            Err(err) => tracing::error!(error = %err, "expiring task leases failed"),
        }
    }
}

/// Runs one attempt; `false` when the worker lost its sandbox and must be
/// treated as dead.
async fn run_attempt(e: &Arc<Engine>, svc: &Arc<TaskService>, lease: Lease, rec: TaskRecord) -> bool {
    let tier = ember_types::task::Tier::as_str(rec.spec.tier).to_string();
    if let Some(q) = rec.transitions.iter().rev().find(|t| t.state == TaskState::Queued) {
        let waited = rec.transitions.last().map_or(0, |l| l.at_ms - q.at_ms).max(0);
        svc.metrics.queued_seconds.get_or_create(&super::metrics::TierLabels { tier }).observe(waited as f64 / 1e3);
    }
    let t = Instant::now();
    fence_earlier_attempts(e, &rec).await;
    svc.metrics.phase("fence", t);

    // Heartbeats: stop when the sandbox is gone, abort the attempt when refused.
    let sandbox: Arc<Mutex<Option<String>>> = Arc::default();
    let (fenced_tx, fenced_rx) = tokio::sync::oneshot::channel::<QueueError>();
    let hb = tokio::spawn(heartbeat(e.clone(), svc.clone(), lease.clone(), sandbox.clone(), fenced_tx));

    let alive = attempt(e, svc, &lease, &rec, &sandbox, fenced_rx).await;
    hb.abort();
    let sb = sandbox.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(sb) = sb {
        let t = Instant::now();
        let removed = e.remove(&sb).await;
        svc.metrics.phase("remove", t);
        if let Err(err) = removed {
            if !matches!(err, EngineError::NotFound(_)) {
                tracing::warn!(sandbox = %sb, error = %err, "removing a task sandbox failed");
            }
        }
    }
    alive
}

async fn heartbeat(
    e: Arc<Engine>,
    svc: Arc<TaskService>,
    lease: Lease,
    sandbox: Arc<Mutex<Option<String>>>,
    fenced: tokio::sync::oneshot::Sender<QueueError>,
) {
    let every = Duration::from_millis(svc.queue.get(&lease.task).map_or(1_000, |r| r.spec.heartbeat_ms));
    loop {
        tokio::time::sleep(every).await;
        let sb = sandbox.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if sb.is_some_and(|s| !e.is_alive(&s)) {
            return;
        }
        if let Err(err) = svc.queue.heartbeat(&lease) {
            let _ = fenced.send(err);
            return;
        }
    }
}

/// Destroys every live sandbox of an earlier attempt of this task: the ones
/// the queue recorded, and any labelled with the task (an attempt that died
/// between its create and its report).
async fn fence_earlier_attempts(e: &Arc<Engine>, rec: &TaskRecord) {
    let mut ids: Vec<String> = rec.attempts.iter().rev().skip(1).filter_map(|a| a.sandbox.clone()).collect();
    let labelled = crate::ListFilter { states: vec![], metadata: vec![(super::TASK_LABEL.into(), rec.id.clone())] };
    ids.extend(e.list(&labelled).into_iter().map(|r| r.id.to_string()));
    ids.sort();
    ids.dedup();
    for id in ids {
        match e.remove(&id).await {
            Ok(()) => tracing::info!(task = %rec.id, sandbox = %id, "destroyed an earlier attempt's sandbox"),
            Err(EngineError::NotFound(_)) => {}
            Err(err) => {
                tracing::warn!(task = %rec.id, sandbox = %id, error = %err, "fencing an earlier attempt failed")
            }
        }
    }
}

async fn attempt(
    e: &Arc<Engine>,
    svc: &Arc<TaskService>,
    lease: &Lease,
    rec: &TaskRecord,
    sandbox: &Mutex<Option<String>>,
    fenced: tokio::sync::oneshot::Receiver<QueueError>,
) -> bool {
    let spec = &rec.spec;
    // Resolves only with a refusal (a heartbeat loop that just stops is no verdict).
    let fenced = async move {
        match fenced.await {
            Ok(err) => err,
            Err(_) => std::future::pending().await,
        }
    };
    tokio::pin!(fenced);
    let finish = |outcome: Outcome| {
        let label = match &outcome {
            Outcome::Succeeded => "succeeded",
            Outcome::Retry { .. } => "failed",
            Outcome::Fail { .. } => "rejected",
        };
        let t = Instant::now();
        match svc.queue.finish(lease, outcome) {
            Ok(_) => svc.metrics.outcome(label),
            Err(err) => tracing::warn!(task = %lease.task, error = %err, "an attempt's report was refused"),
        }
        svc.metrics.phase("finish", t);
    };
    let req = CreateSandbox {
        template: Some(spec.template.clone()),
        ttl_secs: Some(spec.timeout_secs + 120),
        metadata: BTreeMap::from([
            (super::TASK_LABEL.to_string(), rec.id.clone()),
            ("ember.task.attempt".to_string(), lease.attempt.to_string()),
        ]),
        workspaces: spec
            .workspace
            .iter()
            .map(|w| WorkspaceRequest { name: w.clone(), path: "/workspace".into(), read_only: false, steal: true })
            .collect(),
        ..Default::default()
    };
    // Not raced against a refused heartbeat: a create dropped half-way would
    // leave a sandbox nobody removes. A fenced attempt learns it just below.
    let t = Instant::now();
    let created = e.create(req).await;
    svc.metrics.phase("sandbox", t);
    let sb = match created {
        Ok(sb) => sb,
        Err(err @ (EngineError::UnknownTemplate(_) | EngineError::InvalidRequest { .. })) => {
            finish(Outcome::Fail { reason: format!("cannot create the sandbox: {err}") });
            return true;
        }
        Err(err) => {
            finish(Outcome::Retry { reason: format!("cannot create the sandbox: {err}"), exit_code: None });
            return true;
        }
    };
    *sandbox.lock().unwrap_or_else(|p| p.into_inner()) = Some(sb.id.to_string());
    let epoch = sb.workspaces.iter().find_map(|w| w.epoch);
    let t = Instant::now();
    let started = svc.queue.started(lease, sb.id.as_str(), epoch);
    svc.metrics.phase("started", t);
    if let Err(err) = started {
        tracing::info!(task = %lease.task, error = %err, "attempt fenced before its command");
        return true;
    }
    let t_exec = Instant::now();
    let Ok(socket) = e.agent_socket(sb.id.as_str()) else { return false };
    let mut env = spec.env.clone();
    env.insert("EMBER_TASK_ID".into(), rec.id.clone());
    env.insert("EMBER_TASK_ATTEMPT".into(), lease.attempt.to_string());
    let run = RunCommandRequest {
        argv: Some(spec.command.clone()),
        timeout: Some(spec.timeout_secs * 1000),
        envs: Some(env),
        ..Default::default()
    };
    let path = svc.log_path(&rec.id, lease.attempt);
    let mut log = match tokio::fs::File::create(&path).await {
        Ok(f) => Some(f),
        Err(err) => {
            tracing::warn!(path = %path.display(), error = %err, "task log cannot be written");
            None
        }
    };
    // The stream's callback hands output over; it is appended to the log as
    // it arrives, so `logs -f` follows the command live.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let exec = execd::run(&socket, &run, move |ev| {
        if ev.kind == "stdout" || ev.kind == "stderr" {
            let t = ev.text.as_deref().unwrap_or("");
            let mut line = if t == "\n" { Vec::new() } else { t.as_bytes().to_vec() };
            line.push(b'\n');
            let _ = tx.send(line);
        }
    });
    tokio::pin!(exec);
    let end = loop {
        tokio::select! {
            end = &mut exec => break Some(end),
            Some(chunk) = rx.recv() => {
                if let Some(f) = log.as_mut() {
                    // tokio's File writes in the background: flush so a reader sees it.
                    let _ = f.write_all(&chunk).await;
                    let _ = f.flush().await;
                }
            }
            err = &mut fenced => {
                tracing::info!(task = %lease.task, error = %err, "attempt fenced while running; stopping it");
                break None;
            }
        }
    };
    if let Some(f) = log.as_mut() {
        while let Ok(chunk) = rx.try_recv() {
            let _ = f.write_all(&chunk).await;
        }
        let _ = f.flush().await;
    }
    svc.metrics.phase("exec", t_exec);
    let Some(end) = end else { return true };
    if spec.workspace.is_some() && !e.workspace_epoch_is(spec.workspace.as_deref(), sb.id.as_str(), epoch) {
        finish(Outcome::Retry { reason: "the workspace lease was taken by a newer writer".into(), exit_code: None });
        return true;
    }
    match end {
        ExecEnd::Exited(0) => finish(Outcome::Succeeded),
        ExecEnd::Exited(c) => finish(Outcome::Retry { reason: format!("exit code {c}"), exit_code: Some(c) }),
        ExecEnd::NotStarted(m) => {
            finish(Outcome::Retry { reason: format!("command did not start: {m}"), exit_code: None })
        }
        ExecEnd::Cut(m) => {
            tracing::warn!(task = %lease.task, worker = %lease.worker, reason = %m, "the attempt's sandbox died; leaving the lease to expire");
            return false;
        }
    }
    true
}

impl Engine {
    /// Whether `holder` still holds the write lease of `workspace` at `epoch`.
    fn workspace_epoch_is(&self, workspace: Option<&str>, holder: &str, epoch: Option<u64>) -> bool {
        let (Some(w), Some(epoch)) = (workspace, epoch) else { return false };
        self.workspaces.meta(w).is_ok_and(|m| m.leases.check(w, holder, epoch).is_ok())
    }
}
