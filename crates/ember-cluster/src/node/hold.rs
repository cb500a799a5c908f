//! A call for a rebind sandbox that is moving waits for it.
//!
//! While a rebind sandbox's node is dead and its copy not re-created yet, a
//! call naming it answered 503 at once and the client retried (100 ms
//! doubling to 1 s): the sandbox was back on average half a backoff before
//! the client looked again. On the 300-session drill the first success came
//! p50 1.0 s, p90 1.8 s and at most 2.5 s after the survivor's "rebound
//! here" (docs/chaos.md, drill AA), a third of the MTTR. The node that
//! receives such a call now holds it, before it is routed anywhere (nothing
//! has run yet, so nothing runs twice), until the sandbox's rebind entry
//! changes (claimed, then re-created: this node's copy of the bucket, one
//! watch) or a rebind here ends, and then routes it; after
//! `--rebind-hold` (default [`REBIND_HOLD`]) it answers the 503 it had.
//! A sandbox that does not rebind is not held: its node's death is a 503 at
//! once, as before.
//!
//! A checkpoint of a rebind sandbox's workspace waits so too: its holder
//! dead, or its copy being restored (here or on the node it is routed to),
//! it is tried again every [`CHECKPOINT_LOOK`] (the workspace registry has
//! no copy on each node to watch). Tried again even after a forward that
//! failed: a checkpoint taken twice is two checkpoints of one copy, which
//! is what a client's retry of its 503 does.
use super::owner::Owner;
use super::plane::ClusterPlane;
use super::rebind::RebindEntry;
use bytes::Bytes;
use ember_engine::{EngineError, WorkspaceCheckpoint};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How long a call waits for a rebind sandbox by default: MTTD (~2 s) and
/// a survivor's queue of rebinds (~7 s on the 300-session drill on two
/// cores), well inside a client's request timeout (the OpenSandbox SDKs':
/// 30 s).
pub const REBIND_HOLD: Duration = Duration::from_secs(10);

/// A held call looks again this often even if nothing it waits on changed
/// (its node renewed and lives, or the copy of the bucket missed a change).
const LOOK_AGAIN: Duration = Duration::from_secs(1);
/// How often a held checkpoint is tried again.
const CHECKPOINT_LOOK: Duration = Duration::from_millis(250);

impl ClusterPlane {
    /// Which node holds sandbox `id`, waiting out a rebind under way (see
    /// the module docs).
    pub(super) async fn owner(&self, id: &str) -> Result<Owner, EngineError> {
        // Every routed call asks: the watches are subscribed only once the
        // owner is unavailable (the loop asks again after subscribing, so a
        // change in between is not missed).
        match self.owner_now(id).await {
            Err(EngineError::NodeUnavailable { .. }) => {}
            other => return other,
        }
        let until = Instant::now() + self.cfg.rebind_hold;
        let mut entries = self.rebind_seen.changes();
        let mut ended = self.fence.ended();
        loop {
            // Marked seen before the state is read: a change from here on
            // wakes the wait below.
            entries.mark_unchanged();
            ended.mark_unchanged();
            let before = self.rebind_state(id);
            let err = match self.owner_now(id).await {
                Err(e @ EngineError::NodeUnavailable { .. }) => e,
                other => return other,
            };
            let rebinds = before.0.is_some() || before.1;
            let now = Instant::now();
            if !rebinds || now >= until {
                return Err(err);
            }
            let changed = changed(&mut entries, &mut ended, || self.rebind_state(id) != before);
            let _ = tokio::time::timeout_at(until.min(now + LOOK_AGAIN), changed).await;
        }
    }

    /// The checkpoint of workspace `name`, waiting out a rebind of the
    /// sandbox that mounts it (see the module docs).
    pub(super) async fn checkpoint_held(&self, name: &str) -> Result<WorkspaceCheckpoint, EngineError> {
        let until = Instant::now() + self.cfg.rebind_hold;
        let mut moves = None;
        loop {
            let err = match self.routed_checkpoint(name).await {
                Err(e @ EngineError::NodeUnavailable { .. }) => e,
                other => return other,
            };
            let moves = *moves.get_or_insert_with(|| self.fence.is_restoring(name) || self.rebind_mounts(name));
            if !moves || Instant::now() + CHECKPOINT_LOOK >= until {
                return Err(err);
            }
            tokio::time::sleep(CHECKPOINT_LOOK).await;
        }
    }

    /// Whether a rebind sandbox mounts workspace `name` (this node's copy
    /// of the rebind bucket, read once per held checkpoint).
    fn rebind_mounts(&self, name: &str) -> bool {
        let entries = self.rebind_seen.entries().unwrap_or_default();
        entries.iter().any(|(_, v, _)| {
            serde_json::from_slice::<RebindEntry>(v).is_ok_and(|e| e.req.workspaces.iter().any(|w| w.name == name))
        })
    }

    /// Sandbox `id`'s rebind entry as this node's copy has it, and whether
    /// it is being re-created here.
    fn rebind_state(&self, id: &str) -> (Option<Bytes>, bool) {
        (self.rebind_seen.get(id), self.fence.is_rebinding(id))
    }
}

/// Returns once `done` holds, looking again at each change told by `a` or
/// `b`; a channel whose sender is gone tells nothing more.
async fn changed(a: &mut watch::Receiver<u64>, b: &mut watch::Receiver<u64>, done: impl Fn() -> bool) {
    let (mut a_open, mut b_open) = (true, true);
    while !done() {
        tokio::select! {
            r = a.changed(), if a_open => a_open = r.is_ok(),
            r = b.changed(), if b_open => b_open = r.is_ok(),
            else => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_held_call_wakes_when_its_own_state_changes_not_at_every_change() {
        let (tx_a, mut a) = watch::channel(0u64);
        let (tx_b, mut b) = watch::channel(0u64);
        let state = Arc::new(AtomicU64::new(0));
        let looks = Arc::new(AtomicU64::new(0));
        let (s, l) = (state.clone(), looks.clone());
        let wait = tokio::spawn(async move {
            changed(&mut a, &mut b, || {
                l.fetch_add(1, Ordering::SeqCst);
                s.load(Ordering::SeqCst) == 2
            })
            .await
        });
        // Other keys change: it looks, and keeps waiting.
        for _ in 0..3 {
            tx_a.send_modify(|n| *n += 1);
            tokio::task::yield_now().await;
        }
        state.store(1, Ordering::SeqCst);
        tx_b.send_modify(|n| *n += 1);
        tokio::task::yield_now().await;
        assert!(!wait.is_finished(), "woken by changes that are not the one awaited");
        state.store(2, Ordering::SeqCst);
        tx_a.send_modify(|n| *n += 1);
        tokio::time::timeout(Duration::from_secs(10), wait).await.expect("woken").expect("joined");
        assert!(looks.load(Ordering::SeqCst) >= 2, "looked at each change");
    }

    #[tokio::test]
    async fn a_wait_whose_senders_are_gone_ends_only_at_its_timeout() {
        let (tx_a, mut a) = watch::channel(0u64);
        let (tx_b, mut b) = watch::channel(0u64);
        drop((tx_a, tx_b));
        let waited = tokio::time::timeout(Duration::from_millis(50), changed(&mut a, &mut b, || false)).await;
        assert!(waited.is_err(), "a closed channel is no change");
    }
}
