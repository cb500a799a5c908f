//! Workers: each is one slot that pulls a task only when it is free.
//!
//! One attempt, in steps:
//! 1. lease the task (the queue picks by tier, with aging, stepping over
//!    tenants at their cap);
//! 2. fence earlier attempts (from the second on): destroy every sandbox an
//!    earlier attempt of this task ran in, so none of them can write the
//!    workspace again;
//! 3. heartbeat every `heartbeatMs` while the attempt's sandbox lives; a
//!    refused heartbeat (lease expired, task cancelled) aborts the attempt;
//! 4. create (or claim warm) a sandbox of the task's template, mounting the
//!    workspace read-write with `steal` (a fresh lease epoch), or take over
//!    the one this worker kept (opt-in reuse, `reuse.rs`);
//! 5. run the command through the agent, appending its output to the log;
//!    its workspace writes go to a layer of the attempt's own;
//! 6. after exit 0, commit the layer into the workspace (only while this
//!    lease and the workspace epoch are still the attempt's, `commit.rs`);
//!    report the outcome, accepted only while this lease is current;
//! 7. remove the sandbox (in the background unless it had a workspace), or
//!    keep it for the next task (opt-in reuse, after a success only).
//!
//! A worker whose sandbox died under it (the command's stream was cut)
//! behaves as a crashed worker would: it reports nothing, and its lease
//! expires, which is the one failure-detection path (MTTD). It then restarts
//! as a new generation, so the retry is always another worker's.
use super::commit;
use super::execd::{self, ExecEnd};
use super::reuse::{self, Kept};
use super::TaskService;
use super::Tasks;
use crate::EngineError;
use ember_queue::{Lease, Outcome, QueueError};
use ember_types::execd::RunCommandRequest;
use ember_types::task::{TaskRecord, TaskState};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The pull loop of worker `slot`.
pub(super) async fn worker_loop(engine: Weak<Tasks>, svc: Arc<TaskService>, slot: u32) {
    let mut generation = 1u32;
    // The sandbox this worker kept for its next task (opt-in reuse), and
    // since when it has found nothing to pull.
    let mut kept: Option<Kept> = None;
    let mut idle_since: Option<Instant> = None;
    // Whether this worker just ran an attempt (not woken, not polling).
    let mut ran = false;
    loop {
        let name = ember_types::task::worker_name(&svc.cfg.node, slot, generation);
        let t = Instant::now();
        // Back from an attempt with every tier just seen drained (a
        // cluster's hint): idle at once, as an empty lease would leave it,
        // without the three empty pull requests that lease costs.
        let leased = if std::mem::take(&mut ran) && !svc.queue.more_queued() {
            Ok(None)
        } else {
            let name = name.clone();
            svc.call("lease", &name.clone(), move |q| q.lease(&name)).await
        };
        match leased {
            Ok(Some((lease, rec))) => {
                svc.metrics.phase("lease", t);
                // There may be more: pass the wake-up on to another idle worker
                // (on a cluster, unless every tier was just seen drained: that
                // poll asked three tiers for nothing, per task).
                if svc.queue.more_queued() {
                    svc.wake.notify_one();
                }
                let Some(e) = engine.upgrade() else { return };
                idle_since = None;
                let (alive, keep) = run_attempt(&e, &svc, lease, rec, kept.take()).await;
                (kept, ran) = (keep, true);
                if !alive {
                    generation += 1;
                }
            }
            Ok(None) => {
                let Some(e) = engine.upgrade() else { return };
                if kept.is_some() && idle_since.get_or_insert_with(Instant::now).elapsed() >= reuse::KEEP_IDLE {
                    if let Some(k) = kept.take() {
                        reuse::release(&e, &svc, k.id, false).await;
                    }
                }
                drop(e);
                super::idle::wait(&svc.wake, &svc.poller).await;
            }
            Err(err) => {
                tracing::error!(worker = %name, error = %err, "leasing a task failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Starts the upkeep (expired leases returned, finished tasks past their
/// retention dropped) on a thread of its own, for as long as `alive` says.
/// The queue's calls are synchronous, and a cluster's may wait on the
/// network: a prune through a stream leader's election, made on an async
/// worker, held one of a drill node's two main-runtime workers for over
/// 10 s; its runtime's pulse went stale, the node withheld its heartbeat,
/// and the others took it for dead and rebound its sessions.
pub(super) fn spawn_upkeep(alive: impl Fn() -> bool + Send + 'static, svc: Arc<TaskService>) -> std::io::Result<()> {
    std::thread::Builder::new().name("ember-task-upkeep".into()).spawn(move || upkeep_loop(alive, &svc)).map(drop)
}

fn upkeep_loop(alive: impl Fn() -> bool, svc: &TaskService) {
    // Pruning rewrites the journal when it drops anything, so it runs at
    // half the retention age, at most once a minute and at least every 100 ms.
    let age = svc.cfg.queue.retention.max_age_ms.map_or(120_000, |a| a.max(0) as u64);
    let prune_every = Duration::from_millis((age / 2).clamp(100, 60_000));
    let mut last_prune = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(25));
        if !alive() {
            return;
        }
        if last_prune.elapsed() >= prune_every {
            last_prune = Instant::now();
            prune(svc);
        }
        expire(svc);
    }
}

/// Returns expired leases to the queue, counting them and their MTTD.
fn expire(svc: &TaskService) {
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

/// Drops finished tasks past the retention, and their logs.
fn prune(svc: &TaskService) {
    let pruned = match svc.queue.prune() {
        Ok(p) => p,
        Err(err) => return tracing::error!(error = %err, "pruning finished tasks failed"),
    };
    if pruned.is_empty() {
        return;
    }
    let logs: Vec<_> = pruned.iter().flat_map(|p| (1..=p.attempts).map(|a| svc.log_path(&p.task, a))).collect();
    tracing::info!(tasks = pruned.len(), logs = logs.len(), "finished tasks past their retention dropped");
    for path in logs {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "removing a task log failed"),
        }
    }
}

/// How an attempt left its worker.
enum Ended {
    /// Reported (or fenced); `succeeded`: the task is done for good.
    Done { succeeded: bool },
    /// Its sandbox died under it: the worker counts as dead.
    Lost,
}

/// Runs one attempt in `prior` (the worker's kept sandbox) when the task may
/// share it, else in a sandbox of its own. Returns `false` when the worker
/// lost its sandbox and must be treated as dead, and the sandbox to keep.
async fn run_attempt(
    e: &Arc<Tasks>,
    svc: &Arc<TaskService>,
    lease: Lease,
    rec: TaskRecord,
    prior: Option<Kept>,
) -> (bool, Option<Kept>) {
    let tier = ember_types::task::Tier::as_str(rec.spec.tier).to_string();
    if let Some(q) = rec.transitions.iter().rev().find(|t| t.state == TaskState::Queued) {
        let waited = rec.transitions.last().map_or(0, |l| l.at_ms - q.at_ms).max(0);
        svc.metrics.queued_seconds.get_or_create(&super::metrics::TierLabels { tier }).observe(waited as f64 / 1e3);
    }
    if lease.attempt > 1 {
        // The first attempt has no predecessor to fence.
        let t = Instant::now();
        fence_earlier_attempts(e, &rec).await;
        svc.metrics.phase("fence", t);
    }
    let reused = match prior {
        Some(k) if k.fits(&rec.spec) => {
            let t = Instant::now();
            let ttl = rec.spec.timeout_secs.saturating_add(ember_types::limits::TASK_GRACE_SECS);
            let ready = e.sandboxes.take_over(&k.id, &rec.id, lease.attempt, ttl).await;
            svc.metrics.phase("reset", t);
            match ready {
                Ok(()) => Some(k.id),
                Err(err) => {
                    tracing::warn!(sandbox = %k.id, error = %err, "a kept sandbox could not be reset; using a new one");
                    reuse::release(e, svc, k.id, false).await;
                    None
                }
            }
        }
        Some(k) => {
            reuse::release(e, svc, k.id, false).await;
            None
        }
        None => None,
    };

    // Heartbeats: stop when the sandbox is gone, abort the attempt when refused.
    let sandbox: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(reused.clone()));
    let (fenced_tx, fenced_rx) = tokio::sync::oneshot::channel::<QueueError>();
    let hb = tokio::spawn(heartbeat(e.clone(), svc.clone(), lease.clone(), sandbox.clone(), fenced_tx));

    let ended = attempt(e, svc, &lease, &rec, reused, &sandbox, fenced_rx).await;
    hb.abort();
    let sb = sandbox.lock().unwrap_or_else(|p| p.into_inner()).take();
    let mut keep = None;
    if let Some(sb) = sb {
        if matches!(ended, Ended::Done { succeeded: true }) && reuse::reusable(&rec.spec) && e.sandboxes.is_alive(&sb) {
            keep = Some(Kept::after(sb, &rec.spec));
        } else {
            let t = Instant::now();
            reuse::release(e, svc, sb, rec.spec.workspace.is_some()).await;
            svc.metrics.phase("remove", t);
        }
    }
    (!matches!(ended, Ended::Lost), keep)
}

async fn heartbeat(
    e: Arc<Tasks>,
    svc: Arc<TaskService>,
    lease: Lease,
    sandbox: Arc<Mutex<Option<String>>>,
    fenced: tokio::sync::oneshot::Sender<QueueError>,
) {
    let task = lease.task.clone();
    let every = svc.call("get", &lease.task, move |q| q.get(&task)).await;
    let every = Duration::from_millis(every.map_or(1_000, |r| r.spec.heartbeat_ms));
    loop {
        tokio::time::sleep(every).await;
        let sb = sandbox.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if sb.is_some_and(|s| !e.sandboxes.is_alive(&s)) {
            return;
        }
        let l = lease.clone();
        if let Err(err) = svc.call("heartbeat", &lease.task, move |q| q.heartbeat(&l)).await {
            let _ = fenced.send(err);
            return;
        }
    }
}

/// Destroys every live sandbox of an earlier attempt of this task: the ones
/// the queue recorded, and any labelled with the task (an attempt that died
/// between its create and its report).
async fn fence_earlier_attempts(e: &Arc<Tasks>, rec: &TaskRecord) {
    let mut ids: Vec<String> = rec.attempts.iter().rev().skip(1).filter_map(|a| a.sandbox.clone()).collect();
    let labelled =
        crate::ListFilter { metadata: vec![(super::TASK_LABEL.into(), rec.id.clone())], ..Default::default() };
    ids.extend(e.sandboxes.list(&labelled).into_iter().map(|r| r.id.to_string()));
    ids.sort();
    ids.dedup();
    for id in ids {
        match e.sandboxes.remove(&id).await {
            Ok(()) => tracing::info!(task = %rec.id, sandbox = %id, "destroyed an earlier attempt's sandbox"),
            Err(EngineError::NotFound(_)) => {}
            Err(err) => {
                tracing::warn!(task = %rec.id, sandbox = %id, error = %err, "fencing an earlier attempt failed")
            }
        }
    }
}

async fn attempt(
    e: &Arc<Tasks>,
    svc: &Arc<TaskService>,
    lease: &Lease,
    rec: &TaskRecord,
    reused: Option<String>,
    sandbox: &Mutex<Option<String>>,
    fenced: tokio::sync::oneshot::Receiver<QueueError>,
) -> Ended {
    let spec = &rec.spec;
    // Resolves only with a refusal (a heartbeat loop that just stops is no verdict).
    let fenced = async move {
        match fenced.await {
            Ok(err) => err,
            Err(_) => std::future::pending().await,
        }
    };
    tokio::pin!(fenced);
    let finish = |outcome: Outcome| async move {
        let label = match &outcome {
            Outcome::Succeeded => "succeeded",
            Outcome::Retry { .. } => "failed",
            Outcome::Fail { .. } => "rejected",
        };
        let t = Instant::now();
        let l = lease.clone();
        let accepted = match svc.call("finish", &lease.task, move |q| q.finish(&l, outcome)).await {
            Ok(_) => {
                svc.metrics.outcome(label);
                true
            }
            Err(err) => {
                tracing::warn!(task = %lease.task, error = %err, "an attempt's report was refused");
                false
            }
        };
        svc.metrics.phase("finish", t);
        Ended::Done { succeeded: accepted && label == "succeeded" }
    };
    if let Some(ws) = spec.workspace.as_deref() {
        if commit::committed_before(e, ws, &rec.id).await {
            tracing::info!(task = %rec.id, "an earlier attempt committed; recording its success");
            let ended = finish(Outcome::Succeeded).await;
            commit::recorded(e, ws, &rec.id, matches!(ended, Ended::Done { succeeded: true })).await;
            return ended;
        }
    }
    let (sb, epoch) = match reused {
        Some(id) => (id, None),
        None => match reuse::own_sandbox(e, svc, lease, rec).await {
            Ok(placed) => placed,
            Err(outcome) => return finish(outcome).await,
        },
    };
    *sandbox.lock().unwrap_or_else(|p| p.into_inner()) = Some(sb.clone());
    let t = Instant::now();
    let (l, sb_) = (lease.clone(), sb.clone());
    let started = svc.call("started", &lease.task, move |q| q.started(&l, &sb_, epoch)).await;
    svc.metrics.phase("started", t);
    if let Err(err) = started {
        tracing::info!(task = %lease.task, error = %err, "attempt fenced before its command");
        return Ended::Done { succeeded: false };
    }
    let t_exec = Instant::now();
    let Ok(socket) = e.sandboxes.agent_socket(&sb) else { return Ended::Lost };
    let mut env = spec.env.clone();
    env.insert("EMBER_TASK_ID".into(), rec.id.clone());
    env.insert("EMBER_TASK_ATTEMPT".into(), lease.attempt.to_string());
    let run = RunCommandRequest {
        argv: Some(spec.command.clone()),
        timeout: Some(spec.timeout_secs.saturating_mul(1000)),
        envs: Some(env),
        ..Default::default()
    };
    let path = svc.log_path(&rec.id, lease.attempt);
    let mut log = super::log::TaskLog::new(path, svc.cfg.log_limit);
    // The stream's callback hands output over; it is appended to the log as
    // it arrives, so `logs -f` follows the command live.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let exec = execd::run(&socket, &run, move |ev| {
        if ev.kind == "stdout" || ev.kind == "stderr" {
            // The exact bytes (the agent's `raw`), not the text's lossy UTF-8.
            let _ = tx.send(ev.output_bytes());
        }
    });
    tokio::pin!(exec);
    let end = loop {
        tokio::select! {
            end = &mut exec => break Some(end),
            Some(chunk) = rx.recv() => log.append(&chunk).await,
            err = &mut fenced => {
                tracing::info!(task = %lease.task, error = %err, "attempt fenced while running; stopping it");
                break None;
            }
        }
    };
    while let Ok(chunk) = rx.try_recv() {
        log.append(&chunk).await;
    }
    svc.metrics.phase("exec", t_exec);
    let Some(end) = end else { return Ended::Done { succeeded: false } };
    if let (Some(ws), ExecEnd::Exited(0)) = (spec.workspace.as_deref(), &end) {
        let ended = finish(commit::settle(e, svc, lease, ws, &sb, epoch).await).await;
        commit::recorded(e, ws, &rec.id, matches!(ended, Ended::Done { succeeded: true })).await;
        return ended;
    }
    match end {
        ExecEnd::Exited(0) => finish(Outcome::Succeeded).await,
        ExecEnd::Exited(c) => finish(Outcome::Retry { reason: format!("exit code {c}"), exit_code: Some(c) }).await,
        ExecEnd::NotStarted(m) => {
            finish(Outcome::Retry { reason: format!("command did not start: {m}"), exit_code: None }).await
        }
        ExecEnd::Cut(m) => {
            tracing::warn!(task = %lease.task, worker = %lease.worker, reason = %m, "the attempt's sandbox died; leaving the lease to expire");
            Ended::Lost
        }
        ExecEnd::Broken(m) => {
            finish(Outcome::Retry { reason: format!("the sandbox's agent misbehaved: {m}"), exit_code: None }).await
        }
    }
}
