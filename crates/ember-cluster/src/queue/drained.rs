//! Whether a tier may still hold work, as this process last saw it: the
//! hint behind [`TaskQueue::more_queued`](ember_queue::TaskQueue::more_queued).
//!
//! After each lease the engine hands its wake-up on to another idle worker,
//! whose lease asks every tier again. On a drained queue that was three
//! empty pull requests per task: ~4 pulls a task in the 300-session drill
//! (393 a second at 94 tasks a second, docs/chaos.md AX-BC). A fetched
//! message says how many more its consumer has pending; a fetch with
//! nothing says the tier is drained. So a lease that leaves every tier
//! seen drained, within [`JetStreamConfig::drained_for`](super::JetStreamConfig),
//! needs no hand-off: what arrives later is found as before, by the node's
//! one polling idle worker (every 250 ms), a submit here (which wakes a
//! worker and marks its tier), or a lapsed lease (the upkeep wakes one).
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) struct Drained {
    /// Per tier: when it was last seen drained, in ms since `base` plus
    /// one; 0 when it was not since its last submit here, or never.
    seen: [AtomicU64; 3],
    base: Instant,
    fresh_for: Duration,
}

impl Drained {
    pub fn new(fresh_for: Duration) -> Drained {
        Drained { seen: Default::default(), base: Instant::now(), fresh_for }
    }

    fn now(&self) -> u64 {
        self.base.elapsed().as_millis() as u64 + 1
    }

    /// What one fetch from tier `rank` showed: `true` when nothing is left
    /// there to deliver (no message, or the message's pending count 0).
    pub fn saw(&self, rank: usize, drained: bool) {
        self.seen[rank].store(if drained { self.now() } else { 0 }, Ordering::Relaxed);
    }

    /// A message was published to tier `rank` by this process.
    pub fn filled(&self, rank: usize) {
        self.seen[rank].store(0, Ordering::Relaxed);
    }

    /// Whether any tier may hold work: not seen drained, or seen so longer
    /// ago than the window.
    pub fn more(&self) -> bool {
        let (now, window) = (self.now(), self.fresh_for.as_millis() as u64);
        self.seen.iter().any(|s| {
            let at = s.load(Ordering::Relaxed);
            at == 0 || now - at.min(now) > window
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tier_must_be_seen_drained_within_the_window() {
        let d = Drained::new(Duration::from_secs(3600));
        assert!(d.more(), "nothing seen yet");
        d.saw(0, true);
        d.saw(1, true);
        assert!(d.more(), "tier 2 not seen");
        d.saw(2, true);
        assert!(!d.more(), "all three seen drained");
        d.saw(1, false);
        assert!(d.more(), "a fetch from tier 1 left messages pending");
        d.saw(1, true);
        d.filled(2);
        assert!(d.more(), "a submit here to tier 2");
    }

    #[test]
    fn a_drained_tier_counts_only_within_the_window() {
        let d = Drained::new(Duration::ZERO);
        (0..3).for_each(|r| d.saw(r, true));
        std::thread::sleep(Duration::from_millis(5));
        assert!(d.more(), "seen drained longer ago than the window");
    }
}
