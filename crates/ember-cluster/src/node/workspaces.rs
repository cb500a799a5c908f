//! Workspaces in the cluster: the bucket `<prefix>_workspaces`, name →
//! [`WorkspaceEntry`] (holder node, epoch, last checkpoint, size, created).
//!
//! A new name is claimed with a KV `create`: of two nodes creating one name
//! at once, exactly one wins. Every later write is a compare-and-set on the
//! entry's revision: a change of holder (a rebind, `epoch + 1`) and the
//! commit of a checkpoint, which first checks that this node still holds the
//! workspace at the epoch it read. So a node that lost the workspace (cut off
//! from NATS, then rebound elsewhere) can take a snapshot but never make it
//! the workspace's checkpoint: `WORKSPACE::FENCED`.
use super::plane::ClusterPlane;
use crate::retry::{again, retry, RETRY_BUDGET};
use async_nats::jetstream::kv;
use ember_engine::{CreateSandbox, EngineError, NodeCall, WorkspaceCheckpoint};
use ember_workspace::WorkspaceError;
use serde::{Deserialize, Serialize};

/// A workspace as the cluster knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceEntry {
    /// The node whose disk has the live copy.
    pub holder: String,
    /// Counts changes of holder, from 1; each is a compare-and-set on the KV
    /// revision, which is what fences.
    pub epoch: u64,
    /// The snapshot of its last committed checkpoint.
    pub checkpoint: Option<String>,
    /// When that checkpoint's call began, in its holder's run: a commit of an
    /// earlier call of the same run never replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_order: Option<CheckpointOrder>,
    pub size_bytes: u64,
    pub created_ms: i64,
}

/// Orders one node's checkpoints: its run (a random id drawn at start) and
/// the call's place in it. Two checkpoints of one workspace on one node (an
/// explicit one beside `--checkpoint-every`) can commit in either order;
/// the one whose call began later has every byte the earlier one has, so
/// the earlier one must not land over it. Calls of another run (a restart,
/// another holder) are not compared: the entry's holder and epoch fence them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointOrder {
    pub run: u64,
    pub seq: u64,
}

/// Hands out [`CheckpointOrder`]s for one node's run.
pub(super) struct CheckpointClock {
    run: u64,
    next: std::sync::atomic::AtomicU64,
}

impl CheckpointClock {
    pub(super) fn new() -> CheckpointClock {
        CheckpointClock { run: fastrand::u64(..), next: Default::default() }
    }

    /// The order of a checkpoint whose call begins now.
    pub(super) fn tick(&self) -> CheckpointOrder {
        CheckpointOrder { run: self.run, seq: self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) }
    }
}

fn kv_error(op: &str, name: &str, e: &dyn std::fmt::Display) -> EngineError {
    EngineError::Internal(format!("workspace registry: {op} {name}: {e}"))
}

fn fenced(name: &str, me: &str, epoch: u64, now: Option<&WorkspaceEntry>) -> EngineError {
    let detail = match now {
        Some(w) => format!("node {me} held it at epoch {epoch}; node {} holds it at epoch {}", w.holder, w.epoch),
        None => format!("node {me} held it at epoch {epoch}; it is no longer in the cluster's registry"),
    };
    EngineError::WorkspaceFenced { name: name.to_string(), detail }
}

fn not_found(name: &str) -> EngineError {
    EngineError::Workspace(WorkspaceError::NotFound(name.to_string()))
}

impl ClusterPlane {
    /// Workspace `name`'s entry and its revision (`None`: not registered).
    pub(super) async fn ws_entry(&self, name: &str) -> Result<Option<(WorkspaceEntry, u64)>, EngineError> {
        let entry = retry(RETRY_BUDGET, "read the workspace registry", name, || async {
            self.workspaces.entry(name).await.map_err(again)
        })
        .await
        .map_err(|e| kv_error("read", name, &e))?;
        Ok(entry
            .filter(|e| e.operation == kv::Operation::Put)
            .and_then(|e| serde_json::from_slice(&e.value).ok().map(|w| (w, e.revision))))
    }

    /// Claims the new name `name` for node `holder`: one winner cluster-wide;
    /// the others get `WORKSPACE::ALREADY_EXISTS`.
    pub(super) async fn claim_workspace(&self, name: &str, size_bytes: u64, holder: &str) -> Result<(), EngineError> {
        ember_workspace::check_name(name).map_err(EngineError::Workspace)?;
        let entry = WorkspaceEntry {
            holder: holder.to_string(),
            epoch: 1,
            checkpoint: None,
            checkpoint_order: None,
            size_bytes,
            created_ms: ember_engine::record::now_ms(),
        };
        let value = serde_json::to_vec(&entry).map_err(|e| kv_error("encode", name, &e))?;
        match self.workspaces.create(name, value.into()).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                Err(EngineError::Workspace(WorkspaceError::Exists(name.to_string())))
            }
            // The loser of two creates at once can get the stream's "wrong
            // last sequence" (10164) as an "other" error instead of
            // AlreadyExists (async-nats reads the key back after the refused
            // publish, and that read can fail as well): the name is taken if
            // the key now holds an entry (the race test's 500, 2 runs in 4).
            Err(e) => match self.workspaces.get(name).await {
                Ok(Some(_)) => Err(EngineError::Workspace(WorkspaceError::Exists(name.to_string()))),
                _ => Err(kv_error("claim", name, &e)),
            },
        }
    }

    /// Before a create here naming workspaces: those it will make (none
    /// exists here) are claimed for this node first. Returns the names
    /// claimed, to drop if the create fails.
    pub(super) async fn claim_new_workspaces(&self, req: &CreateSandbox) -> Result<Vec<String>, EngineError> {
        let mut claimed = Vec::new();
        for w in &req.workspaces {
            if self.local().workspace(&w.name).await.is_ok() {
                continue;
            }
            let size = w.create_size.unwrap_or(1 << 30);
            match self.claim_workspace(&w.name, size, self.name()).await {
                Ok(()) => claimed.push(w.name.clone()),
                Err(e) => {
                    for name in &claimed {
                        self.unclaim_workspace(name).await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(claimed)
    }

    /// Drops `name`'s entry (after its removal, or a create that failed after
    /// the claim); a registry that takes no write now keeps it (logged).
    pub(super) async fn unclaim_workspace(&self, name: &str) {
        if let Err(e) = self.workspaces.delete(name).await {
            tracing::warn!(workspace = %name, error = %e, "workspace registry: delete");
        }
    }

    /// Takes `name` over for this node at the next epoch (compare-and-set on
    /// the revision read): a rebind. Returns the entry as now held. A name
    /// never registered is claimed.
    pub(super) async fn take_workspace(&self, name: &str, size_bytes: u64) -> Result<WorkspaceEntry, EngineError> {
        let Some((mut w, rev)) = self.ws_entry(name).await? else {
            self.claim_workspace(name, size_bytes, self.name()).await?;
            return Ok(self.ws_entry(name).await?.ok_or_else(|| not_found(name))?.0);
        };
        w.holder = self.name().to_string();
        w.epoch += 1;
        let value = serde_json::to_vec(&w).map_err(|e| kv_error("encode", name, &e))?;
        self.workspaces.update(name, value.into(), rev).await.map_err(|e| kv_error("take over", name, &e))?;
        Ok(w)
    }

    /// A workspace a rebind is restoring here is neither checkpointed (a
    /// half-restored copy would become its checkpoint) nor missing (the drill
    /// saw 404s here): 503, a moment's wait.
    fn not_restoring(&self, name: &str) -> Result<(), EngineError> {
        match self.fence.is_restoring(name) {
            true => Err(EngineError::NodeUnavailable {
                node: self.name().to_string(),
                reason: format!("workspace {name} is being restored here from its last checkpoint"),
            }),
            false => Ok(()),
        }
    }

    /// `POST /v1/workspaces/{name}/checkpoint` on a cluster: where the
    /// workspace's copy is (this node first, as for sandboxes, else the
    /// holder the registry names), then committed as its checkpoint at the
    /// holder's epoch.
    pub(super) async fn routed_checkpoint(&self, name: &str) -> Result<WorkspaceCheckpoint, EngineError> {
        self.not_restoring(name)?;
        let here = !self.api_only() && self.local().workspace(name).await.is_ok();
        let entry = self.ws_entry(name).await?;
        let w = match entry {
            // Held here, or made before the registry knew it.
            Some((w, rev)) if here && w.holder == self.name() => {
                return self.checkpoint_here(name, Some((w, rev))).await
            }
            None if here => return self.checkpoint_here(name, None).await,
            None => return Err(not_found(name)),
            // The registry names this node, whose disk has no copy.
            Some((w, _)) if w.holder == self.name() => return Err(not_found(name)),
            // A copy here is stale (this node was taken for dead, the
            // workspace rebound): the holder's copy is the workspace (the
            // stale one answered `FENCED` to checkpoints meant for it).
            Some((w, _)) => w,
        };
        let n = self.live_node(&w.holder, &format!("workspace {name} is on it"))?;
        self.forward(&n, &NodeCall::CheckpointWorkspace { name: name.into() }).await
    }

    /// The snapshot of this node's copy, then its commit: a compare-and-set
    /// of the entry's `checkpoint` that holds only while this node is the
    /// holder at the epoch read before the snapshot. `known`: the entry and
    /// its revision as the caller read them for this call (routing it), so
    /// that a checkpoint reads its entry once, not three times.
    pub(super) async fn checkpoint_here(
        &self,
        name: &str,
        known: Option<(WorkspaceEntry, u64)>,
    ) -> Result<WorkspaceCheckpoint, EngineError> {
        self.not_restoring(name)?;
        // Before the snapshot: its freeze comes after this call began.
        let order = self.checkpoints.tick();
        let me = self.name().to_string();
        let read = match known {
            Some(k) => Some(k),
            None => self.ws_entry(name).await?,
        };
        let (epoch, read) = match read {
            Some((w, rev)) if w.holder == me => (w.epoch, Some((w, rev))),
            Some((w, _)) => return Err(fenced(name, &me, 0, Some(&w))),
            None => {
                // Made before the registry knew it (an older node): claim it.
                let size = self.local().workspace(name).await?.meta.size_bytes;
                self.claim_workspace(name, size, &me).await?;
                (1, None)
            }
        };
        let snap = self.local().checkpoint_workspace(name).await?;
        let at = Held { me: &me, epoch, order };
        commit(self, name, at, read, &snap.snapshot_id, RETRY_BUDGET).await?;
        Ok(WorkspaceCheckpoint { epoch, ..snap })
    }
}

/// What a compare-and-set of a workspace entry came to.
pub(super) enum Cas {
    Done,
    /// The revision moved (another write came first): read again.
    Moved,
    /// No answer (a stream electing a leader, a lost connection): it may
    /// or may not have taken.
    Transient(String),
}

/// The workspace registry as a checkpoint's commit uses it.
#[async_trait::async_trait]
pub(super) trait Entries: Sync {
    async fn read(&self, name: &str) -> Result<Option<(WorkspaceEntry, u64)>, EngineError>;
    async fn cas(&self, name: &str, w: &WorkspaceEntry, rev: u64) -> Cas;
}

#[async_trait::async_trait]
impl Entries for ClusterPlane {
    async fn read(&self, name: &str) -> Result<Option<(WorkspaceEntry, u64)>, EngineError> {
        self.ws_entry(name).await
    }

    async fn cas(&self, name: &str, w: &WorkspaceEntry, rev: u64) -> Cas {
        let value = match serde_json::to_vec(w) {
            Ok(v) => v,
            Err(e) => return Cas::Transient(e.to_string()),
        };
        match self.workspaces.update(name, value.into(), rev).await {
            Ok(_) => Cas::Done,
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Cas::Moved,
            Err(e) => Cas::Transient(e.to_string()),
        }
    }
}

/// Who commits a checkpoint: the holder `me` at `epoch`, for a call of
/// `order`.
#[derive(Clone, Copy)]
pub(super) struct Held<'a> {
    pub me: &'a str,
    pub epoch: u64,
    pub order: CheckpointOrder,
}

/// Makes `snapshot` workspace `name`'s checkpoint: a compare-and-set of its
/// entry that holds only while `at.me` is the holder at `at.epoch`, and
/// that never replaces a checkpoint of a later call of the same run (that
/// one stands, and has this one's bytes). `read`: the entry and revision
/// read before the snapshot, tried first (a set at that revision proves
/// nothing changed since; one that moved reads the entry again). A write with
/// no answer is tried again for up to `budget`, as the queue's are: during a
/// leader election of the bucket's stream the update timed out, and the
/// 300-session drill counted that checkpoint a user-visible error. A write
/// that took though its answer was lost is seen on the next read.
pub(super) async fn commit(
    reg: &dyn Entries,
    name: &str,
    at: Held<'_>,
    mut read: Option<(WorkspaceEntry, u64)>,
    snapshot: &str,
    budget: std::time::Duration,
) -> Result<(), EngineError> {
    let Held { me, epoch, order } = at;
    let start = tokio::time::Instant::now();
    let mut wait = std::time::Duration::from_millis(50);
    loop {
        let now = match read.take() {
            Some(r) => Some(r),
            None => reg.read(name).await?,
        };
        let (mut w, rev) = match now {
            Some((w, rev)) if w.holder == me && w.epoch == epoch => (w, rev),
            now => return Err(fenced(name, me, epoch, now.as_ref().map(|(w, _)| w))),
        };
        let later = w.checkpoint_order.filter(|o| o.run == order.run && o.seq > order.seq);
        if w.checkpoint.as_deref() == Some(snapshot) || later.is_some() {
            return Ok(());
        }
        w.checkpoint = Some(snapshot.to_string());
        w.checkpoint_order = Some(order);
        match reg.cas(name, &w, rev).await {
            Cas::Done => return Ok(()),
            // A concurrent checkpoint of this node moved the revision.
            Cas::Moved if start.elapsed() < budget => {}
            Cas::Moved => return Err(kv_error("commit the checkpoint of", name, &"the entry kept changing")),
            Cas::Transient(e) if start.elapsed() + wait > budget => {
                return Err(kv_error("commit the checkpoint of", name, &e))
            }
            Cas::Transient(e) => {
                tracing::warn!(workspace = %name, error = %e, "committing a checkpoint; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(1));
            }
        }
    }
}

impl ClusterPlane {
    /// `ember serve --checkpoint-every`: every `every`, a checkpoint of each
    /// read-write workspace of this node's rebind sandboxes (while it
    /// renews; a failure is logged and the next round tries again).
    pub(super) async fn checkpoint_loop(self: std::sync::Arc<Self>, every: std::time::Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            if !self.fence.renewed() {
                continue;
            }
            let names = self.fence.workspaces_held();
            for name in names {
                if let Err(e) = self.checkpoint_here(&name, None).await {
                    tracing::warn!(workspace = %name, error = %e, "periodic checkpoint");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// One entry; `cas` answers from `script` first (then does it).
    struct Fake {
        entry: Mutex<(WorkspaceEntry, u64)>,
        /// Per call: `Some(took)` = no answer, having taken (`true`) or not.
        script: Mutex<Vec<Option<bool>>>,
        reads: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Entries for Fake {
        async fn read(&self, _: &str) -> Result<Option<(WorkspaceEntry, u64)>, EngineError> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(Some(self.entry.lock().unwrap().clone()))
        }
        async fn cas(&self, _: &str, w: &WorkspaceEntry, rev: u64) -> Cas {
            let step = {
                let mut s = self.script.lock().unwrap();
                (!s.is_empty()).then(|| s.remove(0)).flatten()
            };
            let mut e = self.entry.lock().unwrap();
            if e.1 != rev {
                return Cas::Moved;
            }
            if step != Some(false) {
                *e = (w.clone(), rev + 1);
            }
            match step {
                Some(_) => Cas::Transient("timed out".into()),
                None => Cas::Done,
            }
        }
    }

    fn fake(holder: &str, epoch: u64, script: Vec<Option<bool>>) -> Fake {
        let w = WorkspaceEntry {
            holder: holder.into(),
            epoch,
            checkpoint: None,
            checkpoint_order: None,
            size_bytes: 1,
            created_ms: 0,
        };
        Fake { entry: Mutex::new((w, 7)), script: Mutex::new(script), reads: Default::default() }
    }

    const RUN: u64 = 9;

    fn at(me: &str, epoch: u64, seq: u64) -> Held<'_> {
        Held { me, epoch, order: CheckpointOrder { run: RUN, seq } }
    }

    fn checkpoint(f: &Fake) -> Option<String> {
        f.entry.lock().unwrap().0.checkpoint.clone()
    }

    #[tokio::test]
    async fn a_commit_without_an_answer_is_tried_again() {
        // Two timeouts that did not take, then the write.
        let f = fake("a", 3, vec![Some(false), Some(false)]);
        commit(&f, "w", at("a", 3, 1), None, "s1", Duration::from_secs(30)).await.expect("committed");
        assert_eq!(checkpoint(&f).as_deref(), Some("s1"));
    }

    #[tokio::test]
    async fn a_commit_that_took_without_an_answer_is_seen_taken() {
        let f = fake("a", 3, vec![Some(true)]);
        commit(&f, "w", at("a", 3, 1), None, "s1", Duration::from_secs(30)).await.expect("committed");
        assert_eq!(f.entry.lock().unwrap().1, 8, "written once");
    }

    #[tokio::test]
    async fn a_commit_that_never_answers_fails_after_its_budget() {
        let f = fake("a", 3, vec![Some(false); 100]);
        let e = commit(&f, "w", at("a", 3, 1), None, "s1", Duration::from_secs(2)).await.expect_err("no answer");
        assert!(e.to_string().contains("timed out"), "{e}");
    }

    #[tokio::test]
    async fn a_node_that_lost_the_workspace_cannot_commit() {
        let f = fake("b", 4, vec![]);
        let e = commit(&f, "w", at("a", 3, 1), None, "s1", Duration::from_secs(30)).await.expect_err("fenced");
        assert!(matches!(e, EngineError::WorkspaceFenced { .. }), "{e}");
        assert_eq!(checkpoint(&f), None);
    }

    #[tokio::test]
    async fn an_earlier_call_never_lands_over_a_later_one() {
        // Calls 1 and 2 of one run: 2's commit lands first, then 1's.
        let f = fake("a", 3, vec![]);
        commit(&f, "w", at("a", 3, 2), None, "later", Duration::from_secs(30)).await.expect("committed");
        commit(&f, "w", at("a", 3, 1), None, "earlier", Duration::from_secs(30))
            .await
            .expect("superseded, not an error");
        assert_eq!(checkpoint(&f).as_deref(), Some("later"));
        // In order, each replaces the one before.
        commit(&f, "w", at("a", 3, 3), None, "next", Duration::from_secs(30)).await.expect("committed");
        assert_eq!(checkpoint(&f).as_deref(), Some("next"));
        // Another run's (the node restarted) is not compared: it replaces.
        let other = Held { me: "a", epoch: 3, order: CheckpointOrder { run: RUN + 1, seq: 0 } };
        commit(&f, "w", other, None, "restarted", Duration::from_secs(30)).await.expect("committed");
        assert_eq!(checkpoint(&f).as_deref(), Some("restarted"));
    }

    fn reads(f: &Fake) -> usize {
        f.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    #[tokio::test]
    async fn the_entry_read_before_the_snapshot_is_not_read_again() {
        let f = fake("a", 3, vec![]);
        let before = f.entry.lock().unwrap().clone();
        commit(&f, "w", at("a", 3, 1), Some(before), "s1", Duration::from_secs(30)).await.expect("committed");
        assert_eq!((checkpoint(&f).as_deref(), reads(&f)), (Some("s1"), 0));
    }

    #[tokio::test]
    async fn an_entry_that_moved_since_it_was_read_is_read_again() {
        let f = fake("a", 3, vec![]);
        let before = f.entry.lock().unwrap().clone();
        // Another call's checkpoint lands while this one's snapshot runs.
        commit(&f, "w", at("a", 3, 2), None, "later", Duration::from_secs(30)).await.expect("committed");
        commit(&f, "w", at("a", 3, 1), Some(before), "earlier", Duration::from_secs(30)).await.expect("superseded");
        assert_eq!((checkpoint(&f).as_deref(), reads(&f)), (Some("later"), 2));
        // Taken over while the snapshot ran: the stale read cannot commit.
        let before = f.entry.lock().unwrap().clone();
        f.entry.lock().unwrap().0.holder = "b".into();
        f.entry.lock().unwrap().1 += 1;
        let e = commit(&f, "w", at("a", 3, 3), Some(before), "s3", Duration::from_secs(30)).await.expect_err("fenced");
        assert!(matches!(e, EngineError::WorkspaceFenced { .. }), "{e}");
    }
}
