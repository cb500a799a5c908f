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

/// This node's view of the others: the last heartbeat of each and when it
/// arrived here.
///
/// A node is dead when its last beat arrived more than [`DEAD_AFTER`] before
/// this node's own last beat came back through the bucket: silence is
/// measured against a beat that got through, not against the clock alone.
/// While the bucket takes no writes (its stream electing a leader, seconds;
/// this node cut off from NATS) no beat arrives, this node's included, and
/// nobody is taken for dead: the lists stay whole instead of dropping every
/// other node's sandboxes. Before this node's first beat came back, the
/// clock alone judges.
pub struct Nodes {
    me: String,
    seen: Mutex<HashMap<String, (NodeInfo, Instant)>>,
}

impl Nodes {
    pub(crate) fn new(me: String) -> Nodes {
        Nodes { me, seen: Mutex::default() }
    }

    fn saw(&self, info: NodeInfo) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.insert(info.name.clone(), (info, Instant::now()));
    }

    /// How long `at` was before the reference beat (see the type's docs).
    fn silence(seen: &HashMap<String, (NodeInfo, Instant)>, me: &str, at: Instant) -> Duration {
        match seen.get(me) {
            Some((_, mine)) => mine.saturating_duration_since(at),
            None => at.elapsed(),
        }
    }

    /// The live nodes, by name.
    pub fn live(&self) -> Vec<NodeInfo> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<NodeInfo> = seen
            .values()
            .filter(|(_, at)| Self::silence(&seen, &self.me, *at) < DEAD_AFTER)
            .map(|(i, _)| i.clone())
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// `name`'s last heartbeat if it is live; else how long it had been
    /// silent at this node's last beat (`None`: never heard of).
    pub fn get(&self, name: &str) -> Result<NodeInfo, Option<Duration>> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match seen.get(name) {
            Some((info, at)) if Self::silence(&seen, &self.me, *at) < DEAD_AFTER => Ok(info.clone()),
            Some((_, at)) => Err(Some(Self::silence(&seen, &self.me, *at))),
            None => Err(None),
        }
    }
}

/// Opens (creates if absent) a bucket read from its leader: a direct get is
/// answered by any replica, and a lagging one misses a sandbox just put (see
/// `queue/setup.rs`). async-nats creates buckets with direct gets on, so the
/// stream is updated and the bucket opened again, on every start: a node
/// that found the bucket another node had just created must not keep the
/// direct reads it was opened with (seen as a sandbox "not found" through
/// the non-owner right after its create, one run in a few).
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
        let config = kv::Config {
            bucket: name.to_string(),
            history: 1,
            max_age,
            storage: jetstream::stream::StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        };
        // Another node may create it at the same moment: its error is ours
        // only if the stream is then still missing (below).
        if let Err(e) = js.create_key_value(config).await {
            tracing::debug!(bucket = %name, error = %e, "create bucket");
        }
    }
    let mut stream = js.get_stream(format!("KV_{name}")).await.map_err(|e| e.to_string())?;
    let mut config = stream.info().await.map_err(|e| e.to_string())?.config.clone();
    if config.allow_direct {
        config.allow_direct = false;
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
        if let Some(v) = store.get(&key).await.map_err(|e| fail(&e))? {
            if let Ok(info) = serde_json::from_slice::<NodeInfo>(&v) {
                nodes.saw(info);
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
                        Ok(info) => nodes.saw(info),
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
