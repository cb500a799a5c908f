//! The heartbeat of a cluster node: each [`HEARTBEAT`], the sandbox
//! registry is brought in line with this node's engine (the reconciler), and
//! this node's [`NodeInfo`] is put in the node registry (`registry.rs`).
use super::plane::{registry_error, ClusterPlane};
use super::registry::{self, NodeInfo, SandboxEntry, HEARTBEAT};
use async_nats::jetstream::kv;
use ember_engine::{EngineError, ListFilter};
use std::collections::HashMap;
use std::sync::Arc;

impl ClusterPlane {
    /// Writes sandbox `id`'s registry entry (after a create: other nodes can
    /// route to it before the next reconcile).
    pub(super) async fn publish(&self, id: &str, state: String) -> Result<(), EngineError> {
        let entry = SandboxEntry { node: self.cfg.name.clone(), state: state.clone() };
        let value = serde_json::to_vec(&entry).map_err(|e| EngineError::Internal(e.to_string()))?;
        self.sandboxes.put(id, value.into()).await.map_err(|e| registry_error("write", id, &e))?;
        self.published.lock().unwrap_or_else(|p| p.into_inner()).insert(id.to_string(), state);
        Ok(())
    }

    /// Whether this node has put sandbox `id` in the registry (and not
    /// deleted it since).
    pub(super) fn is_published(&self, id: &str) -> bool {
        self.published.lock().unwrap_or_else(|p| p.into_inner()).contains_key(id)
    }

    /// Deletes sandbox `id`'s registry entry if it still names this node (a
    /// sandbox rebound elsewhere is named by its new node).
    pub(super) async fn unpublish(&self, id: &str) -> Result<(), EngineError> {
        let entry = self.sandboxes.entry(id).await.map_err(|e| registry_error("read", id, &e))?;
        let ours = entry.as_ref().and_then(|e| serde_json::from_slice::<SandboxEntry>(&e.value).ok());
        if let (Some(e), Some(ours)) = (entry, ours) {
            if ours.node == self.cfg.name {
                let deleted = self.sandboxes.delete_expect_revision(id, Some(e.revision)).await;
                deleted.map_err(|e| registry_error("delete", id, &e))?;
            }
        }
        self.published.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        Ok(())
    }

    /// Brings the sandbox registry in line with this node's engine: what
    /// changed since the last write is put, what is gone is deleted. Catches
    /// every change the engine makes on its own (exit, TTL, OOM) and those
    /// made through another node's forwarded call. Idle pool members are
    /// put too, so a warm claim's answer need not wait for a registry write
    /// (`claims.rs`). Returns the count of sandboxes, members left out.
    async fn reconcile(&self) -> u64 {
        let all = ListFilter { pool_members: true, ..Default::default() };
        let Ok(mut list) = self.local.list(&all).await else { return 0 };
        // A standby is another node's sandbox's, ahead of its rebind: the
        // registry names that node until the rebind claims it.
        list.retain(|r| !r.is_standby());
        let held = list.iter().filter(|r| !r.lifecycle.is_hidden()).count() as u64;
        let now: HashMap<String, String> = list.iter().map(|r| (r.id.to_string(), r.state.to_string())).collect();
        let last = self.published.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (id, state) in &now {
            // A copy this node froze (it could not renew) may have been
            // rebound elsewhere: putting its Paused state would point the
            // registry back here, and the copy's eviction then deleted the
            // entry, leaving the session unreachable (the cut test's 503s).
            // Its state is put once it is thawed as this node's.
            if last.get(id) != Some(state) && !self.fence.is_frozen(id) {
                if let Err(e) = self.publish(id, state.clone()).await {
                    tracing::warn!(error = %e, "sandbox registry");
                }
            }
        }
        for id in last.keys().filter(|id| !now.contains_key(*id)) {
            if let Err(e) = self.unpublish(id).await {
                tracing::warn!(error = %e, "sandbox registry");
            }
        }
        held
    }

    /// The registries' upkeep: every [`HEARTBEAT`], the rebind sweep, then
    /// the sandbox registry brought in line (the count goes in the next
    /// heartbeat). Apart from [`ClusterPlane::beat`]: a sweep or a reconcile
    /// waits on other buckets, whose streams elect leaders of their own, and
    /// a node whose beat waited behind them was taken for dead by the others.
    pub(super) async fn upkeep(self: Arc<Self>) {
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // A rebind slot freed here starts the next claim at once, and a
            // node falling due for the verdict is swept for at that instant.
            // One held back past its due time by this node's own late beat
            // falls due when that beat comes back.
            let due = self.nodes.next_verdict().map(|at| at + VERDICT_SLACK);
            let overdue = self.nodes.overdue();
            let beat = tokio::select! {
                _ = tick.tick() => true,
                () = self.fence.freed.notified() => false,
                () = sleep_until(due), if due.is_some() => false,
                () = self.nodes.own_beat(), if overdue => {
                    tracing::debug!("a verdict fell due at this node's late beat");
                    false
                }
            };
            self.rebind_sweep().await;
            if !beat {
                continue;
            }
            // A node that cannot renew writes no registry entry: one queued
            // while cut off would land after its sandbox was rebound.
            if !self.cfg.api_only && self.fence.renewed() {
                let n = self.reconcile().await;
                self.held.store(n, std::sync::atomic::Ordering::Relaxed);
                self.standby_upkeep().await;
            }
        }
    }

    /// Starts the heartbeat on a thread, a runtime and a NATS connection of
    /// its own. On the main runtime's two workers (one per core) it waited
    /// behind whatever held them, restores and removals with blocking steps
    /// among them: on the 300-session drill nodes stopped renewing at a load
    /// average of 5 and were taken for dead, their sessions rebound.
    pub(super) fn spawn_beat(self: Arc<Self>) -> std::io::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        std::thread::Builder::new().name("ember-heartbeat".into()).spawn(move || rt.block_on(self.beat()))?;
        Ok(())
    }

    /// The node registry as the heartbeat's own connection opens it (tried
    /// again each [`HEARTBEAT`] until it opens).
    async fn beat_store(&self) -> kv::Store {
        let bucket = format!("{}_nodes", self.cfg.prefix);
        loop {
            let client = crate::connect::options(std::time::Duration::from_secs(2))
                .name(format!("{}-heartbeat", self.cfg.name))
                .connect(self.cfg.servers.as_slice())
                .await;
            let opened = match client {
                Ok(c) => async_nats::jetstream::new(c).get_key_value(&bucket).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            match opened {
                Ok(store) => return store,
                Err(e) => tracing::warn!(node = %self.cfg.name, error = %e, "heartbeat: connecting"),
            }
            tokio::time::sleep(HEARTBEAT).await;
        }
    }

    /// The heartbeat: every [`HEARTBEAT`], this node's [`NodeInfo`] put in
    /// the node registry, nothing else on its path. A put that has not
    /// answered within [`PUT_WAIT`] is given up: the next beat goes out on
    /// time (while a stream elects a leader, puts wait or fail for seconds).
    /// A main runtime that has not ticked for [`WEDGED_AFTER`] stops the
    /// beats: a node that serves nothing is dead, its sessions rebound.
    async fn beat(self: Arc<Self>) {
        let store = self.beat_store().await;
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Some(age) = self.fence.pulse_age().filter(|a| *a > WEDGED_AFTER) {
                tracing::warn!(node = %self.cfg.name, ?age, "heartbeat withheld: the main runtime is stuck");
                continue;
            }
            let Ok(value) = serde_json::to_vec(&self.node_info()) else { continue };
            let sent = std::time::Instant::now();
            match tokio::time::timeout(PUT_WAIT, store.put(&self.cfg.name, value.into())).await {
                Ok(Ok(_)) => self.fence.renewed_at(sent),
                Ok(Err(e)) => tracing::warn!(node = %self.cfg.name, error = %e, "heartbeat"),
                Err(_) => tracing::warn!(node = %self.cfg.name, "heartbeat: no answer within {PUT_WAIT:?}"),
            }
            if sent.elapsed() > HEARTBEAT {
                tracing::warn!(node = %self.cfg.name, took = ?sent.elapsed(), "heartbeat: a slow put");
            }
        }
    }

    fn node_info(&self) -> NodeInfo {
        let sandboxes = match self.cfg.api_only {
            true => self.published.lock().unwrap_or_else(|p| p.into_inner()).len() as u64,
            false => self.held.load(std::sync::atomic::Ordering::Relaxed),
        };
        NodeInfo {
            name: self.cfg.name.clone(),
            advertise: self.cfg.advertise.clone(),
            api_only: self.cfg.api_only,
            free_memory_bytes: registry::free_memory(),
            sandboxes,
            pools: self.desired.loads(),
        }
    }
}

/// Past a node's due verdict when the sweep wakes for it: the verdict is
/// `silence < DEAD_AFTER`, and a timer may fire a hair early.
const VERDICT_SLACK: std::time::Duration = std::time::Duration::from_millis(2);

/// Sleeps until `due`, or for good when there is none.
async fn sleep_until(due: Option<std::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// A main runtime this long without a tick serves nothing: its beats stop.
const WEDGED_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a heartbeat's put may wait: past the freeze, a late success
/// renews nothing anyway.
const PUT_WAIT: std::time::Duration = super::rebind::FREEZE_AFTER;
