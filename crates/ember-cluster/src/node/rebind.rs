//! Sessions that rebind (`extensions.restartPolicy = "rebind"`): the bucket
//! `<prefix>_rebind`, sandbox id → [`RebindEntry`] (the node that runs it,
//! its create request).
//!
//! Each heartbeat a live node reads the bucket ([`ClusterPlane::rebind_sweep`]):
//! an entry whose node is dead (the node registry's rule) is claimed by a
//! compare-and-set on its revision (of two survivors one wins) and re-created
//! here under the same id, each workspace taken over at the next epoch
//! (`workspaces.rs`) and restored from its last checkpoint; then the sandbox
//! registry names this node. A node that cannot renew (its heartbeat has not
//! got through for [`FREEZE_AFTER`], less than the [`DEAD_AFTER`] after which
//! the others may take it for dead) freezes its rebind sandboxes; once its
//! beats get through again it thaws those still its own and removes those
//! rebound elsewhere. So no two live, writable copies of one id.
use super::fence::lock;
use super::plane::ClusterPlane;
#[cfg(doc)]
use super::registry::DEAD_AFTER;
use async_nats::jetstream::kv;
use ember_engine::{CreateSandbox, EngineError, ListFilter, SandboxRecord};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A node whose last heartbeat that got through was sent this long ago
/// freezes its rebind sandboxes. The others judge it dead [`DEAD_AFTER`]
/// after that beat arrived, which is after it was sent: it is frozen first.
pub const FREEZE_AFTER: Duration = Duration::from_millis(1000);
/// How often the freeze is checked.
const FENCE_TICK: Duration = Duration::from_millis(100);

/// A rebind sandbox as the cluster keeps it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RebindEntry {
    /// The node that runs it (or is re-creating it).
    pub node: String,
    /// Claimed by `node`, not re-created yet.
    #[serde(default)]
    pub pending: bool,
    /// The create request, registry credentials left out.
    pub req: CreateSandbox,
}

/// Where one rebind's time went (logged with "rebound here"; docs/chaos.md
/// reads MTTR off these).
#[derive(Default)]
struct Steps {
    /// The workspaces' registry entries taken over at the next epoch.
    take: Duration,
    /// Their last checkpoints restored (or fresh workspaces made).
    restore: Duration,
    /// The sandbox created under its id.
    create: Duration,
    /// Of which the launch, from the create's start to its agent's answer
    /// (with its workspaces mounted), and its phases (µs): where a slow
    /// create spent its time.
    launch: Option<ember_engine::LaunchRecord>,
    /// The sandbox registry and the rebind entry pointed here.
    registry: Duration,
}

impl std::fmt::Display for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_millis();
        let (t, r, c, g) = (ms(self.take), ms(self.restore), ms(self.create), ms(self.registry));
        write!(f, "take {t} ms, restore {r} ms, create {c} ms")?;
        if let Some(l) = &self.launch {
            let phases: Vec<String> = l.phases.iter().map(|(k, v)| format!("{k} {} ms", v / 1000)).collect();
            write!(f, " (launch {} ms: {})", l.micros / 1000, phases.join(", "))?;
        }
        write!(f, ", registry {g} ms")
    }
}

fn workspace_names(req: &CreateSandbox) -> Vec<String> {
    req.workspaces.iter().filter(|w| !w.read_only).map(|w| w.name.clone()).collect()
}

fn rebind_error(op: &str, id: &str, e: &dyn std::fmt::Display) -> EngineError {
    EngineError::Internal(format!("rebind registry: {op} {id}: {e}"))
}

impl ClusterPlane {
    /// Keeps a rebind sandbox's create request in the cluster, this node
    /// its runner (right after its create, before the answer).
    pub(super) async fn record_rebind(&self, id: &str, req: &CreateSandbox) -> Result<(), EngineError> {
        let req = CreateSandbox { image_auth: None, id: None, ..req.clone() };
        let names = workspace_names(&req);
        let entry = RebindEntry { node: self.name().to_string(), pending: false, req };
        let value = serde_json::to_vec(&entry).map_err(|e| rebind_error("encode", id, &e))?;
        self.rebind.put(id, value.into()).await.map_err(|e| rebind_error("write", id, &e))?;
        lock(&self.fence.mine).insert(id.to_string(), names);
        Ok(())
    }

    /// After a remove here: drops the entry if it is still this node's.
    pub(super) async fn forget_rebind(&self, id: &str) {
        lock(&self.fence.mine).remove(id);
        if let Ok(Some(e)) = self.rebind.entry(id).await {
            let ours = serde_json::from_slice::<RebindEntry>(&e.value).is_ok_and(|r| r.node == self.name());
            if e.operation == kv::Operation::Put && ours {
                if let Err(err) = self.rebind.delete_expect_revision(id, Some(e.revision)).await {
                    tracing::warn!(sandbox = %id, error = %err, "rebind registry: delete");
                }
            }
        }
    }

    /// The bucket's entries as this node's watch of it has them (a copy:
    /// every write below is a compare-and-set on the revision read here).
    pub(super) fn rebind_entries(&self) -> Result<Vec<(String, RebindEntry, u64)>, String> {
        let entries = self.rebind_seen.entries().ok_or("its watch has not caught up yet")?;
        Ok(entries
            .into_iter()
            .filter_map(|(key, v, rev)| serde_json::from_slice::<RebindEntry>(&v).ok().map(|r| (key, r, rev)))
            .collect())
    }

    /// One pass over the rebind bucket (each heartbeat, before the
    /// reconcile): thaw what this node froze and still runs, remove its
    /// copies rebound elsewhere, finish its pending rebinds, claim those of
    /// dead nodes. A node that cannot renew does nothing here.
    pub(super) async fn rebind_sweep(self: &Arc<Self>) {
        if self.api_only() || !self.fence.renewed() {
            return;
        }
        let entries = match self.rebind_entries() {
            Ok(e) => e,
            Err(e) => return tracing::warn!(error = %e, "rebind registry: read"),
        };
        self.fence.forget_done_seen(&entries.iter().map(|(id, _, rev)| (id.as_str(), *rev)).collect());
        let pending_here: HashSet<&str> = entries
            .iter()
            .filter(|(_, e, _)| e.pending && e.node == self.name())
            .map(|(id, _, _)| id.as_str())
            .collect();
        self.fence.forget_unfinished(|id| pending_here.contains(id));
        let Ok(list) = self.local().list(&ListFilter::default()).await else { return };
        let here: HashSet<String> = list.iter().map(|r| r.id.to_string()).collect();
        // Nodes silent in the registry holding sandboxes to rebind: asked
        // first (`liveness.rs`).
        let silent = entries.iter().filter(|(id, e, _)| e.node != self.name() && !here.contains(id));
        let silent = silent.filter(|(_, e, _)| self.live_node(&e.node, "").is_err()).map(|(_, e, _)| e.node.clone());
        let dead = self.confirmed_dead(silent.collect()).await;
        // Their orphans, each to one survivor first (`takeover.rs`).
        let mut orphans = Vec::new();
        let mut mine = HashMap::new();
        for (id, e, rev) in entries {
            if e.node == self.name() {
                mine.insert(id.clone(), workspace_names(&e.req));
                // Resumed first, then no longer counted frozen: while it is
                // still paused it answers 503, never the 409 of a paused
                // sandbox (77 user-visible errors of the 300-session drill).
                if self.fence.is_frozen(&id) {
                    self.thaw(&id).await;
                }
                // Pending with a copy here: its create was done and a later
                // step failed (a registry write in an election); the steps
                // resume after the create. Left as it was, the entry stayed
                // pending for good and every call answered 503.
                let lagging = self.fence.done_since(&id, rev);
                if e.pending && !lagging && self.fence.may_retry(&id) {
                    self.clone().spawn_rebind(id, e.req);
                }
            } else if here.contains(&id) {
                self.evict(&id).await;
            } else if dead.contains(&e.node) {
                orphans.push((id, e, rev));
            }
        }
        self.claim(orphans, &mut mine).await;
        *lock(&self.fence.mine) = mine;
    }

    /// Claims what this node's free rebind slots can start now of dead
    /// nodes' `orphans` (`takeover.rs`), and starts their rebinds.
    async fn claim(
        self: &Arc<Self>,
        orphans: Vec<(String, RebindEntry, u64)>,
        mine: &mut HashMap<String, Vec<String>>,
    ) {
        let runners: Vec<String> = self.nodes.live().into_iter().filter(|n| !n.api_only).map(|n| n.name).collect();
        let ids: Vec<String> = orphans.iter().map(|(id, _, _)| id.clone()).collect();
        let free = self.fence.rebinds.1.saturating_sub(lock(&self.fence.inflight).len());
        let ready: HashSet<String> = match free {
            0 => HashSet::new(),
            _ => self.local().standbys().await.into_iter().collect(),
        };
        let now = lock(&self.fence.orphans).plan(&ids, self.name(), &runners, &ready, Instant::now(), free);
        lock(&self.fence.orphans).keep_only(&ids.iter().cloned().collect());
        for (id, e, rev) in orphans.into_iter().filter(|(id, _, _)| now.contains(id)) {
            let dead = e.node;
            let claimed = RebindEntry { node: self.name().to_string(), pending: true, req: e.req };
            let Ok(value) = serde_json::to_vec(&claimed) else { continue };
            // Of the survivors, the first write at this revision wins.
            if self.rebind.update(&id, value.into(), rev).await.is_ok() {
                tracing::info!(sandbox = %id, %dead, "rebinding a dead node's sandbox here");
                mine.insert(id.clone(), workspace_names(&claimed.req));
                self.clone().spawn_rebind(id, claimed.req);
            }
        }
    }

    /// Thaws a rebind sandbox this node froze. It stays counted frozen (its
    /// calls answered 503) until the resume succeeds or it is found not
    /// paused: a failed resume is retried by the next sweep, never forgotten
    /// with the sandbox left paused (2 sessions of a 300-session drill).
    ///
    /// The sweep read the watch's copy of the bucket; when the bucket itself
    /// names another node, the copy lagged and the sandbox was rebound
    /// elsewhere meanwhile: this copy is evicted. Left frozen, it was
    /// neither thawed nor evicted for good (the copy kept naming this node),
    /// and a call under way into it never ended: 28 such copies on one node
    /// of the 300-session drill, the drill itself waiting on them.
    async fn thaw(&self, id: &str) {
        let _op = self.fence.ops.lock().await;
        if !self.fence.is_frozen(id) {
            return;
        }
        match self.bucket_names(id).await {
            Some(true) => {}
            Some(false) => {
                tracing::warn!(sandbox = %id, "the rebind bucket's copy here lagged: the sandbox is another node's");
                return self.evict(id).await;
            }
            None => return,
        }
        let thawed = match self.local().resume(id).await {
            Ok(()) => true,
            Err(EngineError::NotFound(_)) => true,
            Err(err) => {
                tracing::warn!(sandbox = %id, error = %err, "thawing a rebind sandbox after the node renewed");
                self.local().get(id).await.is_ok_and(|r| r.state != ember_types::SandboxState::Paused)
            }
        };
        if thawed {
            lock(&self.fence.frozen).remove(id);
            // Beside the freeze's warning, so a drill's logs show how long each freeze lasted.
            tracing::info!(sandbox = %id, "renewed: rebind sandbox thawed");
        }
    }

    /// Removes this node's copy of a sandbox rebound elsewhere (this node
    /// was cut off or down meanwhile). Its workspaces' copies stay: their
    /// checkpoints are fenced (`workspaces.rs`).
    async fn evict(&self, id: &str) {
        // The sweep reads the watch's copy of the bucket, which can lag this
        // node's own write: a node that had just re-created a sandbox here
        // saw the dead node's entry still, and removed its new copy (the
        // session was then gone: a 404 for good). The bucket itself decides
        // (during a re-creation here it names this node).
        if self.bucket_names(id).await != Some(false) {
            return;
        }
        lock(&self.fence.frozen).remove(id);
        tracing::warn!(sandbox = %id, "rebound on another node: removing this node's copy");
        if let Err(e) = self.local().remove(id).await {
            tracing::warn!(sandbox = %id, error = %e, "removing a rebound sandbox's stale copy");
        }
    }

    /// Whether the rebind bucket itself (not the watch's copy) names this
    /// node for sandbox `id`: `None` if it cannot be read now or has no entry.
    async fn bucket_names(&self, id: &str) -> Option<bool> {
        match self.rebind.entry(id).await {
            Ok(Some(e)) if e.operation == kv::Operation::Put => {
                serde_json::from_slice::<RebindEntry>(&e.value).ok().map(|r| r.node == self.name())
            }
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "rebind registry: read");
                None
            }
        }
    }

    fn spawn_rebind(self: Arc<Self>, id: String, req: CreateSandbox) {
        if !self.fence.rebind_starts(&id) {
            return;
        }
        tokio::spawn(async move {
            let t0 = Instant::now();
            let slot = self.fence.rebinds.0.acquire().await;
            let queued = t0.elapsed();
            self.fence.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let done = self.rebind_here(&id, req).await;
            self.fence.rebind_done(&id, done.is_ok());
            match done {
                Ok(steps) => tracing::info!(sandbox = %id, took = ?t0.elapsed(), ?queued, %steps, "rebound here"),
                Err(e) => tracing::warn!(sandbox = %id, error = %e, "rebind failed; the next heartbeat retries"),
            }
            drop(slot);
            self.fence.rebind_ends(&id);
            self.fence.ended.send_modify(|n| *n += 1);
            // A slot is free: the next sweep now, not at the next beat.
            self.fence.freed.notify_one();
        });
    }

    /// Re-creates sandbox `id` here: each workspace taken over at the next
    /// epoch and restored from its last checkpoint, the sandbox created under
    /// its id, the sandbox registry pointed here, the entry no longer pending.
    async fn rebind_here(&self, id: &str, req: CreateSandbox) -> Result<Steps, EngineError> {
        let names: Vec<String> = req.workspaces.iter().map(|w| w.name.clone()).collect();
        self.fence.restore_starts(id, &names);
        let done = self.rebind_steps(id, req).await;
        self.fence.restore_ends(id, &names, done.is_ok());
        done
    }

    /// [`Self::rebind_here`]'s steps.
    async fn rebind_steps(&self, id: &str, mut req: CreateSandbox) -> Result<Steps, EngineError> {
        let mut steps = Steps::default();
        let rec = match self.local().get(id).await {
            Ok(rec) => rec,
            Err(EngineError::NotFound(_)) => self.recreate(id, &mut req, &mut steps).await?,
            Err(e) => return Err(e),
        };
        let t = Instant::now();
        self.publish(id, rec.state.to_string()).await?;
        let done =
            RebindEntry { node: self.name().to_string(), pending: false, req: CreateSandbox { id: None, ..req } };
        let value = serde_json::to_vec(&done).map_err(|e| rebind_error("encode", id, &e))?;
        let rev = self.rebind.put(id, value.into()).await.map_err(|e| rebind_error("write", id, &e))?;
        lock(&self.fence.done).insert(id.to_string(), rev);
        steps.registry = t.elapsed();
        Ok(steps)
    }

    /// The workspaces taken over and restored, the sandbox created under `id`.
    async fn recreate(
        &self,
        id: &str,
        req: &mut CreateSandbox,
        steps: &mut Steps,
    ) -> Result<SandboxRecord, EngineError> {
        for w in &req.workspaces {
            let t = Instant::now();
            let entry = self.take_workspace(&w.name, w.create_size.unwrap_or(1 << 30)).await?;
            steps.take += t.elapsed();
            let t = Instant::now();
            if self.local().workspace(&w.name).await.is_ok() {
                // A stale copy of an earlier stay on this node.
                self.local().remove_workspace(&w.name).await?;
            }
            match &entry.checkpoint {
                Some(snap) => {
                    self.local().restore_workspace_op(snap, &w.name, Some(entry.size_bytes), None).await?;
                }
                None => {
                    self.local().create_workspace(w.name.clone(), entry.size_bytes).await?;
                }
            }
            steps.restore += t.elapsed();
        }
        req.id = Some(ember_types::SandboxId::try_from(id.to_string()).map_err(|_| rebind_error("id", id, &"bad"))?);
        let t = Instant::now();
        let warm = self.local().standbys().await.iter().any(|s| s == id);
        let _cold = (!warm).then(|| self.fence.cold_starts());
        let rec = self.local().create(req.clone()).await;
        steps.create = t.elapsed();
        steps.launch = rec.as_ref().ok().and_then(|r| r.launch.clone());
        rec
    }

    /// The main runtime's pulse, for the process's life: a task that only
    /// ticks, so the heartbeat (on a thread of its own) tells a runtime
    /// that schedules nothing from a busy one. The fence's loop below used
    /// to tick it, and that loop pauses sandboxes one at a time: on the
    /// partition drill one pause took 21 s at a load of 19, the beat was
    /// withheld as if the runtime were stuck, and a live node was taken
    /// for dead, its 39 sessions rebound.
    pub(super) async fn pulse(self: Arc<Self>) {
        let mut tick = tokio::time::interval(FENCE_TICK);
        loop {
            tick.tick().await;
            *lock(&self.fence.pulse) = Some(Instant::now());
        }
    }

    /// The fence: every [`FENCE_TICK`], if this node has not renewed within
    /// [`FREEZE_AFTER`], freeze its rebind sandboxes (as a pause does). A
    /// sandbox its user paused is left as it is (and not thawed after).
    pub(super) async fn fence_watch(self: Arc<Self>) {
        let mut tick = tokio::time::interval(FENCE_TICK);
        loop {
            tick.tick().await;
            if self.fence.renewed() {
                continue;
            }
            let todo: Vec<String> = {
                let frozen = lock(&self.fence.frozen);
                lock(&self.fence.mine).keys().filter(|id| !frozen.contains(*id)).cloned().collect()
            };
            for id in todo {
                // Renewed meanwhile (a pass over many sandboxes on a loaded
                // node takes seconds): the rest stays running.
                if self.fence.renewed() {
                    break;
                }
                let _op = self.fence.ops.lock().await;
                // Counted frozen before the pause starts (calls get a 503,
                // not the 409 of a paused sandbox, from the first moment).
                lock(&self.fence.frozen).insert(id.clone());
                match self.local().pause(&id).await {
                    Ok(()) => {
                        let renewed = self.fence.renewed_ago();
                        tracing::warn!(sandbox = %id, ?renewed, "cannot renew: rebind sandbox frozen");
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %id, error = %e, "cannot renew: freezing a rebind sandbox");
                        lock(&self.fence.frozen).remove(&id);
                        lock(&self.fence.mine).remove(&id);
                    }
                }
            }
        }
    }
}
