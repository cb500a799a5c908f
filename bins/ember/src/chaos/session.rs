//! One session of the drill: a long agent loop through the public API,
//! under the documented retry policy (a 503, an unreachable node or an
//! idempotent call's answer cut off mid-stream is tried again after 100 ms,
//! doubling to 1 s, for up to 30 s; an unreachable node or a cut also sends
//! the next try to another node's URL that has not failed lately, the
//! sessions of one node parting over them as a load balancer would; a try whose node fails its health probes is an
//! unreachable node's, `health.rs`). A call that still fails is a
//! *user-visible error*.
//!
//! The loop: append a checksummed record to /workspace/records by exec,
//! every few records `POST /v1/workspaces/{name}/checkpoint`, every few
//! records a task with an idempotency key of its own.
//!
//! A checkpoint answers the workspace's epoch, which a rebind moves on: the
//! records appended since the previous checkpoint are *acknowledged* when
//! this checkpoint answered 200 at that checkpoint's epoch (the copy they
//! were written to is the one checkpointed). At a new epoch they are not:
//! they may have gone to the lost node's copy, and the workspace came back
//! at its last checkpoint (that is what a rebind promises). A client that
//! counted every 200 as covering its writes saw "acknowledged" records lost
//! after each rebind (the drill's first runs).
pub use super::conn::Conn;
use bytes::Bytes;
use ember_client::ClientError;
use ember_types::api::{CreateSandboxRequest, WorkspaceMountSpec};
use ember_types::execd::RunCommandRequest;
use ember_types::task::SubmitTaskRequest;
use parking_lot::Mutex;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A checkpoint every this many records, a task every `TASK_EVERY`.
pub const CHECKPOINT_EVERY: u64 = 4;
pub const TASK_EVERY: u64 = 3;
/// Failed tries a session's report keeps.
pub const TRIES_KEPT: usize = 32;

#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Kind {
    Ok,
    /// One failed try that the policy retries.
    Retry,
    /// A call that failed after the policy.
    UserError,
}

/// What the timeline plots: one per try.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Event {
    pub at_ms: u64,
    pub kind: Kind,
}

/// The drill's shared clock, stop flag and timeline.
pub struct Shared {
    pub t0: Instant,
    /// `t0` on the wall clock (ms since the epoch), to read the nodes' times.
    pub t0_unix_ms: i64,
    pub stop: AtomicBool,
    pub events: Mutex<Vec<Event>>,
    /// (node, sandbox id) of one sandbox on each node that does not rebind:
    /// the faults' MTTD probes. A call for a session's sandbox, which
    /// rebinds, waits out its rebind (`ember serve --rebind-hold`): probed so,
    /// MTTD would time the rebind, not the verdict.
    pub probes: Mutex<Vec<(String, String)>>,
    /// Node → when it was killed or cut (ms on the drill's clock).
    pub faulted: Mutex<BTreeMap<String, u64>>,
    /// The nodes seen failing a try, passed over when a session moves.
    pub health: super::health::Health,
}

impl Shared {
    pub fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.t0).as_millis()).unwrap_or(u64::MAX)
    }

    /// A node's RFC 3339 time on the drill's clock (ms; `None` before it
    /// started or unreadable). The nodes share this host's clock.
    pub fn ms_of(&self, rfc3339: &str) -> Option<u64> {
        let t = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339).ok()?;
        let ms = i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()?;
        u64::try_from(ms.checked_sub(self.t0_unix_ms)?).ok()
    }

    pub(super) fn note(&self, kind: Kind) {
        let at_ms = self.ms(Instant::now());
        self.events.lock().push(Event { at_ms, kind });
    }
}

/// One session's figures, filled by the loop and then by the verification.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionResult {
    pub index: u32,
    /// The host it entered by, which holds its workspace and sandbox.
    pub node: String,
    pub sandbox: Option<String>,
    pub workspace: String,
    /// Highest record seq whose append answered exit 0.
    pub written: u64,
    /// Records acknowledged by a checkpoint (see the module's docs).
    pub acked: u64,
    /// The acknowledged seqs: `(after, upto]` ranges.
    pub acked_ranges: Vec<(u64, u64)>,
    /// The epoch of the last checkpoint that answered, and the highest seq
    /// written before it.
    pub epoch: Option<u64>,
    pub checkpointed_upto: u64,
    /// Checkpoints that answered a newer epoch than the one before: the
    /// workspace was rebound in between.
    pub rebinds_seen: u64,
    /// The session's slowest call so far (retries included): what, when it
    /// started (ms on the drill's clock), how long it took (ms).
    pub slowest: Option<(String, u64, u64)>,
    /// Seqs whose append failed (they may or may not be in the file).
    pub unwritten: Vec<u64>,
    pub checkpoints: u64,
    /// The checkpoint route is missing on this cluster (rebind not built).
    pub checkpoint_unsupported: bool,
    pub fenced: u64,
    pub calls: u64,
    pub retries: u64,
    pub user_errors: u64,
    pub first_errors: Vec<String>,
    /// The tries of calls that failed at least once or waited over
    /// [`SLOW_TRY`](super::conn::SLOW_TRY): when each started (ms on the drill's clock), how long
    /// it took (ms), through which node, what came back; the first
    /// [`TRIES_KEPT`]: where a session's outage went, try by try.
    pub tries: Vec<(u64, u64, String, String)>,
    /// (key, task id) of every task whose submit answered.
    pub tasks: Vec<(String, String)>,
    /// (first failure, next success) of the sandbox's calls, ms on the drill's clock.
    pub outages: Vec<(u64, u64)>,
    /// For a session of a lost node: when the sandbox serving it at the end
    /// was made (its record's `createdAt`, ms on the drill's clock), the
    /// start of its re-creation elsewhere.
    pub remade_ms: Option<u64>,
    /// Still failing at the end (first failure, ms).
    pub open_outage: Option<u64>,
    // Verification.
    pub readable: bool,
    pub written_lost: u64,
    pub acked_lost: u64,
    pub corrupted: u64,
}

impl SessionResult {
    /// Keeps the outages of the session's sandbox and workspace (what MTTR
    /// measures), for a call that needed them (an append, a checkpoint),
    /// started at `started`, ended at `now` (`ok`), its first failed try at
    /// `failed`; the session's node lost at `lost` (ms on the drill's
    /// clock). A call that failed at least once opens an outage; the next
    /// that succeeds closes it. A checkpoint that retried through the whole
    /// rebind is such a call too (without it, sessions whose appends never
    /// failed counted as never recovered). So is the first call that started
    /// after the node was lost and succeeded without a failed try: the node
    /// it reached held it until the sandbox was re-created (three sessions
    /// of the first drill with `--rebind-hold` counted as never recovered).
    fn outage(&mut self, now: u64, ok: bool, failed: Option<u64>, started: u64, lost: Option<u64>) {
        if !ok {
            self.open_outage.get_or_insert(failed.unwrap_or(now));
        } else if let Some(open) = self.open_outage.take() {
            self.outages.push((open, now));
        } else if let Some(f) = failed {
            self.outages.push((f, now));
        } else if let Some(lost) = lost.filter(|l| started >= *l) {
            if !self.outages.iter().any(|(_, back)| *back > lost) {
                self.outages.push((started, now));
            }
        }
    }

    /// A call `what` that started at `at_ms` has taken `took` so far.
    pub(super) fn took(&mut self, what: &str, at_ms: u64, took: Duration) {
        let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        if self.slowest.as_ref().is_none_or(|s| s.2 < ms) {
            self.slowest = Some((what.to_string(), at_ms, ms));
        }
    }

    /// A checkpoint answered at `epoch`, taken after seq `upto` was written.
    /// The workspace was made by this session at epoch 1.
    pub fn acknowledge(&mut self, epoch: u64, upto: u64) {
        let prev = self.epoch.unwrap_or(1);
        if epoch == prev && upto > self.checkpointed_upto {
            self.acked_ranges.push((self.checkpointed_upto, upto));
            self.acked += upto - self.checkpointed_upto;
        }
        if epoch != prev {
            self.rebinds_seen += 1;
        }
        self.epoch = Some(epoch);
        self.checkpointed_upto = self.checkpointed_upto.max(upto);
    }

    /// Keeps try `what` through `url`, bounded by [`TRIES_KEPT`].
    pub(super) fn keep_try(&mut self, at_ms: u64, took: Duration, url: &str, what: String) {
        if self.tries.len() < TRIES_KEPT {
            let mut what = what;
            what.truncate(what.floor_char_boundary(160));
            let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
            self.tries.push((at_ms, ms, url.to_string(), what));
        }
    }

    /// Whether record `seq` was acknowledged.
    pub fn is_acked(&self, seq: u64) -> bool {
        self.acked_ranges.iter().any(|&(after, upto)| seq > after && seq <= upto)
    }
}

/// No checkpoint route on this cluster (rebind not built yet): not a
/// user-visible error of the drill's making; the report says so.
fn missing_route(e: &ClientError) -> bool {
    matches!(e, ClientError::Api { status: 404 | 405, code, .. } if !code.starts_with("WORKSPACE::"))
}

/// `<session> <seq> <payload> <sha256 of the rest, 16 hex>`.
pub fn record(session: u32, seq: u64) -> String {
    let body = format!("{session} {seq} p{:016x}", fastrand::u64(..));
    format!("{body} {}", digest(&body))
}

fn digest(body: &str) -> String {
    let d = Sha256::digest(body.as_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Checks the records file of `session`: the records seen, by seq, and the
/// count of lines whose checksum (or shape) is wrong.
pub fn parse_records(session: u32, data: &[u8]) -> (BTreeMap<u64, String>, u64) {
    let (mut seen, mut bad) = (BTreeMap::new(), 0);
    for line in String::from_utf8_lossy(data).lines() {
        let ok = line.rsplit_once(' ').filter(|(body, sum)| digest(body) == *sum).and_then(|(body, _)| {
            let mut f = body.split(' ');
            let s = f.next()?.parse::<u32>().ok()?;
            let q = f.next()?.parse::<u64>().ok()?;
            (s == session).then_some(q)
        });
        match ok {
            Some(q) => {
                seen.insert(q, line.to_string());
            }
            None => bad += 1,
        }
    }
    (seen, bad)
}

pub struct Session {
    pub conn: Conn,
    pub r: SessionResult,
    pub run: String,
}

impl Session {
    /// Creates the workspace and the rebind sandbox through the entry node.
    pub async fn open(&mut self) -> Result<(), ClientError> {
        let ws = self.r.workspace.clone();
        self.conn
            .call(&mut self.r, "create workspace", |c| {
                let ws = ws.clone();
                async move { c.create_workspace(&ws, "64Mi").await }
            })
            .await
            .0?;
        let req = CreateSandboxRequest {
            template: Some("host".into()),
            extensions: Some(BTreeMap::from([("restartPolicy".into(), "rebind".into())])),
            workspaces: vec![WorkspaceMountSpec {
                name: ws,
                mount_path: Some("/workspace".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let (created, _) = self
            .conn
            .call(&mut self.r, "create sandbox", |c| {
                let req = req.clone();
                async move { c.create_sandbox(&req).await }
            })
            .await;
        let id = created?.0.id;
        self.r.sandbox = Some(id);
        Ok(())
    }

    /// The loop, until the drill says stop.
    pub async fn run(&mut self, shared: &Shared, pace: Duration) {
        let Some(id) = self.r.sandbox.clone() else { return };
        let mut seq = 0;
        while !shared.stop.load(Ordering::Relaxed) {
            seq += 1;
            self.append(shared, &id, seq).await;
            if seq % CHECKPOINT_EVERY == 0 && !self.r.checkpoint_unsupported {
                self.checkpoint().await;
            }
            if seq % TASK_EVERY == 0 {
                self.submit(seq / TASK_EVERY).await;
            }
            tokio::time::sleep(pace).await;
        }
    }

    /// What the sandbox looks like from inside after a failed append (who
    /// runs, who owns the records), for the report: one try, short.
    async fn look(&self, id: &str) -> String {
        let req = RunCommandRequest {
            command: Some(
                "id -u; cat /proc/self/uid_map; ls -lnd /workspace /workspace/records; mount | grep workspace".into(),
            ),
            ..Default::default()
        };
        let mut out = String::new();
        let c = self.conn.entry();
        let res = c.exec(id, &req, |ev| {
            if out.len() < 400 {
                out.push_str(ev.text.as_deref().unwrap_or_default());
            }
        });
        match res.await {
            Ok(_) => out.split_whitespace().collect::<Vec<_>>().join(" "),
            Err(e) => format!("(look failed: {e})"),
        }
    }

    async fn append(&mut self, shared: &Shared, id: &str, seq: u64) {
        let line = record(self.r.index, seq);
        let req = RunCommandRequest {
            // Idempotent, so that a try cut off mid-answer can be repeated:
            // a line already there (the cut try ran) is not appended twice.
            command: Some(format!(
                "grep -qxF '{line}' /workspace/records 2>/dev/null || printf '%s\\n' '{line}' >> /workspace/records"
            )),
            ..Default::default()
        };
        // The last try's stderr, kept short: what a failed append said.
        let stderr = Arc::new(parking_lot::Mutex::new(String::new()));
        let started = Instant::now();
        let (res, failed) = self
            .conn
            .call(&mut self.r, "append", |c| {
                let req = req.clone();
                let id = id.to_string();
                let stderr = stderr.clone();
                stderr.lock().clear();
                async move {
                    c.exec(&id, &req, |ev| {
                        let mut e = stderr.lock();
                        if ev.kind == "stderr" && e.len() < 200 {
                            e.push_str(ev.text.as_deref().unwrap_or_default());
                        }
                    })
                    .await
                }
            })
            .await;
        let ok = matches!(&res, Ok(o) if o.exit_code == Some(0));
        if ok {
            self.r.written = seq;
        } else {
            self.r.unwritten.push(seq);
            if let Ok(o) = &res {
                self.r.user_errors += 1;
                if self.r.first_errors.len() < 3 {
                    let said = stderr.lock().trim().to_string();
                    let seen = self.look(id).await;
                    self.r.first_errors.push(format!("append exited {:?}: {:?} {said}; {seen}", o.exit_code, o.error));
                }
            }
        }
        self.outage(shared, ok, failed, started);
    }

    /// [`SessionResult::outage`] on the drill's clock.
    fn outage(&mut self, shared: &Shared, ok: bool, failed: Option<Instant>, started: Instant) {
        let lost = shared.faulted.lock().get(&self.r.node).copied();
        let now = shared.ms(Instant::now());
        self.r.outage(now, ok, failed.map(|f| shared.ms(f)), shared.ms(started), lost);
    }

    async fn checkpoint(&mut self) {
        let before = self.r.written;
        let ws = self.r.workspace.clone();
        let started = Instant::now();
        let (res, failed) = self
            .conn
            .call_expecting(&mut self.r, "checkpoint", missing_route, |c| {
                let ws = ws.clone();
                async move { c.checkpoint_workspace(&ws).await }
            })
            .await;
        let shared = self.conn.shared.clone();
        self.outage(&shared, res.is_ok(), failed, started);
        match res {
            Ok(c) => {
                self.r.checkpoints += 1;
                self.r.acknowledge(c.epoch, before);
            }
            Err(ClientError::Api { status: 409, code, .. }) if code == "WORKSPACE::FENCED" => {
                self.r.fenced += 1;
            }
            Err(e) if missing_route(&e) => self.r.checkpoint_unsupported = true,
            Err(_) => {}
        }
    }

    async fn submit(&mut self, k: u64) {
        let key = format!("{}-{}-{k}", self.run, self.r.index);
        let req = SubmitTaskRequest {
            command: vec!["sh".into(), "-c".into(), format!("echo done {key}")],
            key: Some(key.clone()),
            reuse_sandbox: Some(true),
            ..Default::default()
        };
        let (res, _) = self
            .conn
            .call(&mut self.r, "submit task", |c| {
                let req = req.clone();
                async move { c.submit_task(&req).await }
            })
            .await;
        if let Ok((t, _)) = res {
            self.r.tasks.push((key, t.id));
        }
    }

    /// When the session's sandbox was made ([`SessionResult::remade_ms`]).
    pub async fn made_at(&mut self, shared: &Shared) -> Option<u64> {
        let info = self.on_sandbox("read the sandbox", |c, id| async move { c.get_sandbox(&id).await }).await?;
        shared.ms_of(&info.created_at)
    }

    /// The records file, under the retry policy.
    pub async fn read_records(&mut self) -> Option<Bytes> {
        self.on_sandbox("read records", |c, id| async move { c.download(&id, "/workspace/records").await }).await
    }

    /// `f` on the session's sandbox under the retry policy (`None`: it has
    /// none, or the call failed).
    async fn on_sandbox<T, F, Fut>(&mut self, what: &'static str, f: F) -> Option<T>
    where
        F: Fn(ember_client::Client, String) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let id = self.r.sandbox.clone()?;
        let (res, _) = self.conn.call(&mut self.r, what, |c| f(c, id.clone())).await;
        res.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::{SessionResult, TRIES_KEPT};
    use std::time::Duration;

    #[test]
    fn a_nodes_time_is_read_on_the_drills_clock() {
        let shared = super::Shared {
            t0: std::time::Instant::now(),
            t0_unix_ms: 1_796_581_599_000,
            stop: false.into(),
            events: Default::default(),
            probes: Default::default(),
            faulted: Default::default(),
            health: Default::default(),
        };
        // 2026-12-06T18:26:39Z is t0.
        assert_eq!(shared.ms_of("2026-12-06T18:26:39Z"), Some(0));
        assert_eq!(shared.ms_of("2026-12-06T18:27:44.232Z"), Some(65_232));
        assert_eq!(shared.ms_of("2026-12-06T19:27:44.232+01:00"), Some(65_232), "an offset");
        assert_eq!(shared.ms_of("2026-12-06T18:26:38.999Z"), None, "before the drill");
        assert_eq!(shared.ms_of("yesterday"), None);
    }

    #[test]
    fn a_sessions_tries_are_kept_bounded_in_number_and_length() {
        let mut r = SessionResult::default();
        let long = "é".repeat(200);
        for i in 0..(TRIES_KEPT as u64 + 5) {
            r.keep_try(i * 100, Duration::from_millis(1_234), "http://h1", format!("append: {long}"));
        }
        assert_eq!(r.tries.len(), TRIES_KEPT, "the first ones only");
        let (at, took, url, what) = &r.tries[3];
        assert_eq!((*at, *took, url.as_str()), (300, 1_234, "http://h1"));
        assert!(what.len() <= 160 && what.starts_with("append: é"), "{what}");
    }

    #[test]
    fn a_call_held_through_the_rebind_is_the_sessions_recovery() {
        let mut r = SessionResult::default();
        r.outage(100, true, None, 90, None);
        r.outage(200, true, None, 150, Some(160));
        assert!(r.outages.is_empty(), "calls before the loss, or started before it, are no outage");
        // Started after the loss, held, answered at 7,000 without a failed try.
        r.outage(7_000, true, None, 300, Some(160));
        r.outage(7_500, true, None, 7_100, Some(160));
        assert_eq!(r.outages, [(300, 7_000)], "the first call after the loss only");
    }

    #[test]
    fn a_failed_try_opens_an_outage_the_next_success_closes() {
        let mut r = SessionResult::default();
        r.outage(500, false, Some(200), 150, Some(160));
        r.outage(900, false, Some(600), 550, Some(160));
        r.outage(4_000, true, None, 1_000, Some(160));
        r.outage(5_000, true, Some(4_200), 4_100, Some(160));
        assert_eq!(r.outages, [(200, 4_000), (4_200, 5_000)]);
        assert_eq!(r.open_outage, None);
    }

    /// Records appended between the last checkpoint before a rebind and the
    /// first one after it are not acknowledged by that one (it answers the
    /// new epoch); those before and after are.
    #[test]
    fn a_checkpoint_at_a_new_epoch_acknowledges_nothing_written_before_it() {
        let mut r = SessionResult::default();
        r.acknowledge(1, 4);
        r.acknowledge(1, 8);
        r.acknowledge(2, 12);
        r.acknowledge(2, 16);
        assert!((1..=8).all(|q| r.is_acked(q)));
        assert!((9..=12).all(|q| !r.is_acked(q)));
        assert!((13..=16).all(|q| r.is_acked(q)));
        assert!(!r.is_acked(17));
        assert_eq!((r.acked, r.rebinds_seen, r.epoch), (12, 1, Some(2)));
    }

    /// Rebound before its first checkpoint: nothing before it is acknowledged.
    #[test]
    fn a_first_checkpoint_past_epoch_one_acknowledges_nothing() {
        let mut r = SessionResult::default();
        r.acknowledge(2, 4);
        assert!(!r.is_acked(1));
        assert_eq!(r.acked, 0);
    }
}
