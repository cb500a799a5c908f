//! Warm claims pulled over NATS, not pushed.
//!
//! A create naming a pool (`extensions.poolRef`) through any node is a core
//! NATS request to `<prefix>.pool.<name>.claim` (`ember.pool.<name>.claim`)
//! in queue group `<name>`: NATS hands it to one subscriber, and only nodes
//! with an idle member of the pool subscribe (each [`SUBSCRIPTIONS`] tick,
//! and at once after a claim that left none). The responder claims locally
//! (`LaunchMode::Warm`: the engine's claim path binds env, user and
//! workspaces; a pop from the pool's idle queue under its lock, so two
//! requests never get one member), records the sandbox in the sandbox
//! registry and answers it. No subscriber is NATS's immediate "no
//! responders": a miss, and the requesting node places a cold create by
//! best-of-two on free memory (`plane.rs`). A responder whose last member
//! went between its tick and the request answers a miss too.
use super::plane::ClusterPlane;
use ember_engine::{CreateSandbox, EngineError, LaunchMode, SandboxRecord};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// How often a node brings its claim subscriptions in line with its idle
/// members (a claim that empties a pool does so at once).
pub const SUBSCRIPTIONS: Duration = Duration::from_millis(100);
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

/// This node's claim subscriptions: pool → the stop of its serving task.
#[derive(Default)]
pub(super) struct Subscriptions {
    open: Mutex<HashMap<String, oneshot::Sender<()>>>,
}

impl ClusterPlane {
    fn claim_subject(&self, pool: &str) -> String {
        format!("{}.pool.{pool}.claim", self.cfg.prefix)
    }

    /// Keeps a subscription open for each pool with an idle member here,
    /// for the process's life; feeds the heartbeat's pool loads.
    pub(super) async fn subscription_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(SUBSCRIPTIONS);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.local_pools().await {
                Ok(pools) => {
                    for (name, s) in pools {
                        self.subscribed(&name, s.idle > 0).await;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "this node's pools"),
            }
            let gone: Vec<String> = {
                let loads = self.desired.loads();
                let open = self.subs.open.lock().unwrap_or_else(|p| p.into_inner());
                open.keys().filter(|n| !loads.contains_key(*n)).cloned().collect()
            };
            for name in gone {
                self.subscribed(&name, false).await;
            }
        }
    }

    /// Opens or closes pool `name`'s claim subscription.
    async fn subscribed(self: &Arc<Self>, name: &str, want: bool) {
        let open = self.subs.open.lock().unwrap_or_else(|p| p.into_inner()).contains_key(name);
        if want == open {
            return;
        }
        if !want {
            self.unsubscribe(name);
            return;
        }
        match self.nats.queue_subscribe(self.claim_subject(name), name.to_string()).await {
            Ok(sub) => {
                let (stop, stopped) = oneshot::channel();
                self.subs.open.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), stop);
                tokio::spawn(self.clone().serve_claims(name.to_string(), sub, stopped));
            }
            Err(e) => tracing::warn!(pool = %name, error = %e, "subscribing to the pool's claims"),
        }
    }

    /// Closes pool `name`'s claim subscription (its task drains it).
    fn unsubscribe(&self, name: &str) {
        if let Some(stop) = self.subs.open.lock().unwrap_or_else(|p| p.into_inner()).remove(name) {
            let _ = stop.send(());
        }
    }

    /// Answers the claims of one pool until told to stop; then drains: the
    /// requests already delivered are answered, none is left unanswered.
    async fn serve_claims(
        self: Arc<Self>,
        pool: String,
        mut sub: async_nats::Subscriber,
        mut stopped: oneshot::Receiver<()>,
    ) {
        let mut draining = false;
        loop {
            let msg = tokio::select! {
                m = sub.next() => m,
                _ = &mut stopped, if !draining => {
                    draining = true;
                    if let Err(e) = sub.drain().await {
                        tracing::warn!(pool = %pool, error = %e, "draining the pool's claims");
                    }
                    continue;
                }
            };
            let Some(msg) = msg else { return };
            tokio::spawn(self.clone().answer_claim(pool.clone(), msg));
        }
    }

    async fn answer_claim(self: Arc<Self>, pool: String, msg: async_nats::Message) {
        let Some(reply_to) = msg.reply.clone() else { return };
        let reply = match serde_json::from_slice::<CreateSandbox>(&msg.payload) {
            Ok(req) => self.claim_here(req).await,
            Err(e) => ClaimReply::Invalid { message: format!("unreadable claim: {e}") },
        };
        let body = serde_json::to_vec(&reply).unwrap_or_default();
        if let Err(e) = self.nats.publish(reply_to, body.into()).await {
            tracing::warn!(pool = %pool, error = %e, "answering a claim");
        }
        // The last idle member gone: stop taking this pool's claims now.
        if matches!(self.local().pool_status(&pool).await, Ok(s) if s.idle == 0) {
            self.unsubscribe(&pool);
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
            // Its pool went (removed from the cluster) since the tick: no member.
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

    /// Asks the nodes with an idle member of `req.pool` for one: the claimed
    /// sandbox, or `None` on a miss (no responder, or none left).
    pub(super) async fn claim_anywhere(
        &self,
        pool: &str,
        req: &CreateSandbox,
    ) -> Result<Option<SandboxRecord>, EngineError> {
        let body = serde_json::to_vec(req).map_err(|e| EngineError::Internal(format!("encode a claim: {e}")))?;
        let request = async_nats::Request::new().payload(body.into()).timeout(Some(CLAIM_WAIT));
        let sent = self.nats.send_request(self.claim_subject(pool), request);
        let span = tracing::info_span!("claim_request", pool = %pool);
        let answer = match tracing::Instrument::instrument(sent, span).await {
            Ok(m) => m,
            Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => return Ok(None),
            Err(e) => {
                // NATS unreachable, or a responder that never answered: a
                // cold create still serves the client.
                tracing::warn!(pool = %pool, error = %e, "a claim over NATS; starting cold");
                return Ok(None);
            }
        };
        match serde_json::from_slice::<ClaimReply>(&answer.payload) {
            Ok(ClaimReply::Claimed(rec)) => Ok(Some(*rec)),
            Ok(ClaimReply::Miss) => Ok(None),
            Ok(ClaimReply::Invalid { message }) => Err(EngineError::InvalidRequest { field: "poolRef", message }),
            Ok(ClaimReply::Failed { message }) => {
                Err(EngineError::Internal(format!("pool {pool}: a claim: {message}")))
            }
            Err(e) => Err(EngineError::Internal(format!("pool {pool}: an unreadable claim answer: {e}"))),
        }
    }
}
