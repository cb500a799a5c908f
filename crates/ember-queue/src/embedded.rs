//! The embedded backend: the single-node default. All state is in memory behind
//! one std Mutex (every section is a few map operations and one journal
//! append, never an await), and every state change is appended to the journal
//! and synced before the call returns (the sync after the lock is released,
//! shared with the other calls waiting then: [`EmbeddedQueue::write`]), so a
//! restarted daemon finds every queued, leased and finished task. Heartbeats only move an in-memory deadline: after a
//! restart every lease gets a fresh full deadline, so a worker that died with
//! the daemon is detected one lease later.
use crate::journal::Journal;
use crate::pick::{first_runnable, pick};
use crate::sync::GroupSync;
use crate::{Clock, Expired, Lease, Outcome, Pruned, QueueConfig, QueueError, QueueStats, TaskFilter, TaskQueue};
use ember_types::task::{TaskAttempt, TaskRecord, TaskSpec, TaskState, Tier};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A lease that is live now.
struct Live {
    attempt: u32,
    worker: String,
    tier: Tier,
    tenant: String,
    workspace: Option<String>,
    deadline_ms: i64,
    last_beat_ms: i64,
}

struct State {
    tasks: HashMap<String, TaskRecord>,
    keys: HashMap<String, String>,
    /// Waiting tasks per tier: (enqueue time, sequence, id), oldest first.
    ready: [BTreeSet<(i64, u64, String)>; 3],
    live: HashMap<String, Live>,
    active: [u64; 3],
    /// Leased or running tasks per tenant (only tenants with any).
    tenant_active: HashMap<String, u32>,
    /// Workspaces a live attempt holds: their other tasks wait (one attempt
    /// per workspace at a time, so none is fenced while its holder lives).
    ws_held: HashSet<String>,
    /// Finished tasks, oldest end first: what retention drops.
    finished: BTreeSet<(i64, String)>,
    seq: u64,
    journal: Journal,
}

pub struct EmbeddedQueue {
    cfg: QueueConfig,
    clock: Clock,
    state: Mutex<State>,
    /// The journal's group commit, waited on outside `state`'s lock.
    durable: Arc<GroupSync>,
    journal_path: PathBuf,
    /// Damaged journal lines skipped at open.
    pub damaged: usize,
}

impl State {
    fn enqueue(&mut self, r: &TaskRecord) {
        self.seq += 1;
        self.ready[r.spec.tier.rank()].insert((r.submitted_at_ms, self.seq, r.id.clone()));
    }

    fn persist(&mut self, id: &str) -> Result<TaskRecord, QueueError> {
        let r = self.tasks.get(id).cloned().ok_or_else(|| QueueError::NotFound(id.into()))?;
        self.journal.append(&r)?;
        if self.journal.wants_compaction() {
            let State { journal, tasks, .. } = self;
            journal.rewrite(tasks.values())?;
        }
        Ok(r)
    }

    fn add_live(&mut self, id: &str, live: Live) {
        self.active[live.tier.rank()] += 1;
        *self.tenant_active.entry(live.tenant.clone()).or_default() += 1;
        self.ws_held.extend(live.workspace.clone());
        self.live.insert(id.to_string(), live);
    }

    fn drop_live(&mut self, id: &str) {
        if let Some(l) = self.live.remove(id) {
            self.active[l.tier.rank()] -= 1;
            if let Some(w) = &l.workspace {
                self.ws_held.remove(w);
            }
            if let Some(n) = self.tenant_active.get_mut(&l.tenant) {
                *n -= 1;
                if *n == 0 {
                    self.tenant_active.remove(&l.tenant);
                }
            }
        }
    }

    /// Notes that `id` reached a terminal state at `now`, for retention.
    fn ended(&mut self, id: &str, now: i64) {
        self.finished.insert((now, id.to_string()));
    }

    /// The oldest waiting task of tier `rank` that may start (see
    /// [`first_runnable`]). Without tenant caps and held workspaces that is
    /// the tier head; with them, a scan of the waiting tasks under the lock.
    fn head(&self, rank: usize, cfg: &QueueConfig) -> Option<(i64, u64, String)> {
        if !cfg.caps_tenants() && self.ws_held.is_empty() {
            return self.ready[rank].first().cloned();
        }
        let specs = self.ready[rank].iter().map(|(_, _, id)| self.tasks.get(id).map(|r| &r.spec));
        let waiting = specs.map(|s| {
            (s.map_or(ember_types::task::DEFAULT_TENANT, |s| s.tenant()), s.and_then(|s| s.workspace.as_deref()))
        });
        let full = |tenant: &str| {
            let running = self.tenant_active.get(tenant).copied().unwrap_or(0);
            cfg.cap_of(tenant).is_some_and(|cap| running >= cap)
        };
        let i = first_runnable(waiting, full, &self.ws_held)?;
        self.ready[rank].iter().nth(i).cloned()
    }

    /// Drops one finished task from memory; the caller rewrites the journal.
    fn forget(&mut self, id: &str) -> Option<Pruned> {
        let r = self.tasks.remove(id)?;
        if let Some(k) = r.spec.idempotency_scope() {
            if self.keys.get(&k).is_some_and(|t| t == id) {
                self.keys.remove(&k);
            }
        }
        Some(Pruned { task: r.id.clone(), attempts: r.attempt() })
    }

    /// The live lease `lease` names, or why it is fenced.
    fn check(&self, lease: &Lease) -> Result<&Live, QueueError> {
        let rec = self.tasks.get(&lease.task).ok_or_else(|| QueueError::NotFound(lease.task.clone()))?;
        match self.live.get(&lease.task) {
            Some(l) if l.attempt == lease.attempt && l.worker == lease.worker => Ok(l),
            _ => Err(QueueError::Fenced {
                task: lease.task.clone(),
                attempt: lease.attempt,
                worker: lease.worker.clone(),
                current: rec.attempt(),
                state: rec.state,
            }),
        }
    }

    /// Ends the current attempt of `id` as failed with `reason`: back to the
    /// queue while attempts remain, else dead-lettered.
    fn fail_attempt(&mut self, id: &str, reason: String, exit_code: Option<i32>, worker: &str, now: i64) -> TaskState {
        self.drop_live(id);
        let Some(r) = self.tasks.get_mut(id) else { return TaskState::Failed };
        if let Some(a) = r.attempts.last_mut() {
            a.ended_at_ms = Some(now);
            a.reason = Some(reason);
            a.exit_code = exit_code;
        }
        let next = if r.attempt() < r.spec.max_attempts { TaskState::Queued } else { TaskState::DeadLettered };
        r.transition(next, now, Some(worker.to_string()));
        if next == TaskState::Queued {
            let r = r.clone();
            self.enqueue(&r);
        } else {
            self.ended(id, now);
        }
        next
    }
}

impl EmbeddedQueue {
    /// Opens (or creates) the queue in `dir` and restores every task.
    pub fn open(dir: &Path, cfg: QueueConfig, clock: Clock) -> Result<EmbeddedQueue, QueueError> {
        let (journal, tasks, damaged) = Journal::open(dir)?;
        let (durable, journal_path) = (journal.group(), journal.path().to_path_buf());
        let now = clock();
        let mut st = State {
            tasks: HashMap::new(),
            keys: HashMap::new(),
            ready: Default::default(),
            live: HashMap::new(),
            active: [0; 3],
            tenant_active: HashMap::new(),
            ws_held: HashSet::new(),
            finished: BTreeSet::new(),
            seq: 0,
            journal,
        };
        let mut recs: Vec<TaskRecord> = tasks.into_values().collect();
        recs.sort_by(|a, b| (a.submitted_at_ms, &a.id).cmp(&(b.submitted_at_ms, &b.id)));
        for r in recs {
            if let Some(k) = r.spec.idempotency_scope() {
                st.keys.insert(k, r.id.clone());
            }
            match r.state {
                TaskState::Queued => st.enqueue(&r),
                TaskState::Leased | TaskState::Running => {
                    let worker = r.attempts.last().map(|a| a.worker.clone()).unwrap_or_default();
                    let deadline_ms = now + r.spec.lease_ms as i64;
                    let (attempt, tier, tenant) = (r.attempt(), r.spec.tier, r.spec.tenant().to_string());
                    let workspace = r.spec.workspace.clone();
                    let live = Live { attempt, worker, tier, tenant, workspace, deadline_ms, last_beat_ms: now };
                    st.add_live(&r.id, live);
                }
                _ => {
                    let at = r.transitions.last().map_or(r.submitted_at_ms, |t| t.at_ms);
                    st.ended(&r.id, at);
                }
            }
            st.tasks.insert(r.id.clone(), r);
        }
        Ok(EmbeddedQueue { cfg, clock, state: Mutex::new(st), durable, journal_path, damaged })
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Runs a change under the lock and, when it wrote to the journal,
    /// waits (lock released) until its lines are durable, so the caller is
    /// answered only once its change would survive a power loss. Waits on an
    /// error too: the change may have written lines before it failed.
    fn write<T>(&self, f: impl FnOnce(&mut State, i64) -> Result<T, QueueError>) -> Result<T, QueueError> {
        let now = (self.clock)();
        let (res, wrote) = {
            let mut st = self.lock();
            let before = self.durable.written();
            let res = f(&mut st, now);
            (res, self.durable.written() != before)
        };
        let journal = |source| QueueError::Journal { path: self.journal_path.clone(), source };
        let synced = if wrote { self.durable.wait().map_err(journal) } else { Ok(()) };
        let out = res?;
        synced.map(|()| out)
    }
}

impl TaskQueue for EmbeddedQueue {
    fn submit(&self, id: &str, spec: TaskSpec) -> Result<(TaskRecord, bool), QueueError> {
        self.write(|st, now| {
            if let Some(existing) = spec.idempotency_scope().and_then(|k| st.keys.get(&k)) {
                let r = st.tasks.get(existing).cloned().ok_or_else(|| QueueError::NotFound(existing.clone()))?;
                return Ok((r, false));
            }
            let mut r = TaskRecord {
                id: id.to_string(),
                spec,
                state: TaskState::Queued,
                submitted_at_ms: now,
                transitions: Vec::new(),
                attempts: Vec::new(),
            };
            r.transition(TaskState::Queued, now, None);
            if let Some(k) = r.spec.idempotency_scope() {
                st.keys.insert(k, r.id.clone());
            }
            st.tasks.insert(r.id.clone(), r.clone());
            st.enqueue(&r);
            st.persist(id).map(|r| (r, true))
        })
    }

    fn lease(&self, worker: &str) -> Result<Option<(Lease, TaskRecord)>, QueueError> {
        self.write(|st, now| {
            let heads = [0, 1, 2].map(|t| st.head(t, &self.cfg));
            let times = [0, 1, 2].map(|t| heads[t].as_ref().map(|(at, _, _)| *at));
            let Some(rank) = pick(times, st.active, self.cfg.tier_caps, self.cfg.aging_ms) else { return Ok(None) };
            let Some(head) = heads[rank].clone() else { return Ok(None) };
            st.ready[rank].remove(&head);
            let id = head.2;
            let Some(r) = st.tasks.get_mut(&id) else { return Err(QueueError::NotFound(id)) };
            r.attempts.push(TaskAttempt {
                attempt: r.attempt() + 1,
                worker: worker.to_string(),
                leased_at_ms: now,
                ..Default::default()
            });
            r.transition(TaskState::Leased, now, Some(worker.to_string()));
            let (attempt, tier, lease_ms) = (r.attempt(), r.spec.tier, r.spec.lease_ms as i64);
            let (tenant, workspace) = (r.spec.tenant().to_string(), r.spec.workspace.clone());
            let deadline_ms = now + lease_ms;
            let worker_name = worker.to_string();
            let live = Live { attempt, worker: worker_name, tier, tenant, workspace, deadline_ms, last_beat_ms: now };
            st.add_live(&id, live);
            let rec = st.persist(&id)?;
            Ok(Some((Lease { task: id, attempt, worker: worker.to_string() }, rec)))
        })
    }

    fn heartbeat(&self, lease: &Lease) -> Result<(), QueueError> {
        let now = (self.clock)();
        let mut st = self.lock();
        st.check(lease)?;
        let lease_ms = st.tasks.get(&lease.task).map_or(0, |r| r.spec.lease_ms as i64);
        if let Some(l) = st.live.get_mut(&lease.task) {
            l.deadline_ms = now + lease_ms;
            l.last_beat_ms = now;
        }
        Ok(())
    }

    fn placed(&self, lease: &Lease, sandbox: &str) -> Result<(), QueueError> {
        self.write(|st, _| {
            st.check(lease)?;
            if let Some(a) = st.tasks.get_mut(&lease.task).and_then(|r| r.attempts.last_mut()) {
                a.sandbox = Some(sandbox.to_string());
            }
            st.persist(&lease.task).map(|_| ())
        })
    }

    fn started(&self, lease: &Lease, sandbox: &str, workspace_epoch: Option<u64>) -> Result<TaskRecord, QueueError> {
        self.write(|st, now| {
            st.check(lease)?;
            if let Some(r) = st.tasks.get_mut(&lease.task) {
                if let Some(a) = r.attempts.last_mut() {
                    a.sandbox = Some(sandbox.to_string());
                    a.workspace_epoch = workspace_epoch;
                    a.started_at_ms = Some(now);
                }
                r.transition(TaskState::Running, now, Some(lease.worker.clone()));
            }
            st.persist(&lease.task)
        })
    }

    fn finish(&self, lease: &Lease, outcome: Outcome) -> Result<TaskRecord, QueueError> {
        self.write(|st, now| {
            st.check(lease)?;
            match outcome {
                Outcome::Succeeded | Outcome::Fail { .. } => {
                    st.drop_live(&lease.task);
                    if let Some(r) = st.tasks.get_mut(&lease.task) {
                        let (state, reason, code) = match outcome {
                            Outcome::Fail { reason } => (TaskState::Failed, Some(reason), None),
                            _ => (TaskState::Succeeded, None, Some(0)),
                        };
                        if let Some(a) = r.attempts.last_mut() {
                            (a.ended_at_ms, a.reason, a.exit_code) = (Some(now), reason, code);
                        }
                        r.transition(state, now, Some(lease.worker.clone()));
                    }
                    st.ended(&lease.task, now);
                }
                Outcome::Retry { reason, exit_code } => {
                    st.fail_attempt(&lease.task, reason, exit_code, &lease.worker, now);
                }
            }
            st.persist(&lease.task)
        })
    }

    fn expire(&self) -> Result<Vec<Expired>, QueueError> {
        self.write(|st, now| {
            let due: Vec<(String, u32, String, Tier, i64)> = st
                .live
                .iter()
                .filter(|(_, l)| l.deadline_ms <= now)
                .map(|(id, l)| (id.clone(), l.attempt, l.worker.clone(), l.tier, now - l.last_beat_ms))
                .collect();
            let mut out = Vec::new();
            for (task, attempt, worker, tier, silent_ms) in due {
                let reason = format!("lease expired: no heartbeat from {worker} for {silent_ms} ms");
                let next = st.fail_attempt(&task, reason, None, &worker, now);
                st.persist(&task)?;
                out.push(Expired { task, attempt, worker, tier, silent_ms, now: next });
            }
            Ok(out)
        })
    }

    fn cancel(&self, id: &str) -> Result<TaskRecord, QueueError> {
        self.write(|st, now| {
            let r = st.tasks.get(id).ok_or_else(|| QueueError::NotFound(id.into()))?;
            if r.state.is_terminal() {
                return Err(QueueError::Finished { task: id.into(), state: r.state });
            }
            let (tier, state) = (r.spec.tier.rank(), r.state);
            if state == TaskState::Queued {
                st.ready[tier].retain(|(_, _, t)| t != id);
            }
            st.drop_live(id);
            if let Some(r) = st.tasks.get_mut(id) {
                if let Some(a) = r.attempts.last_mut().filter(|a| a.ended_at_ms.is_none()) {
                    (a.ended_at_ms, a.reason) = (Some(now), Some("cancelled".into()));
                }
                r.transition(TaskState::Cancelled, now, None);
            }
            st.ended(id, now);
            st.persist(id)
        })
    }

    fn prune(&self) -> Result<Vec<Pruned>, QueueError> {
        self.write(|st, now| {
            let ret = &self.cfg.retention;
            let mut out = Vec::new();
            while let Some((at, _)) = st.finished.first() {
                let old = ret.max_age_ms.is_some_and(|age| *at <= now - age);
                let many = ret.max_finished.is_some_and(|max| st.finished.len() > max);
                if !old && !many {
                    break;
                }
                let Some((_, id)) = st.finished.pop_first() else { break };
                out.extend(st.forget(&id));
            }
            if !out.is_empty() {
                // The journal still holds the dropped tasks' lines: without a
                // `pruned` line for each, a restart would bring them back.
                let State { journal, tasks, .. } = &mut *st;
                journal.append_pruned(out.iter().map(|p| p.task.as_str()))?;
                if journal.wants_compaction() {
                    journal.rewrite(tasks.values())?;
                }
            }
            Ok(out)
        })
    }

    fn get(&self, id: &str) -> Result<TaskRecord, QueueError> {
        self.lock().tasks.get(id).cloned().ok_or_else(|| QueueError::NotFound(id.into()))
    }

    fn list(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>, QueueError> {
        let mut out: Vec<TaskRecord> = self.lock().tasks.values().filter(|r| filter.matches(r)).cloned().collect();
        out.sort_by(|a, b| (a.submitted_at_ms, &a.id).cmp(&(b.submitted_at_ms, &b.id)));
        Ok(out)
    }

    fn stats(&self) -> QueueStats {
        let st = self.lock();
        QueueStats { queued: [0, 1, 2].map(|t| st.ready[t].len() as u64), active: st.active }
    }
}
