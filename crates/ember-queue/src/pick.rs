//! Which tier a free worker takes from next: pure, so the order is testable.
//!
//! Each tier's oldest waiting task gets a virtual time, its enqueue time plus
//! `rank × aging`; the smallest wins, ties go to the more urgent tier. Tasks
//! enqueued within one aging of each other are therefore taken strictly by
//! tier, and a batch task waits at most two agings behind interactive work
//! that keeps arriving. A tier at its concurrency cap is skipped.

/// `heads[rank]`: enqueue time (ms) of that tier's oldest waiting task.
/// `active[rank]`: its leased or running tasks. Returns the rank to take from.
pub fn pick(heads: [Option<i64>; 3], active: [u64; 3], caps: [Option<u32>; 3], aging_ms: i64) -> Option<usize> {
    (0..3)
        .filter(|&r| caps[r].is_none_or(|c| active[r] < c as u64))
        .filter_map(|r| heads[r].map(|t| (t.saturating_add(r as i64 * aging_ms), r)))
        .min()
        .map(|(_, r)| r)
}

#[cfg(test)]
mod tests {
    use super::pick;

    const NO_CAPS: [Option<u32>; 3] = [None; 3];

    #[test]
    fn strict_tier_order_within_one_aging() {
        // Batch was enqueued first, interactive last: interactive still goes first.
        assert_eq!(pick([Some(900), Some(500), Some(100)], [0; 3], NO_CAPS, 1_000), Some(0));
        assert_eq!(pick([None, Some(500), Some(100)], [0; 3], NO_CAPS, 1_000), Some(1));
        assert_eq!(pick([None, None, Some(100)], [0; 3], NO_CAPS, 1_000), Some(2));
        assert_eq!(pick([None; 3], [0; 3], NO_CAPS, 1_000), None);
    }

    #[test]
    fn aging_lets_old_batch_work_pass_fresh_interactive_work() {
        // Batch enqueued at 0 is worth 2000; interactive enqueued at 2500 is worth 2500.
        assert_eq!(pick([Some(2_500), None, Some(0)], [0; 3], NO_CAPS, 1_000), Some(2));
        assert_eq!(pick([Some(1_500), None, Some(0)], [0; 3], NO_CAPS, 1_000), Some(0));
        // A tie goes to the more urgent tier.
        assert_eq!(pick([Some(2_000), None, Some(0)], [0; 3], NO_CAPS, 1_000), Some(0));
    }

    #[test]
    fn a_capped_tier_is_skipped() {
        let caps = [Some(1), None, None];
        assert_eq!(pick([Some(0), Some(0), None], [1, 0, 0], caps, 1_000), Some(1));
        assert_eq!(pick([Some(0), None, None], [1, 0, 0], caps, 1_000), None);
        assert_eq!(pick([Some(0), None, None], [0, 5, 5], caps, 1_000), Some(0));
    }
}
