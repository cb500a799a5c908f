//! Which tier a free worker takes from next: pure, so the order is testable.
//!
//! Each tier's oldest waiting task gets a virtual time, its enqueue time plus
//! `rank × aging`; the smallest wins, ties go to the more urgent tier. Tasks
//! enqueued within one aging of each other are therefore taken strictly by
//! tier, and a batch task waits at most two agings behind interactive work
//! that keeps arriving. A tier at its concurrency cap is skipped.
//!
//! Within a tier, [`first_runnable`] says which waiting task is the head: the
//! oldest whose tenant is under its cap and whose workspace no live attempt
//! holds (a per-workspace concurrency of one).

use std::collections::HashSet;

/// `heads[rank]`: enqueue time (ms) of that tier's oldest waiting task.
/// `active[rank]`: its leased or running tasks. Returns the rank to take from.
pub fn pick(heads: [Option<i64>; 3], active: [u64; 3], caps: [Option<u32>; 3], aging_ms: i64) -> Option<usize> {
    (0..3)
        .filter(|&r| caps[r].is_none_or(|c| active[r] < c as u64))
        .filter_map(|r| heads[r].map(|t| (t.saturating_add(r as i64 * aging_ms), r)))
        .min()
        .map(|(_, r)| r)
}

/// Index (in `waiting`, oldest first) of the first task that may start:
/// `tenant_full(tenant)` false, its workspace not in `held` (the workspaces
/// a live attempt holds), and no older task of the same workspace stepped
/// over in this scan, so one workspace's tasks start in submission order
/// within a tier. `waiting` yields `(tenant, workspace)`.
pub fn first_runnable<'a>(
    waiting: impl Iterator<Item = (&'a str, Option<&'a str>)>,
    tenant_full: impl Fn(&str) -> bool,
    held: &HashSet<String>,
) -> Option<usize> {
    let mut passed: HashSet<&str> = HashSet::new();
    for (i, (tenant, ws)) in waiting.enumerate() {
        let ws_free = ws.is_none_or(|w| !held.contains(w) && !passed.contains(w));
        if ws_free && !tenant_full(tenant) {
            return Some(i);
        }
        passed.extend(ws);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{first_runnable, pick};
    use std::collections::HashSet;

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

    #[test]
    fn a_held_workspace_holds_back_its_tasks_and_keeps_their_order() {
        let held: HashSet<String> = HashSet::from(["w".to_string()]);
        let none = HashSet::new();
        let waiting = [("a", Some("w")), ("a", Some("v")), ("a", None)];
        assert_eq!(first_runnable(waiting.into_iter(), |_| false, &held), Some(1));
        assert_eq!(first_runnable(waiting.into_iter(), |_| false, &none), Some(0));
        // w's oldest task waits for its tenant: w's younger task must not pass it.
        let waiting = [("full", Some("w")), ("b", Some("w")), ("b", None)];
        assert_eq!(first_runnable(waiting.into_iter(), |t| t == "full", &none), Some(2));
        assert_eq!(first_runnable([("a", Some("w"))].into_iter(), |_| false, &held), None);
    }
}
