//! This node's side of the fencing and of its rebinds (`rebind.rs`): when
//! its last heartbeat got through, which rebind sandboxes it holds, froze,
//! is re-creating or restoring, its rebind slots, and the hook that lowers
//! its sandboxes' CPU weight while rebinds are in flight (`recovery.rs`).
use super::rebind::FREEZE_AFTER;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// This node's side of the fencing.
#[derive(Default)]
pub(super) struct Fence {
    /// When the last heartbeat that got through was sent.
    pub(super) renewed: Mutex<Option<Instant>>,
    /// The main runtime's last tick (the heartbeat, on a thread of its own,
    /// stops once it is stale: `beat.rs`).
    pub(super) pulse: Mutex<Option<Instant>>,
    /// Rebind sandboxes the bucket says are this node's, with their
    /// workspaces.
    pub(super) mine: Mutex<HashMap<String, Vec<String>>>,
    /// Those this node froze because it could not renew.
    pub(super) frozen: Mutex<HashSet<String>>,
    /// Re-creations under way here.
    pub(super) inflight: Mutex<HashSet<String>>,
    /// Workspaces taken over here and not restored yet.
    pub(super) restoring: Mutex<HashSet<String>>,
    /// The workspaces of each rebind that failed here, counted restoring
    /// until it is tried again or is no longer this node's to finish.
    pub(super) unfinished: Mutex<HashMap<String, Vec<String>>>,
    /// Held across one freeze (counted frozen, then paused) or one thaw
    /// (resumed, then no longer counted): a thaw never runs between the two
    /// steps of a freeze, where its resume would find the sandbox still
    /// running and the pause that follows would leave it paused for good.
    pub(super) ops: tokio::sync::Mutex<()>,
    /// Rebinds under way here at once (default [`REBINDS_AT_ONCE`]).
    pub(super) rebinds: RebindSlots,
    /// Dead nodes' sandboxes not claimed yet, as this node saw them.
    pub(super) orphans: Mutex<super::takeover::Orphans>,
    /// A rebind ended here: its slot is free for the next orphan.
    pub(super) freed: tokio::sync::Notify,
    /// Counts the rebinds ended here: a call held for one wakes (`hold.rs`).
    pub(super) ended: tokio::sync::watch::Sender<u64>,
    /// The revision of each rebind entry this node marked done, until its
    /// watch shows it: an older, pending revision there is the watch
    /// lagging, not a rebind to resume.
    pub(super) done: Mutex<HashMap<String, u64>>,
    /// Rebinds run here (`ember_cluster_rebinds_total`).
    pub(super) runs: std::sync::atomic::AtomicU64,
    /// Told when the first rebind in flight here starts and the last ends.
    pub(super) recovery: Option<super::RecoveryWeight>,
    /// Rebinds here starting their sandbox cold (no standby): meanwhile the
    /// sandboxes weigh as usual.
    pub(super) cold: Mutex<usize>,
    /// When each rebind that failed here last failed: tried again a
    /// heartbeat later, not at once.
    pub(super) failed: Mutex<HashMap<String, Instant>>,
}

/// A rebind's cold start under way ([`Fence::cold_starts`]).
pub(super) struct ColdStart<'a>(&'a Fence);

impl Drop for ColdStart<'_> {
    fn drop(&mut self) {
        self.0.cold_change(false);
    }
}

/// How many rebinds one node runs at once by default, and so claims
/// (`takeover.rs`; `ember serve --rebinds-at-once`).
/// A node that took over a dead node's 30 sessions restored all 30 at once:
/// 24 s each on the 300-session drill, and its own heartbeats starved for
/// 13 s behind them, so the others took it for dead too and the failure
/// spread. In turn, the first sessions are back in the time of one restore.
/// Two while a restore made an image and a filesystem (drill D: six at
/// once, 13 s each); four since a rebind takes ~0.5-1.3 s: on the
/// 300-session drill four at once brought the last session back in
/// 8.4 s where two took 11.2 s (a saturated host), 4.7 s where two took
/// 4.9 s (a host with room; docs/chaos.md, drills U-Y).
pub const REBINDS_AT_ONCE: usize = 4;

/// The rebind slots: the semaphore a rebind holds while it runs, and its size.
pub(super) struct RebindSlots(pub(super) tokio::sync::Semaphore, pub(super) usize);

impl Default for RebindSlots {
    fn default() -> Self {
        RebindSlots::new(REBINDS_AT_ONCE)
    }
}

impl RebindSlots {
    fn new(n: usize) -> Self {
        let n = n.max(1);
        RebindSlots(tokio::sync::Semaphore::new(n), n)
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Fence {
    /// A node's fence that runs up to `rebinds` rebinds at once.
    pub(super) fn new(rebinds: usize, recovery: Option<super::RecoveryWeight>) -> Fence {
        Fence { rebinds: RebindSlots::new(rebinds), recovery, ..Fence::default() }
    }

    /// Counts `id`'s rebind in flight here (`false`: it already was). The
    /// first lowers the sandboxes' weight; told under the lock, so a start
    /// and an end never reach it out of order.
    pub(super) fn rebind_starts(&self, id: &str) -> bool {
        let mut inflight = lock(&self.inflight);
        if !inflight.insert(id.to_string()) {
            return false;
        }
        if let (1, 0, Some(r)) = (inflight.len(), *lock(&self.cold), &self.recovery) {
            r.set(true);
        }
        true
    }

    /// `id`'s rebind ended here; the last one sets the weight back.
    pub(super) fn rebind_ends(&self, id: &str) {
        let mut inflight = lock(&self.inflight);
        if let (true, true, 0, Some(r)) = (inflight.remove(id), inflight.is_empty(), *lock(&self.cold), &self.recovery)
        {
            r.set(false);
        }
    }

    /// A rebind here starts its sandbox cold (no standby of it here): until
    /// the returned guard is dropped the node's sandboxes weigh as usual.
    /// Lowered, the group of a node recovering alone (the other survivors'
    /// rebinds warm and done, their groups back to the usual weight) had an
    /// eighth of its neighbours' weight, and a launch's agent there was not
    /// up after 13 s (the 300-session drill, docs/chaos.md FF).
    pub(super) fn cold_starts(&self) -> ColdStart<'_> {
        self.cold_change(true);
        ColdStart(self)
    }

    /// One cold start more or less; the hook told when the weight changes.
    fn cold_change(&self, more: bool) {
        let inflight = lock(&self.inflight);
        let mut cold = lock(&self.cold);
        let lowered = |cold: usize| !inflight.is_empty() && cold == 0;
        let was = lowered(*cold);
        *cold = if more { *cold + 1 } else { cold.saturating_sub(1) };
        if let (true, Some(r)) = (was != lowered(*cold), &self.recovery) {
            r.set(lowered(*cold));
        }
    }

    /// `id`'s rebind here failed (`ok`: it succeeded).
    pub(super) fn rebind_done(&self, id: &str, ok: bool) {
        let mut failed = lock(&self.failed);
        match ok {
            true => _ = failed.remove(id),
            false => _ = failed.insert(id.to_string(), Instant::now()),
        }
    }

    /// Whether `id`'s rebind may start again: not within a heartbeat of its
    /// last failure. A rebind that failed at once (its registry write
    /// refused through an election) was started again as its slot freed,
    /// 118 times in 9 s on the 300-session drill (FF).
    pub(super) fn may_retry(&self, id: &str) -> bool {
        lock(&self.failed).get(id).is_none_or(|at| at.elapsed() >= super::HEARTBEAT)
    }

    /// A heartbeat sent at `sent` got through.
    pub(super) fn renewed_at(&self, sent: Instant) {
        *lock(&self.renewed) = Some(sent);
    }

    /// Whether this node's last beat that got through is recent enough to act
    /// as a live node (claim, publish, keep its rebind sandboxes thawed).
    pub(super) fn renewed(&self) -> bool {
        lock(&self.renewed).is_some_and(|t| t.elapsed() < FREEZE_AFTER)
    }

    /// How long ago the main runtime last ticked (`None`: not yet).
    pub(super) fn pulse_age(&self) -> Option<Duration> {
        lock(&self.pulse).map(|t| t.elapsed())
    }

    /// How long ago this node's last beat that got through was sent.
    pub(super) fn renewed_ago(&self) -> Option<Duration> {
        lock(&self.renewed).map(|t| t.elapsed())
    }

    /// This node froze sandbox `id` because it could not renew.
    pub(super) fn is_frozen(&self, id: &str) -> bool {
        lock(&self.frozen).contains(id)
    }

    /// Sandbox `id` is being re-created here (or waits its turn to be).
    pub(super) fn is_rebinding(&self, id: &str) -> bool {
        lock(&self.inflight).contains(id)
    }

    /// Told of every rebind that ends here (a count).
    pub(super) fn ended(&self) -> tokio::sync::watch::Receiver<u64> {
        self.ended.subscribe()
    }

    /// How many rebinds this node has run.
    pub(super) fn rebinds_run(&self) -> u64 {
        self.runs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether this node marked `id`'s rebind done at a revision after
    /// `rev` (the watch that read `rev` lags); forgets it once it does not.
    pub(super) fn done_since(&self, id: &str, rev: u64) -> bool {
        let mut done = lock(&self.done);
        match done.get(id) {
            Some(&at) if at > rev => true,
            Some(_) => {
                done.remove(id);
                false
            }
            None => false,
        }
    }

    /// Forgets the done marks the watch has caught up with: `seen` is the
    /// bucket as the watch has it (id → revision), and a mark whose entry is
    /// gone (the sandbox removed) or at its revision or later (rebound
    /// elsewhere since, or read back) has nothing left to tell a lagging
    /// read from. Without this every rebind a node ran left its mark for the
    /// node's lifetime.
    pub(super) fn forget_done_seen(&self, seen: &HashMap<&str, u64>) {
        lock(&self.done).retain(|id, at| seen.get(id.as_str()).is_some_and(|rev| rev < at));
    }

    /// The read-write workspaces of this node's rebind sandboxes.
    pub(super) fn workspaces_held(&self) -> HashSet<String> {
        lock(&self.mine).values().flatten().cloned().collect()
    }

    /// `id`'s rebind attempt starts restoring `names`.
    pub(super) fn restore_starts(&self, id: &str, names: &[String]) {
        lock(&self.unfinished).remove(id);
        lock(&self.restoring).extend(names.iter().cloned());
    }

    /// `id`'s attempt ended: restored (`ok`), its workspaces are no longer
    /// restoring; failed, they stay so until the retry, or until the sweep
    /// finds the rebind no longer this node's ([`Self::forget_unfinished`]).
    /// Between a failed attempt and its retry this node held a stale copy
    /// while the registry still named it holder at the old epoch: a
    /// checkpoint of that copy, then fenced by the retry's take, answered
    /// the drill's session a 409 (FF).
    pub(super) fn restore_ends(&self, id: &str, names: &[String], ok: bool) {
        if !ok {
            lock(&self.unfinished).insert(id.to_string(), names.to_vec());
            return;
        }
        let mut restoring = lock(&self.restoring);
        names.iter().for_each(|n| _ = restoring.remove(n));
    }

    /// The failed rebinds that `pending_here` says are no longer this
    /// node's to finish (taken elsewhere, done, removed): their workspaces
    /// no longer count as restoring, and their failures are forgotten.
    pub(super) fn forget_unfinished(&self, pending_here: impl Fn(&str) -> bool) {
        lock(&self.failed).retain(|id, _| pending_here(id));
        let mut unfinished = lock(&self.unfinished);
        let gone: Vec<String> = unfinished.keys().filter(|id| !pending_here(id)).cloned().collect();
        let mut restoring = lock(&self.restoring);
        for names in gone.iter().filter_map(|id| unfinished.remove(id)) {
            names.iter().for_each(|n| _ = restoring.remove(n));
        }
    }

    /// Workspace `name` is being restored here by a rebind.
    pub(super) fn is_restoring(&self, name: &str) -> bool {
        lock(&self.restoring).contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A fence of 4 slots whose hook records what it is told.
    fn hooked() -> (Fence, Arc<Mutex<Vec<bool>>>) {
        let told = Arc::new(Mutex::new(Vec::new()));
        let seen = told.clone();
        let hook = super::super::RecoveryWeight(Arc::new(move |on| lock(&seen).push(on)));
        (Fence::new(4, Some(hook)), told)
    }

    #[test]
    fn the_weight_is_lowered_for_the_first_rebind_in_flight_and_set_back_after_the_last() {
        let (fence, told) = hooked();
        assert!(fence.rebind_starts("a"));
        assert!(fence.rebind_starts("b"));
        assert!(!fence.rebind_starts("a"), "already in flight");
        fence.rebind_ends("a");
        assert_eq!(*lock(&told), [true], "b is still in flight");
        fence.rebind_ends("b");
        fence.rebind_ends("b");
        assert!(fence.rebind_starts("c"));
        fence.rebind_ends("c");
        assert_eq!(*lock(&told), [true, false, true, false]);
    }

    #[test]
    fn a_cold_start_sets_the_weight_back_while_it_lasts() {
        let (fence, told) = hooked();
        assert!(fence.rebind_starts("a") && fence.rebind_starts("b"));
        let cold = fence.cold_starts();
        let again = fence.cold_starts();
        assert_eq!(*lock(&told), [true, false], "set back at the first cold start");
        drop(cold);
        fence.rebind_ends("a");
        assert_eq!(*lock(&told), [true, false], "one cold start left");
        drop(again);
        assert_eq!(*lock(&told), [true, false, true], "lowered again: b is in flight");
        fence.rebind_ends("b");
        assert_eq!(*lock(&told), [true, false, true, false]);
        // A cold start that outlives the last rebind's end: not lowered again.
        assert!(fence.rebind_starts("c"));
        let cold = fence.cold_starts();
        fence.rebind_ends("c");
        drop(cold);
        assert_eq!(*lock(&told), [true, false, true, false, true, false]);
    }

    #[test]
    fn a_failed_rebind_waits_a_heartbeat_before_it_is_tried_again() {
        let fence = Fence::new(1, None);
        assert!(fence.may_retry("a"), "never failed");
        fence.rebind_done("a", false);
        assert!(!fence.may_retry("a"), "just failed");
        assert!(fence.may_retry("b"), "another");
        lock(&fence.failed).insert("a".into(), Instant::now() - super::super::HEARTBEAT);
        assert!(fence.may_retry("a"), "a heartbeat later");
        fence.rebind_done("a", false);
        fence.rebind_done("a", true);
        assert!(fence.may_retry("a") && lock(&fence.failed).is_empty(), "forgotten once it succeeded");
    }

    #[test]
    fn a_failed_attempts_workspaces_stay_restoring_until_its_retry_or_its_end_here() {
        let fence = Fence::new(1, None);
        let names = ["w".to_string()];
        fence.restore_starts("s", &names);
        fence.restore_ends("s", &names, false);
        assert!(fence.is_restoring("w"), "between a failed attempt and its retry");
        fence.forget_unfinished(|id| id == "s");
        assert!(fence.is_restoring("w"), "still pending here");
        fence.restore_starts("s", &names);
        fence.restore_ends("s", &names, true);
        assert!(!fence.is_restoring("w"), "restored");
        fence.restore_starts("s", &names);
        fence.restore_ends("s", &names, false);
        fence.forget_unfinished(|_| false);
        assert!(!fence.is_restoring("w"), "no longer this node's to finish");
    }

    #[test]
    fn a_done_mark_lasts_until_the_watch_catches_up_or_the_entry_goes() {
        let fence = Fence::new(1, None);
        for (id, rev) in [("lagging", 10), ("caught-up", 10), ("rebound-elsewhere", 10), ("removed", 10)] {
            lock(&fence.done).insert(id.to_string(), rev);
        }
        // The watch: "lagging" at its pending revision, "caught-up" at the
        // marked one, "rebound-elsewhere" later, "removed" gone.
        let seen = HashMap::from([("lagging", 9), ("caught-up", 10), ("rebound-elsewhere", 14)]);
        fence.forget_done_seen(&seen);
        let mut kept: Vec<String> = lock(&fence.done).keys().cloned().collect();
        kept.sort();
        assert_eq!(kept, ["lagging"]);
        // The mark still tells the lagging read from a rebind to resume.
        assert!(fence.done_since("lagging", 9));
    }
}
