//! Warm claims pulled over NATS, not pushed.
//!
//! A create naming a pool (`extensions.poolRef`) through any node is claimed
//! first on that node if it has an idle member (no NATS at all), else asked
//! of the nodes whose heartbeats say they have one, in [`claim_order`]: a
//! core NATS request to each node's own subject `<prefix>.node.<name>.claim`
//! (`ember.node.h3.claim`), at most [`CLAIM_TRIES`] of them. Every node that
//! runs sandboxes subscribes to its subject once, for its life: nothing
//! subscribes or unsubscribes as members come and go. (Before, a node joined
//! a pool's queue group while it had an idle member and left it at none;
//! a request in flight as it left was lost, because async-nats drops a
//! drained subscription once its UNSUB is written, and its requester waited
//! 10 s: `ember bench cluster` showed the stall in 3 of 10 figures.)
//!
//! The responder claims locally (`LaunchMode::Warm`: the engine's claim path
//! binds env, user and workspaces; a pop from the pool's idle queue under its
//! lock, so two requests never get one member), records the sandbox in the
//! sandbox registry and answers it. A node whose last member went since its
//! heartbeat answers a miss and the requester asks the next; when none is
//! left the requesting node places a cold create by best-of-two on free
//! memory (`plane.rs`).
use super::plane::ClusterPlane;
use super::registry::NodeInfo;
use ember_engine::{CreateSandbox, EngineError, LaunchMode, SandboxRecord};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// How many nodes a claim asks before it starts cold: a heartbeat's idle
/// count is up to one beat old, so the first may have none left.
pub const CLAIM_TRIES: usize = 3;
/// How long a requester waits for a responder's answer: a claim is a pop
/// and one agent exchange (the agent's own deadline is 5 s).
const CLAIM_WAIT: Duration = Duration::from_secs(10);

/// A responder's answer.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum ClaimReply {
    Claimed(Box<SandboxRecord>),
    Miss,
    /// The request itself is wrong (e.g. a `poolRef` of another template).
    Invalid {
        message: String,
    },
    Failed {
        message: String,
    },
}

/// The nodes to ask for a member of `pool`, in order: those that run
/// sandboxes, `me` left out, whose heartbeat counts an idle member, drawn
/// by weight of their idle count (a node with more is likelier first, and
/// concurrent requesters spread over the holders), at most [`CLAIM_TRIES`].
pub(super) fn claim_order(me: &str, pool: &str, live: &[NodeInfo], rng: &mut fastrand::Rng) -> Vec<String> {
    let mut left: Vec<(u64, &NodeInfo)> = live
        .iter()
        .filter(|n| !n.api_only && n.name != me)
        .filter_map(|n| n.pools.get(pool).map(|l| (u64::from(l.idle), n)))
        .filter(|(idle, _)| *idle > 0)
        .collect();
    let mut out = Vec::new();
    while !left.is_empty() && out.len() < CLAIM_TRIES {
        let total: u64 = left.iter().map(|(w, _)| w).sum();
        let mut at = rng.u64(..total);
        let mut i = 0;
        while at >= left[i].0 {
            at -= left[i].0;
            i += 1;
        }
        out.push(left.swap_remove(i).1.name.clone());
    }
    out
}

impl ClusterPlane {
    fn claim_subject(&self, node: &str) -> String {
        format!("{}.node.{node}.claim", self.cfg.prefix)
    }

    /// Answers the claims asked of this node, for the process's life (the
    /// client resubscribes after a reconnect by itself).
    pub(super) async fn serve_claims(self: Arc<Self>) {
        let subject = self.claim_subject(self.name());
        let mut sub = loop {
            match self.nats.subscribe(subject.clone()).await {
                Ok(sub) => break sub,
                Err(e) => tracing::warn!(subject = %subject, error = %e, "subscribing to this node's claims"),
            }
            tokio::time::sleep(super::registry::HEARTBEAT).await;
        };
        while let Some(msg) = sub.next().await {
            tokio::spawn(self.clone().answer_claim(msg));
        }
        tracing::warn!(subject = %subject, "this node's claims: the subscription ended");
    }

    async fn answer_claim(self: Arc<Self>, msg: async_nats::Message) {
        let Some(reply_to) = msg.reply.clone() else { return };
        let reply = match serde_json::from_slice::<CreateSandbox>(&msg.payload) {
            Ok(req) => self.claim_here(req).await,
            Err(e) => ClaimReply::Invalid { message: format!("unreadable claim: {e}") },
        };
        let body = serde_json::to_vec(&reply).unwrap_or_default();
        if let Err(e) = self.nats.publish(reply_to, body.into()).await {
            tracing::warn!(error = %e, "answering a claim");
        }
    }

    /// A warm claim on this node's engine, in the sandbox registry before it
    /// is answered so calls through any node route to it: as an idle member
    /// the upkeep (`beat.rs`) put it there already, unless it is younger
    /// than a heartbeat; then it is put now. That put on the answer's path
    /// was a quarter of a claim's time through the cluster (`ember bench
    /// cluster`, docs/cluster.md). A rebind session's request is kept for
    /// its rebind, as a cold create's is (`plane.rs`): without it, a session
    /// claimed warm was lost with its node.
    async fn claim_here(&self, req: CreateSandbox) -> ClaimReply {
        // Re-created elsewhere, it starts cold from its pool's template.
        let rebind = req.rebind.then(|| CreateSandbox { launch: LaunchMode::Cold, ..req.clone() });
        let rec = match self.local().create(CreateSandbox { launch: LaunchMode::Warm, ..req }).await {
            Ok(rec) => rec,
            // None left (claimed since the heartbeat), or the pool went: no member.
            Err(EngineError::PoolEmpty(_) | EngineError::PoolNotFound(_)) => return ClaimReply::Miss,
            Err(EngineError::InvalidRequest { message, .. }) => return ClaimReply::Invalid { message },
            Err(e) => return ClaimReply::Failed { message: e.to_string() },
        };
        if let Some(req) = rebind {
            if let Err(e) = self.record_rebind(rec.id.as_str(), &req).await {
                if let Err(err) = self.local().remove(rec.id.as_str()).await {
                    tracing::warn!(sandbox = %rec.id, error = %err, "removing a claim whose rebind entry failed");
                }
                return ClaimReply::Failed { message: e.to_string() };
            }
        }
        if !self.is_published(rec.id.as_str()) {
            let put = self.publish(rec.id.as_str(), rec.state.to_string());
            let span = tracing::info_span!("registry_put", sandbox = %rec.id);
            if let Err(e) = tracing::Instrument::instrument(put, span).await {
                tracing::warn!(error = %e, "sandbox registry after a claim; the reconciler retries");
            }
        }
        ClaimReply::Claimed(Box::new(rec))
    }

    /// A member of pool `pool` for `req`: this node's own if it had an idle
    /// one at its last count, else one from the nodes [`claim_order`] picks; `None` when all
    /// of them missed (the caller starts it cold).
    pub(super) async fn claim_anywhere(
        &self,
        pool: &str,
        req: &CreateSandbox,
    ) -> Result<Option<SandboxRecord>, EngineError> {
        // This node's count as of its last convergence (≤ one heartbeat
        // old; a pool's status reads every member's memory, too dear here).
        let here = self.desired.loads().get(pool).is_some_and(|l| l.idle > 0);
        if !self.api_only() && here {
            let claimed = answered(pool, self.claim_here(req.clone()).await)?;
            tracing::debug!(pool = %pool, node = %self.name(), warm = claimed.is_some(), "a claim asked here");
            if let Some(rec) = claimed {
                return Ok(Some(rec));
            }
        }
        let order = claim_order(self.name(), pool, &self.live_nodes(), &mut fastrand::Rng::new());
        if order.is_empty() {
            return Ok(None);
        }
        let body: bytes::Bytes =
            serde_json::to_vec(req).map_err(|e| EngineError::Internal(format!("encode a claim: {e}")))?.into();
        for node in &order {
            let request = async_nats::Request::new().payload(body.clone()).timeout(Some(CLAIM_WAIT));
            let sent = self.nats.send_request(self.claim_subject(node), request);
            let span = tracing::info_span!("claim_request", pool = %pool, node = %node);
            let reply = match tracing::Instrument::instrument(sent, span).await {
                Ok(m) => match serde_json::from_slice::<ClaimReply>(&m.payload) {
                    Ok(r) => r,
                    Err(e) => ClaimReply::Failed { message: format!("an unreadable claim answer: {e}") },
                },
                // Gone since its heartbeat (no responders), NATS unreachable,
                // or no answer in time: ask the next.
                Err(e) => {
                    tracing::warn!(pool = %pool, node = %node, error = %e, "a claim over NATS");
                    continue;
                }
            };
            let claimed = answered(pool, reply)?;
            tracing::debug!(pool = %pool, node = %node, warm = claimed.is_some(), "a claim asked");
            if let Some(rec) = claimed {
                return Ok(Some(rec));
            }
        }
        Ok(None)
    }
}

/// A claim's answer as the requester takes it: the sandbox, a miss, or an error.
fn answered(pool: &str, reply: ClaimReply) -> Result<Option<SandboxRecord>, EngineError> {
    match reply {
        ClaimReply::Claimed(rec) => Ok(Some(*rec)),
        ClaimReply::Miss => Ok(None),
        ClaimReply::Invalid { message } => Err(EngineError::InvalidRequest { field: "poolRef", message }),
        ClaimReply::Failed { message } => Err(EngineError::Internal(format!("pool {pool}: a claim: {message}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::registry::PoolLoad;

    fn node(name: &str, idle: u32, api_only: bool) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            advertise: format!("http://{name}:1"),
            api_only,
            free_memory_bytes: 1 << 30,
            sandboxes: 0,
            pools: [("py".to_string(), PoolLoad { idle, ..Default::default() })].into(),
        }
    }

    fn names(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }

    #[test]
    fn a_claim_asks_only_other_nodes_with_an_idle_member() {
        let live = [node("me", 5, false), node("a", 0, false), node("b", 2, false), node("api", 9, true)];
        let mut rng = fastrand::Rng::with_seed(1);
        assert_eq!(names(&claim_order("me", "py", &live, &mut rng)), ["b"]);
        assert!(claim_order("me", "other", &live, &mut rng).is_empty());
    }

    #[test]
    fn a_claim_asks_at_most_its_tries_each_node_once() {
        let live: Vec<NodeInfo> = (0..10).map(|i| node(&format!("n{i}"), 1, false)).collect();
        for seed in 0..50 {
            let order = claim_order("n0", "py", &live, &mut fastrand::Rng::with_seed(seed));
            let mut seen = names(&order);
            assert_eq!(seen.len(), CLAIM_TRIES);
            assert!(!seen.contains(&"n0"));
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), CLAIM_TRIES, "{order:?}");
        }
    }

    #[test]
    fn a_node_with_more_idle_members_is_asked_first_more_often() {
        let live = [node("few", 1, false), node("many", 9, false)];
        let mut rng = fastrand::Rng::with_seed(7);
        let first_many = (0..1000).filter(|_| claim_order("me", "py", &live, &mut rng)[0] == "many").count();
        // Expected 900 of 1000; far from an even draw's 500.
        assert!((800..990).contains(&first_many), "{first_many}");
        // Both are asked whichever comes first.
        assert_eq!(claim_order("me", "py", &live, &mut rng).len(), 2);
    }
}
