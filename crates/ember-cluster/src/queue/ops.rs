//! The queue's protocol on JetStream, async. The record decides: every step
//! first moves the task's record by compare-and-set, and only then acks,
//! naks or terms its message, so a step that dies half-way leaves a record
//! ahead of its message, which the next delivery of that message repairs
//! (`claim` reads the record and finishes the message's part).
use super::kv::{encode, key_of, Bucket, Cas, Records, Stored};
use super::JetStreamConfig;
use crate::retry::{again, retry};
use async_nats::jetstream::{self, consumer::PullConsumer, message::AckKind, Message};
use bytes::Bytes;
use ember_queue::{Clock, Expired, Lease, Outcome, QueueConfig, QueueError};
use ember_types::task::{TaskAttempt, TaskRecord, TaskSpec, TaskState, Tier};
use futures_util::StreamExt;
use std::collections::HashMap;
use std::sync::Mutex;

/// Messages one `lease` call looks at per tier before it answers `None`
/// (each skipped one is a duplicate, a finished task or a held workspace).
const SCAN: usize = 64;

/// Deliveries of a message whose task has no record before it is dropped.
const ORPHAN_DELIVERIES: i64 = 5;

/// How long one request to the cluster waits for its answer before it is
/// tried again (`retry.rs`): the JetStream context's timeout, and each
/// pull request's (see `fetch`).
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// An attempt leased through this handle: its message carries the acks.
pub(crate) struct Inflight {
    msg: Message,
    attempt: u32,
    last_beat_ms: i64,
}

pub(crate) struct Inner {
    pub cfg: JetStreamConfig,
    pub queue: QueueConfig,
    pub clock: Clock,
    pub js: jetstream::Context,
    pub records: Records,
    pub keys: Bucket,
    pub lines: Bucket,
    pub consumers: [PullConsumer; 3],
    pub subjects: [String; 3],
    pub dead_subject: String,
    pub inflight: Mutex<HashMap<String, Inflight>>,
    pub expired: Mutex<Vec<Expired>>,
    /// Which tiers this handle saw drained, and when (`drained.rs`).
    pub drained: super::drained::Drained,
}

/// A key of the idempotency bucket: the task it names, and when (wall
/// clock) it was claimed, so a claim whose submit died can be told apart
/// from one whose submit is still under way.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeyClaim {
    task: String,
    at_ms: i64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn fenced(r: &TaskRecord, lease: &Lease) -> QueueError {
    QueueError::Fenced {
        task: lease.task.clone(),
        attempt: lease.attempt,
        worker: lease.worker.clone(),
        current: r.attempt(),
        state: r.state,
    }
}

/// Whether `lease` is the task's live attempt.
fn check_live(r: &TaskRecord, lease: &Lease) -> Result<(), QueueError> {
    let live = matches!(r.state, TaskState::Leased | TaskState::Running)
        && r.attempt() == lease.attempt
        && r.attempts.last().is_some_and(|a| a.worker == lease.worker);
    if live {
        Ok(())
    } else {
        Err(fenced(r, lease))
    }
}

/// Ends the record's current attempt as failed: Queued while attempts
/// remain, else DeadLettered (the embedded backend's rule).
fn fail_attempt(r: &mut TaskRecord, reason: String, exit_code: Option<i32>, now: i64) -> TaskState {
    let worker = r.attempts.last().map(|a| a.worker.clone());
    if let Some(a) = r.attempts.last_mut() {
        (a.ended_at_ms, a.reason, a.exit_code) = (Some(now), Some(reason), exit_code);
    }
    let next = if r.attempt() < r.spec.max_attempts { TaskState::Queued } else { TaskState::DeadLettered };
    r.transition(next, now, worker);
    next
}

async fn ack(msg: Option<Message>, kind: AckKind) {
    // An ack that is lost is repaired by the redelivery: `claim` reads the
    // record and acks again; so a failure here is not the caller's.
    if let Some(m) = msg {
        let _ = m.ack_with(kind).await;
    }
}

impl Inner {
    pub async fn connect(cfg: JetStreamConfig, queue: QueueConfig, clock: Clock) -> Result<Inner, QueueError> {
        let budget = cfg.retry_budget;
        let name = cfg.name.clone();
        let client = retry(budget, "connect", &name, || async {
            crate::connect::options(std::time::Duration::from_secs(2))
                .connect(cfg.servers.as_slice())
                .await
                .map_err(again)
        })
        .await?;
        let replicas = match cfg.replicas {
            Some(n) => n,
            None => crate::replicas::for_cluster(&client, cfg.servers.len()).await,
        };
        let js = jetstream::ContextBuilder::new().timeout(REQUEST_TIMEOUT).build(client);
        let upper = name.to_uppercase();
        let subjects = Tier::ALL.map(|t| format!("{name}.tasks.{}", t.as_str()));
        let dead_subject = format!("{name}.tasks.dead");
        let mut consumers = Vec::new();
        for (t, subject) in Tier::ALL.iter().zip(&subjects) {
            let stream = format!("{upper}_TASKS_{}", t.as_str().to_uppercase());
            consumers.push(super::setup::work_queue(&js, &cfg, replicas, &stream, subject).await?);
        }
        super::setup::dead_letters(&js, &cfg, replicas, &format!("{upper}_TASKS_DEAD"), &dead_subject).await?;
        let bucket = |suffix: &str| super::setup::bucket(&js, &cfg, replicas, format!("{name}_{suffix}"));
        let records = Records(bucket("tasks").await?);
        let (keys, lines) = (bucket("task_keys").await?, bucket("task_workspaces").await?);
        let consumers: [PullConsumer; 3] = consumers.try_into().map_err(|_| QueueError::Unavailable {
            op: "open",
            id: name.clone(),
            reason: "three tier consumers".into(),
        })?;
        let (inflight, expired) = (Mutex::new(HashMap::new()), Mutex::new(Vec::new()));
        let drained = super::drained::Drained::new(cfg.drained_for);
        Ok(Inner {
            cfg,
            queue,
            clock,
            js,
            records,
            keys,
            lines,
            consumers,
            subjects,
            dead_subject,
            inflight,
            expired,
            drained,
        })
    }

    fn now(&self) -> i64 {
        (self.clock)()
    }

    /// Publishes until the stream acknowledges, under one `Nats-Msg-Id`
    /// (a retry of a publish that did land is dropped as a duplicate).
    async fn publish(&self, subject: &str, msg_id: &str, payload: Bytes) -> Result<(), QueueError> {
        retry(self.cfg.retry_budget, "publish", msg_id, || async {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
            let ack =
                self.js.publish_with_headers(subject.to_string(), headers, payload.clone()).await.map_err(again)?;
            ack.await.map(|_| ()).map_err(again)
        })
        .await
    }

    pub async fn submit(&self, id: &str, spec: TaskSpec) -> Result<(TaskRecord, bool), QueueError> {
        if let Some(key) = spec.idempotency_scope() {
            if let Some(existing) = self.claim_key(&key, id).await? {
                self.enqueue_again(&existing).await?;
                return Ok((existing, false));
            }
        }
        let now = self.now();
        let mut record = TaskRecord {
            id: id.to_string(),
            state: TaskState::Queued,
            submitted_at_ms: now,
            transitions: Vec::new(),
            attempts: Vec::new(),
            spec,
        };
        record.transition(TaskState::Queued, now, None);
        let st = Stored { record, seq: None };
        // Record first: a message is never fetched before its record exists.
        // Created at revision 0, never put: a first write that is retried,
        // or applied late after a leader loss, must not overwrite the
        // record a worker has moved since.
        if self.records.save(&st, None).await? == Cas::Conflict {
            let existing = self.records.load(id).await?.map(|(s, _)| s.record);
            let existing = existing.ok_or_else(|| QueueError::NotFound(id.to_string()))?;
            self.enqueue_again(&existing).await?;
            return Ok((existing, false));
        }
        self.enqueue(&st.record).await?;
        Ok((st.record, true))
    }

    /// The message side of a submit: the task's message, under its id as
    /// the message id, then its place in its workspace's line.
    async fn enqueue(&self, r: &TaskRecord) -> Result<(), QueueError> {
        let rank = r.spec.tier.rank();
        self.publish(&self.subjects[rank], &r.id, Bytes::from(r.id.clone())).await?;
        self.drained.filled(rank);
        if let Some(ws) = &r.spec.workspace {
            self.join_line(ws, &r.id).await?;
        }
        Ok(())
    }

    /// A submit that found its task's record already there (a retry, or a
    /// second submit of its idempotency key) enqueues it again while it has
    /// never been leased: the submit that wrote the record may have died,
    /// or given up in an election, before its message was published, and a
    /// record with no message is never fetched, so never leased. Five tasks
    /// of a 300-session drill stayed Queued so, each acknowledged to its
    /// session by the retry that found the record. A message that did land
    /// makes this publish a duplicate, dropped by the stream's window (or,
    /// past it, by `claim`: a second message for a leased task is termed).
    async fn enqueue_again(&self, r: &TaskRecord) -> Result<(), QueueError> {
        if r.state == TaskState::Queued && r.attempts.is_empty() {
            self.enqueue(r).await?;
        }
        Ok(())
    }

    /// Claims idempotency key `key` for task `id`; `Some` is the task that
    /// already holds it. A claim whose task record never appeared within
    /// the retry budget belongs to a submit that died: it is taken over.
    async fn claim_key(&self, key: &str, id: &str) -> Result<Option<TaskRecord>, QueueError> {
        let k = key_of(key);
        let wall = ember_queue::system_clock();
        loop {
            let claim = encode(&KeyClaim { task: id.to_string(), at_ms: wall() });
            if let Cas::Done(_) = self.keys.cas(&k, claim, None).await? {
                return Ok(None);
            }
            let Some((bytes, rev)) = self.keys.get(&k).await? else { continue };
            let held: KeyClaim = serde_json::from_slice(&bytes).map_err(|e| QueueError::Unavailable {
                op: "decode key",
                id: key.into(),
                reason: e.to_string(),
            })?;
            if held.task == id {
                return Ok(None);
            }
            if let Some((st, _)) = self.records.load(&held.task).await? {
                return Ok(Some(st.record));
            }
            if wall() - held.at_ms > self.cfg.retry_budget.as_millis() as i64 {
                self.keys.delete(&k, Some(rev)).await?;
            } else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }

    async fn fetch(&self, rank: usize) -> Result<Option<Message>, QueueError> {
        let consumer = &self.consumers[rank];
        retry(self.cfg.retry_budget, "fetch", &self.subjects[rank], || async {
            // A pull request is a publish, not a request: async-nats waits
            // for its answer without a deadline. One that no server answers
            // (the consumer's leader died or froze with it in hand, or the
            // connection it left on was lost) hung `lease` for ever: the
            // failover test's stall. So it is a timeout, tried again. A
            // message the server delivers after that timeout lands in a
            // dropped inbox and comes back after AckWait, like any lost
            // delivery.
            let one = async {
                let mut batch = consumer.fetch().max_messages(1).messages().await.map_err(again)?;
                match batch.next().await {
                    None => Ok(None),
                    Some(Ok(m)) => Ok(Some(m)),
                    Some(Err(e)) => Err(again(e)),
                }
            };
            tokio::time::timeout(REQUEST_TIMEOUT, one).await.map_err(|_| again("no answer to the pull request"))?
        })
        .await
    }

    pub async fn lease(&self, worker: &str) -> Result<Option<(Lease, TaskRecord)>, QueueError> {
        // Tiers strictly in order; aging between tiers is not done here yet.
        for rank in 0..3 {
            for _ in 0..SCAN {
                let Some(msg) = self.fetch(rank).await? else {
                    self.drained.saw(rank, true);
                    break;
                };
                self.drained.saw(rank, msg.info().is_ok_and(|i| i.pending == 0));
                if let Some(got) = self.claim(msg, worker).await? {
                    return Ok(Some(got));
                }
            }
        }
        Ok(None)
    }

    /// Decides what a fetched message is, from its task's record, and
    /// leases it to `worker` if it is a task that may run now.
    async fn claim(&self, msg: Message, worker: &str) -> Result<Option<(Lease, TaskRecord)>, QueueError> {
        let Ok((seq, delivered)) = msg.info().map(|i| (i.stream_sequence, i.delivered)) else {
            ack(Some(msg), AckKind::Term).await;
            return Ok(None);
        };
        let id = String::from_utf8_lossy(&msg.payload).into_owned();
        loop {
            let Some((mut st, rev)) = self.records.load(&id).await? else {
                // No record: the task was pruned after a settle whose ack
                // was lost. Dropped only once seen so on several deliveries:
                // a message must never be dropped on one doubtful read.
                let kind = if delivered >= ORPHAN_DELIVERIES {
                    AckKind::Term
                } else {
                    AckKind::Nak(Some(self.cfg.held_retry))
                };
                ack(Some(msg), kind).await;
                return Ok(None);
            };
            let now = self.now();
            match st.record.state {
                s if s.is_terminal() => {
                    self.settle(&st.record, Some(msg)).await?;
                    return Ok(None);
                }
                TaskState::Leased | TaskState::Running if st.seq != Some(seq) => {
                    // A second message for a live task (a publish retried
                    // past the dedup window): the live attempt has its own.
                    ack(Some(msg), AckKind::Term).await;
                    return Ok(None);
                }
                TaskState::Leased | TaskState::Running => match self.expire_attempt(&mut st, rev, now).await? {
                    None => continue,
                    Some(TaskState::DeadLettered) => {
                        self.settle(&st.record, Some(msg)).await?;
                        return Ok(None);
                    }
                    Some(_) => {}
                },
                _ => {
                    if let Some(ws) = st.record.spec.workspace.clone() {
                        if !self.first_in_line(&ws, &id).await? {
                            ack(Some(msg), AckKind::Nak(Some(self.cfg.held_retry))).await;
                            return Ok(None);
                        }
                    }
                    let attempt = st.record.attempt() + 1;
                    let w = worker.to_string();
                    st.record.attempts.push(TaskAttempt {
                        attempt,
                        worker: w.clone(),
                        leased_at_ms: now,
                        ..Default::default()
                    });
                    st.record.transition(TaskState::Leased, now, Some(w.clone()));
                    st.seq = Some(seq);
                    if self.records.save(&st, Some(rev)).await? == Cas::Conflict {
                        continue;
                    }
                    lock(&self.inflight).insert(id.clone(), Inflight { msg, attempt, last_beat_ms: now });
                    return Ok(Some((Lease { task: id, attempt, worker: w }, st.record)));
                }
            }
        }
    }

    /// Fails the silent attempt of a task whose message came back after
    /// AckWait: `None` if another writer moved the record first, else where
    /// the task went (Queued, or DeadLettered past its attempts).
    async fn expire_attempt(&self, st: &mut Stored, rev: u64, now: i64) -> Result<Option<TaskState>, QueueError> {
        let (id, attempt) = (st.record.id.clone(), st.record.attempt());
        let worker = st.record.attempts.last().map(|a| a.worker.clone()).unwrap_or_default();
        let beat = lock(&self.inflight).get(&id).filter(|f| f.attempt == attempt).map(|f| f.last_beat_ms);
        let silent_ms = beat.map_or(self.cfg.ack_wait.as_millis() as i64, |b| now - b);
        let reason = format!("lease expired: no heartbeat from {worker} for {silent_ms} ms");
        let next = fail_attempt(&mut st.record, reason, None, now);
        if self.records.save(st, Some(rev)).await? == Cas::Conflict {
            return Ok(None);
        }
        lock(&self.inflight).remove(&id);
        let tier = st.record.spec.tier;
        lock(&self.expired).push(Expired { task: id, attempt, worker, tier, silent_ms, now: next });
        Ok(Some(next))
    }

    /// Finishes the message side of a task that reached a terminal state:
    /// a dead letter's copy, the message's Term, its place in its
    /// workspace's line. Idempotent: a redelivery runs it again.
    async fn settle(&self, r: &TaskRecord, msg: Option<Message>) -> Result<(), QueueError> {
        if r.state == TaskState::DeadLettered {
            self.publish(&self.dead_subject, &format!("{}.dead", r.id), encode(r)).await?;
        }
        ack(msg, if r.state == TaskState::Succeeded { AckKind::Ack } else { AckKind::Term }).await;
        if let Some(ws) = &r.spec.workspace {
            self.leave_line(ws, &r.id).await?;
        }
        Ok(())
    }

    /// This handle's message of `lease`'s attempt, taken out.
    fn take_msg(&self, lease: &Lease) -> Option<Message> {
        let mut inflight = lock(&self.inflight);
        inflight.get(&lease.task).filter(|f| f.attempt == lease.attempt)?;
        inflight.remove(&lease.task).map(|f| f.msg)
    }

    pub async fn heartbeat(&self, lease: &Lease) -> Result<(), QueueError> {
        let (st, _) = self.records.load(&lease.task).await?.ok_or_else(|| QueueError::NotFound(lease.task.clone()))?;
        check_live(&st.record, lease)?;
        let now = self.now();
        let msg = {
            let mut inflight = lock(&self.inflight);
            let f = inflight.get_mut(&lease.task).filter(|f| f.attempt == lease.attempt);
            f.map(|f| {
                f.last_beat_ms = now;
                f.msg.clone()
            })
        };
        ack(msg, AckKind::Progress).await;
        Ok(())
    }

    /// Changes the record of `lease`'s live attempt (fenced otherwise).
    pub async fn update_live(
        &self,
        lease: &Lease,
        f: impl Fn(&mut Stored, i64) + Send,
    ) -> Result<TaskRecord, QueueError> {
        let now = self.now();
        let st = self
            .records
            .modify(&lease.task, |st| {
                check_live(&st.record, lease)?;
                f(st, now);
                Ok(())
            })
            .await?;
        Ok(st.record)
    }

    pub async fn finish(&self, lease: &Lease, outcome: Outcome) -> Result<TaskRecord, QueueError> {
        let now = self.now();
        let st = self
            .records
            .modify(&lease.task, |st| {
                check_live(&st.record, lease)?;
                let r = &mut st.record;
                match &outcome {
                    Outcome::Retry { reason, exit_code } => {
                        fail_attempt(r, reason.clone(), *exit_code, now);
                    }
                    Outcome::Succeeded | Outcome::Fail { .. } => {
                        let (state, reason, code) = match &outcome {
                            Outcome::Fail { reason } => (TaskState::Failed, Some(reason.clone()), None),
                            _ => (TaskState::Succeeded, None, Some(0)),
                        };
                        if let Some(a) = r.attempts.last_mut() {
                            (a.ended_at_ms, a.reason, a.exit_code) = (Some(now), reason, code);
                        }
                        r.transition(state, now, Some(lease.worker.clone()));
                    }
                }
                Ok(())
            })
            .await?;
        let msg = self.take_msg(lease);
        if st.record.state == TaskState::Queued {
            ack(msg, AckKind::Nak(None)).await;
        } else {
            self.settle(&st.record, msg).await?;
        }
        Ok(st.record)
    }

    pub async fn cancel(&self, id: &str) -> Result<TaskRecord, QueueError> {
        let now = self.now();
        let st = self
            .records
            .modify(id, |st| {
                let r = &mut st.record;
                if r.state.is_terminal() {
                    return Err(QueueError::Finished { task: id.into(), state: r.state });
                }
                if let Some(a) = r.attempts.last_mut().filter(|a| a.ended_at_ms.is_none()) {
                    (a.ended_at_ms, a.reason) = (Some(now), Some("cancelled".into()));
                }
                r.transition(TaskState::Cancelled, now, None);
                Ok(())
            })
            .await?;
        let msg = lock(&self.inflight).remove(id).map(|f| f.msg);
        // A queued task's message stays until a fetch finds it cancelled.
        self.settle(&st.record, msg).await?;
        Ok(st.record)
    }
}
