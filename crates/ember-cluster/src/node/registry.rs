//! The node registry and the sandbox registry, two key-value buckets.
//!
//! `<prefix>_nodes`: node name → [`NodeInfo`], put by each node every
//! [`HEARTBEAT`]. Liveness is judged by each node's watcher, on its own
//! monotonic clock: a node is live while its last put arrived less than
//! [`DEAD_AFTER`] before this node's own last put came back ([`Nodes`]). No
//! two hosts' clocks are compared, so skew cannot make a node dead or alive. The bucket's `max_age` only collects the keys
//! of nodes gone for good.
//!
//! `<prefix>_sandboxes`: sandbox id → [`SandboxEntry`] (its node, its
//! state), written by the owning node alone (`reconcile` each heartbeat,
//! and right after a create through the cluster plane).
use crate::node::ClusterError;
use crate::retry;
use async_nats::jetstream::{self, kv};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a node puts its heartbeat.
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// A node whose last heartbeat arrived longer ago than this is dead: three
/// missed beats, so one slow put (a JetStream election is longer and is not
/// hidden) does not kill a node. MTTD ≤ `DEAD_AFTER` + the watcher's tick.
pub const DEAD_AFTER: Duration = Duration::from_millis(1500);
/// Keys of nodes not heard of for this long leave the bucket.
const NODE_MAX_AGE: Duration = Duration::from_secs(600);

/// What a node says about itself in each heartbeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    pub name: String,
    /// `http://host:port` of its API.
    pub advertise: String,
    /// Runs no sandboxes: never a placement target.
    pub api_only: bool,
    /// The host's available memory (`MemAvailable`), bytes.
    pub free_memory_bytes: u64,
    /// Sandboxes it holds (any state).
    pub sandboxes: u64,
    /// Its part of each cluster pool (`pools.rs`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pools: BTreeMap<String, PoolLoad>,
}

/// A node's part of one pool, as its heartbeat says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolLoad {
    pub target: u32,
    pub idle: u32,
    pub starting: u32,
    pub claims: u64,
    pub misses: u64,
}

/// Where a sandbox is, as the sandbox registry says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxEntry {
    pub node: String,
    pub state: String,
}

/// This node's view of the others: the last heartbeat of each, its KV
/// revision and when it arrived here.
///
/// A node is dead when it was silent for [`DEAD_AFTER`] of this node's own
/// *unbroken* run of beats: its last beat arrived more than `DEAD_AFTER`
/// before this node's own last beat came back, counting silence only from
/// the start of that run (the first own beat after a gap longer than
/// [`OWN_GAP`]). Silence is measured against beats that got through, not
/// against the clock: while the bucket takes no writes (its stream electing a
/// leader, seconds; this node cut off from NATS; its watch re-opening) no
/// beat arrives, this node's included, and nobody is taken for dead. When
/// the bucket comes back, every live node's next beat lands within a beat or
/// two, not all at once: without the run's start, the first node whose beat
/// came back took all the others for dead and rebound their sessions (the
/// chaos drill's "live node rebound" after the queue leader's SIGKILL).
/// Before this node's first beat came back, the clock alone judges.
pub struct Nodes {
    me: String,
    seen: Mutex<Seen>,
    /// Told each time this node's own beat comes back ([`Nodes::own_beat`]).
    own: tokio::sync::Notify,
}

#[derive(Default)]
struct Seen {
    nodes: HashMap<String, Beat>,
    /// When this node's current unbroken run of beats began.
    run_start: Option<Instant>,
}

struct Beat {
    info: NodeInfo,
    revision: u64,
    at: Instant,
}

/// A gap this long between two of this node's own beats coming back breaks
/// its run: two beats missed.
pub const OWN_GAP: Duration = Duration::from_millis(1000);

impl Seen {
    /// How long before the reference `at` was, from the run's start. The
    /// reference is `now`, but never more than one [`HEARTBEAT`] past this
    /// node's own last beat: while its beats come back on time the verdict
    /// falls due at the bound itself, not at the next beat after it (the
    /// reference was that beat: MTTD was the bound plus up to one beat, over
    /// 2 s in half the 300-session drills); once they stop coming (the
    /// bucket elects, this node is cut off) the silence stops growing.
    fn silence(&self, me: &str, at: Instant, now: Instant) -> Duration {
        match (self.nodes.get(me), self.run_start) {
            (Some(mine), Some(start)) => now.min(mine.at + HEARTBEAT).saturating_duration_since(at.max(start)),
            _ => now.saturating_duration_since(at),
        }
    }

    /// When [`Seen::silence`] starts counting for beat `b`, and so when `b`'s
    /// node falls due for the verdict, [`DEAD_AFTER`] after it.
    fn due(&self, me: &str, b: &Beat) -> Instant {
        let from = match (self.nodes.get(me), self.run_start) {
            (Some(_), Some(start)) => b.at.max(start),
            _ => b.at,
        };
        from + DEAD_AFTER
    }
}

impl Nodes {
    pub(crate) fn new(me: String) -> Nodes {
        Nodes { me, seen: Mutex::default(), own: tokio::sync::Notify::new() }
    }

    fn saw(&self, info: NodeInfo, revision: u64) {
        self.saw_at(info, revision, Instant::now());
    }

    /// Records heartbeat `info` (KV `revision`) as arrived at `at`. A
    /// revision already seen (a re-opened watch replays the last value of
    /// every key) is not an arrival: it would bring a dead node back to life.
    fn saw_at(&self, info: NodeInfo, revision: u64, at: Instant) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.nodes.get(&info.name).is_some_and(|b| b.revision >= revision) {
            return;
        }
        let own = info.name == self.me;
        if own {
            let last = seen.nodes.get(&self.me).map(|b| b.at);
            if last.is_none_or(|l| at.saturating_duration_since(l) > OWN_GAP) {
                seen.run_start = Some(at);
            }
        }
        seen.nodes.insert(info.name.clone(), Beat { info, revision, at });
        drop(seen);
        if own {
            self.own.notify_one();
        }
    }

    /// Returns when this node's own beat next comes back (at once if one
    /// came back since the last call). A verdict held back by this node's
    /// late beat ([`Nodes::overdue`]) falls due then.
    pub async fn own_beat(&self) {
        self.own.notified().await
    }

    /// Whether a node other than this one is past its due verdict
    /// ([`Nodes::next_verdict`]) yet still live, because this node's own
    /// beat that would make its silence count is late. On a loaded host the
    /// own beat came back after the due time and the sweep, woken at that
    /// time for nothing, slept until its next tick: up to a heartbeat more
    /// of MTTD (the 300-session drill's first claims 1.74-1.90 s after the
    /// kill, where the bound is 1.5 s).
    pub fn overdue(&self) -> bool {
        self.overdue_at(Instant::now())
    }

    fn overdue_at(&self, now: Instant) -> bool {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let others = seen.nodes.values().filter(|b| b.info.name != self.me);
        others.filter(|b| seen.due(&self.me, b) <= now).any(|b| seen.silence(&self.me, b.at, now) < DEAD_AFTER)
    }

    /// The live nodes, by name.
    pub fn live(&self) -> Vec<NodeInfo> {
        self.live_at(Instant::now())
    }

    fn live_at(&self, now: Instant) -> Vec<NodeInfo> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let live = |b: &&Beat| seen.silence(&self.me, b.at, now) < DEAD_AFTER;
        let mut out: Vec<NodeInfo> = seen.nodes.values().filter(live).map(|b| b.info.clone()).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Every node heard of, by name: its last heartbeat, whether it is live
    /// and how long it had been silent at this node's last beat.
    pub fn all(&self) -> Vec<(NodeInfo, bool, Duration)> {
        let (seen, now) = (self.seen.lock().unwrap_or_else(|p| p.into_inner()), Instant::now());
        let mut out: Vec<_> = seen
            .nodes
            .values()
            .map(|b| {
                let silent = seen.silence(&self.me, b.at, now);
                (b.info.clone(), silent < DEAD_AFTER, silent)
            })
            .collect();
        out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        out
    }

    /// When the first node other than this one falls due for the verdict
    /// if nothing more arrives from it (its silence reaching [`DEAD_AFTER`];
    /// this node's own beats still coming back), if after now. The upkeep's
    /// sweep wakes then, not at its next tick: a dead node's rebinds started
    /// up to one [`HEARTBEAT`] after the verdict, half a beat on average.
    pub fn next_verdict(&self) -> Option<Instant> {
        self.next_verdict_at(Instant::now())
    }

    fn next_verdict_at(&self, now: Instant) -> Option<Instant> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let others = seen.nodes.values().filter(|b| b.info.name != self.me);
        others.map(|b| seen.due(&self.me, b)).filter(|due| *due > now).min()
    }

    /// `name`'s last heartbeat, live or not (`None`: never heard of).
    pub fn last_seen(&self, name: &str) -> Option<NodeInfo> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).nodes.get(name).map(|b| b.info.clone())
    }

    /// `name`'s last heartbeat if it is live; else how long it had been
    /// silent at this node's last beat (`None`: never heard of).
    pub fn get(&self, name: &str) -> Result<NodeInfo, Option<Duration>> {
        self.get_at(name, Instant::now())
    }

    fn get_at(&self, name: &str, now: Instant) -> Result<NodeInfo, Option<Duration>> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match seen.nodes.get(name).map(|b| (b, seen.silence(&self.me, b.at, now))) {
            Some((b, silent)) if silent < DEAD_AFTER => Ok(b.info.clone()),
            Some((_, silent)) => Err(Some(silent)),
            None => Err(None),
        }
    }
}

/// How long the create of a missing bucket is waited for before the bucket
/// is looked up (another node may have made it meanwhile).
const CREATE_WAIT: Duration = Duration::from_secs(2);

/// Opens (creates if absent) a bucket read from its leader: a direct get is
/// answered by any replica, and a lagging one misses a sandbox just put (see
/// `queue/setup.rs`; seen as a sandbox "not found" through the non-owner
/// right after its create, one run in a few). It is made so
/// ([`crate::replicas::kv_stream`]); one an older ember made with direct
/// gets on, or with fewer replicas, is settled, and opened again.
///
/// A node starting while the cluster forms (or while a stream elects) gets
/// timeouts here that pass: each try is retried with the queue's policy
/// (`retry.rs`), so a start fails only when the bucket stays unreachable for
/// the whole budget (a node once exited at start on one "request timed out").
pub(crate) async fn bucket(
    js: &jetstream::Context,
    name: String,
    replicas: usize,
    max_age: Duration,
) -> Result<kv::Store, ClusterError> {
    let open = || async { open_bucket(js, &name, replicas, max_age).await.map_err(retry::again) };
    retry::retry(retry::RETRY_BUDGET, "open bucket", &name, open)
        .await
        .map_err(|e| ClusterError::Bucket { name: name.clone(), reason: e.to_string() })
}

/// One try of [`bucket`].
async fn open_bucket(
    js: &jetstream::Context,
    name: &str,
    replicas: usize,
    max_age: Duration,
) -> Result<kv::Store, String> {
    if js.get_key_value(name).await.is_err() {
        let config = crate::replicas::kv_stream(name, 1, max_age, replicas);
        // Another node may create it at the same moment: its error is ours
        // only if the stream is then still missing (below). Of two creates
        // at once NATS answered one and left the other unanswered until its
        // timeout (10 s a bucket: a node took 40 s to join beside another
        // started with it), so the create is waited for [`CREATE_WAIT`].
        match tokio::time::timeout(CREATE_WAIT, js.create_stream(config)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::debug!(bucket = %name, error = %e, "create bucket"),
            Err(_) => tracing::debug!(bucket = %name, "create bucket: no answer within {CREATE_WAIT:?}"),
        }
    }
    let mut stream = js.get_stream(format!("KV_{name}")).await.map_err(|e| e.to_string())?;
    let mut config = stream.info().await.map_err(|e| e.to_string())?.config.clone();
    if crate::replicas::settle(&mut config, replicas) {
        js.update_stream(config).await.map_err(|e| e.to_string())?;
    }
    js.get_key_value(name).await.map_err(|e| e.to_string())
}

pub(crate) async fn open_nodes(
    js: &jetstream::Context,
    prefix: &str,
    replicas: usize,
) -> Result<kv::Store, ClusterError> {
    bucket(js, format!("{prefix}_nodes"), replicas, NODE_MAX_AGE).await
}

pub(crate) async fn open_sandboxes(
    js: &jetstream::Context,
    prefix: &str,
    replicas: usize,
) -> Result<kv::Store, ClusterError> {
    bucket(js, format!("{prefix}_sandboxes"), replicas, Duration::ZERO).await
}

/// Reads every node's last heartbeat into `nodes` (as just seen), so a node
/// knows the cluster before it serves: an API-only node started after the
/// others can place its first create.
pub(crate) async fn load_nodes(store: &kv::Store, nodes: &Nodes) -> Result<(), ClusterError> {
    let fail = |e: &dyn std::fmt::Display| ClusterError::Bucket { name: "nodes".into(), reason: e.to_string() };
    let mut keys = store.keys().await.map_err(|e| fail(&e))?;
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| fail(&e))?;
        if let Some(e) = store.entry(&key).await.map_err(|e| fail(&e))? {
            if let Ok(info) = serde_json::from_slice::<NodeInfo>(&e.value) {
                nodes.saw(info, e.revision);
            }
        }
    }
    Ok(())
}

/// Follows the node bucket into `nodes` until the watch ends, then opens it
/// again (a lost connection ends it).
pub(crate) async fn watch_nodes(store: kv::Store, nodes: Arc<Nodes>) {
    loop {
        match store.watch_with_history(">").await {
            Ok(mut w) => {
                while let Some(entry) = w.next().await {
                    let Ok(entry) = entry else { break };
                    if entry.operation != kv::Operation::Put {
                        continue;
                    }
                    match serde_json::from_slice::<NodeInfo>(&entry.value) {
                        Ok(info) => nodes.saw(info, entry.revision),
                        Err(e) => tracing::warn!(key = %entry.key, error = %e, "unreadable node heartbeat"),
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "watching the node registry"),
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}

/// The host's `MemAvailable`, bytes (0 if unreadable).
pub(crate) fn free_memory() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            advertise: format!("http://{name}"),
            api_only: false,
            free_memory_bytes: 0,
            sandboxes: 0,
            pools: BTreeMap::new(),
        }
    }

    /// The live nodes at `ms` after `t0`.
    fn names(n: &Nodes, t0: Instant, ms: u64) -> Vec<String> {
        n.live_at(t0 + Duration::from_millis(ms)).into_iter().map(|i| i.name).collect()
    }

    /// Beats every 500 ms of `who` from `from` ms to `to` ms (revisions
    /// counted by `rev`).
    fn beats(n: &Nodes, t0: Instant, rev: &mut u64, who: &[&str], from: u64, to: u64) {
        for ms in (from..=to).step_by(500) {
            for w in who {
                *rev += 1;
                n.saw_at(info(w), *rev, t0 + Duration::from_millis(ms));
            }
        }
    }

    /// The bucket took no writes for 6 s (an election); this node's beat came
    /// back 1 s before b's: b is not dead (it was, on the rule without the
    /// run's start).
    #[test]
    fn after_an_election_the_first_beat_back_takes_nobody_for_dead() {
        let (n, t0, mut rev) = (Nodes::new("a".into()), Instant::now(), 0);
        beats(&n, t0, &mut rev, &["a", "b"], 0, 2000);
        beats(&n, t0, &mut rev, &["a"], 8000, 9000);
        assert_eq!(names(&n, t0, 9000), ["a", "b"]);
        assert!(n.get_at("b", t0 + Duration::from_millis(9000)).is_ok());
        // Still silent 1.5 s into this node's unbroken run: dead.
        beats(&n, t0, &mut rev, &["a"], 9500, 9500);
        assert_eq!(names(&n, t0, 9500), ["a"]);
        assert_eq!(n.get_at("b", t0 + Duration::from_millis(9500)).unwrap_err(), Some(Duration::from_millis(1500)));
    }

    /// While the bucket takes no writes, this node's included, the silence
    /// stops growing one beat after this node's last: nobody dies of it.
    #[test]
    fn silence_stops_growing_while_this_nodes_beats_do_not_come_back() {
        let (n, t0, mut rev) = (Nodes::new("a".into()), Instant::now(), 0);
        beats(&n, t0, &mut rev, &["a", "b"], 0, 2000);
        assert_eq!(names(&n, t0, 2400), ["a", "b"]);
        assert_eq!(names(&n, t0, 9000), ["a", "b"], "7 s of an election");
        assert_eq!(n.get_at("b", t0 + Duration::from_millis(9000)).map(|i| i.name), Ok("b".into()));
    }

    #[test]
    fn a_node_silent_through_this_nodes_beats_is_dead_after_the_bound() {
        let (n, t0, mut rev) = (Nodes::new("a".into()), Instant::now(), 0);
        beats(&n, t0, &mut rev, &["a", "b"], 0, 3000);
        beats(&n, t0, &mut rev, &["a"], 3500, 4000);
        assert_eq!(names(&n, t0, 4000), ["a", "b"], "1 s of silence");
        beats(&n, t0, &mut rev, &["a"], 4500, 4500);
        assert_eq!(names(&n, t0, 4500), ["a"], "1.5 s of silence");
    }

    /// The verdict does not wait for this node's next beat to come back: b
    /// is dead 1.5 s after its last beat arrived, between two of this
    /// node's (MTTD was the bound plus up to one beat, over 2 s on the drill).
    #[test]
    fn a_silent_node_is_dead_at_the_bound_between_this_nodes_beats() {
        let (n, t0, mut rev) = (Nodes::new("a".into()), Instant::now(), 0);
        beats(&n, t0, &mut rev, &["a", "b"], 0, 3000);
        beats(&n, t0, &mut rev, &["a"], 3500, 4000);
        assert_eq!(names(&n, t0, 4400), ["a", "b"], "1.4 s of silence");
        assert_eq!(names(&n, t0, 4500), ["a"], "1.5 s of silence, this node's next beat not back yet");
        let silent = n.get_at("b", t0 + Duration::from_millis(4700)).unwrap_err();
        assert_eq!(silent, Some(Duration::from_millis(1500)), "one beat past this node's last, no more");
    }

    /// b falls due while this node's own beat is late: b is still live
    /// then, and no timer is left to wake the sweep (the due time has
    /// passed); the own beat's arrival makes b dead and tells the upkeep.
    #[test]
    fn a_verdict_held_back_by_this_nodes_late_beat_is_told_when_that_beat_comes_back() {
        use futures_util::FutureExt;
        let (n, t0, mut rev) = (Nodes::new("a".into()), Instant::now(), 0);
        let at = |ms| t0 + Duration::from_millis(ms);
        beats(&n, t0, &mut rev, &["a", "b"], 0, 3000);
        // This node's beats come back late, 3,700 then 4,600 ms (less than
        // `OWN_GAP` apart: its run goes on).
        beats(&n, t0, &mut rev, &["a"], 3700, 3700);
        let _ = n.own_beat().now_or_never();
        assert!(!n.overdue_at(at(4400)), "not due yet");
        assert_eq!(names(&n, t0, 4500), ["a", "b"], "silence counted to 4,200 ms, a beat past this node's last");
        assert!(n.overdue_at(at(4500)));
        assert_eq!(n.next_verdict_at(at(4500)), None, "past due: no timer for it");
        assert!(n.own_beat().now_or_never().is_none(), "nothing came back yet");
        rev += 1;
        n.saw_at(info("a"), rev, at(4600));
        assert!(n.own_beat().now_or_never().is_some(), "the upkeep is told");
        assert_eq!(names(&n, t0, 4600), ["a"]);
        assert!(!n.overdue_at(at(4600)), "judged now");
    }

    #[test]
    fn the_next_verdict_falls_due_at_the_bound_after_the_first_silent_nodes_last_beat() {
        let (n, t0, mut rev) = (Nodes::new("a".into()), Instant::now(), 0);
        let at = |ms| t0 + Duration::from_millis(ms);
        beats(&n, t0, &mut rev, &["a", "b", "c"], 0, 3000);
        beats(&n, t0, &mut rev, &["a", "c"], 3500, 3500);
        beats(&n, t0, &mut rev, &["a"], 4000, 4000);
        // b's last beat at 3,000, c's at 3,500: b falls due first, at the
        // instant it is judged dead.
        assert_eq!(n.next_verdict_at(at(4100)), Some(at(4500)));
        assert_eq!(names(&n, t0, 4499), ["a", "b", "c"]);
        assert_eq!(names(&n, t0, 4500), ["a", "c"]);
        // Once b is past due, c's is next; this node's own beats are none.
        assert_eq!(n.next_verdict_at(at(4500)), Some(at(5000)));
        assert_eq!(n.next_verdict_at(at(5000)), None, "all due already: nothing to wake for");
    }

    /// After an election the count starts at this node's run: the verdict
    /// falls due then, not at once.
    #[test]
    fn after_an_election_the_next_verdict_counts_from_this_nodes_run() {
        let (n, t0, mut rev) = (Nodes::new("a".into()), Instant::now(), 0);
        beats(&n, t0, &mut rev, &["a", "b"], 0, 2000);
        beats(&n, t0, &mut rev, &["a"], 8000, 8000);
        assert_eq!(n.next_verdict_at(t0 + Duration::from_millis(8000)), Some(t0 + Duration::from_millis(9500)));
    }

    /// A re-opened watch replays b's last value: b stays dead.
    #[test]
    fn a_replayed_heartbeat_is_not_an_arrival() {
        let (n, t0, mut rev) = (Nodes::new("a".into()), Instant::now(), 0);
        beats(&n, t0, &mut rev, &["a", "b"], 0, 1000);
        let b_rev = rev;
        beats(&n, t0, &mut rev, &["a"], 1500, 4000);
        assert_eq!(names(&n, t0, 4000), ["a"]);
        n.saw_at(info("b"), b_rev, t0 + Duration::from_millis(4100));
        assert_eq!(names(&n, t0, 4100), ["a"]);
        n.saw_at(info("b"), rev + 1, t0 + Duration::from_millis(4200));
        assert_eq!(names(&n, t0, 4200), ["a", "b"]);
    }
}
