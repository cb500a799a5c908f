//! The embedded queue against a fake clock and a temp dir, beyond the
//! conformance suite every backend runs (`conformance.rs`): deadlines on the
//! clock, aging between tiers, tier caps, and reopening a damaged journal.
mod common;

use common::{spec, Fixture};
use ember_queue::{Outcome, QueueConfig, QueueError, TaskFilter, TaskQueue};
use ember_types::task::{TaskState, Tier};

#[test]
fn a_lease_is_exclusive_renewed_by_heartbeats_and_fenced_after_expiry() {
    let f = Fixture::new("lease");
    let q = f.open(QueueConfig::default());
    q.submit("t1", spec(Tier::Standard, 3)).unwrap();
    let (a, _) = q.lease("w1").unwrap().expect("a task");
    assert!(q.lease("w2").unwrap().is_none(), "leased to exactly one worker");
    f.advance(800);
    q.heartbeat(&a).unwrap();
    f.advance(800);
    assert!(q.expire().unwrap().is_empty(), "the heartbeat renewed the deadline");
    f.advance(1_200);
    let exp = q.expire().unwrap();
    assert_eq!((exp.len(), exp[0].silent_ms, exp[0].now), (1, 2_000, TaskState::Queued));
    let (b, rec) = q.lease("w2").unwrap().expect("re-leased");
    assert_eq!((b.attempt, rec.attempts[0].reason.as_deref().map(|r| r.contains("lease expired"))), (2, Some(true)));
    // The first worker comes back: every report of its attempt is refused.
    assert!(matches!(q.heartbeat(&a), Err(QueueError::Fenced { current: 2, .. })));
    assert!(matches!(q.finish(&a, Outcome::Succeeded), Err(QueueError::Fenced { .. })));
    assert!(matches!(q.started(&a, "sb", None), Err(QueueError::Fenced { .. })));
    q.started(&b, "sb2", Some(7)).unwrap();
    let r = q.finish(&b, Outcome::Succeeded).unwrap();
    assert_eq!(r.state, TaskState::Succeeded);
    let states: Vec<_> = r.transitions.iter().map(|t| (t.state, t.attempt)).collect();
    assert_eq!(
        states,
        [
            (TaskState::Queued, 0),
            (TaskState::Leased, 1),
            (TaskState::Queued, 1),
            (TaskState::Leased, 2),
            (TaskState::Running, 2),
            (TaskState::Succeeded, 2)
        ]
    );
}

#[test]
fn aging_lets_old_batch_work_pass_fresh_interactive_work() {
    let f = Fixture::new("tiers");
    let q = f.open(QueueConfig { aging_ms: 10_000, ..Default::default() });
    // A batch task 20 s old beats interactive work enqueued since.
    q.submit("old-batch", spec(Tier::Batch, 1)).unwrap();
    f.advance(20_001);
    q.submit("fresh", spec(Tier::Interactive, 1)).unwrap();
    assert_eq!(q.lease("w").unwrap().unwrap().0.task, "old-batch");
}

#[test]
fn a_tier_at_its_cap_waits_for_a_slot() {
    let f = Fixture::new("caps");
    let q = f.open(QueueConfig { aging_ms: 1_000, tier_caps: [None, None, Some(1)], ..Default::default() });
    q.submit("b1", spec(Tier::Batch, 1)).unwrap();
    q.submit("b2", spec(Tier::Batch, 1)).unwrap();
    let (l, _) = q.lease("w1").unwrap().unwrap();
    assert!(q.lease("w2").unwrap().is_none(), "batch is capped at one");
    assert_eq!(q.stats().active, [0, 0, 1]);
    q.finish(&l, Outcome::Succeeded).unwrap();
    assert_eq!(q.lease("w2").unwrap().unwrap().0.task, "b2");
}

#[test]
fn reopening_restores_every_state_and_gives_leases_a_fresh_deadline() {
    let f = Fixture::new("reopen");
    {
        let q = f.open(QueueConfig::default());
        for (id, tier) in [("q", Tier::Batch), ("l", Tier::Interactive), ("d", Tier::Standard), ("c", Tier::Batch)] {
            q.submit(id, spec(tier, 2)).unwrap();
        }
        let (l, _) = q.lease("w").unwrap().unwrap();
        assert_eq!(l.task, "l");
        let (d, _) = q.lease("w").unwrap().unwrap();
        q.started(&d, "sb", None).unwrap();
        q.finish(&d, Outcome::Succeeded).unwrap();
        q.cancel("c").unwrap();
    }
    // A torn last line, as a kill mid-write would leave.
    let journal = f.dir.join("tasks.journal");
    let mut data = std::fs::read(&journal).unwrap();
    data.extend_from_slice(b"0123456789abcdef {\"id\":\"tor");
    std::fs::write(&journal, data).unwrap();

    let q = f.open(QueueConfig::default());
    assert_eq!(q.damaged, 1);
    let state = |id: &str| q.get(id).unwrap().state;
    assert_eq!(
        [state("q"), state("l"), state("d"), state("c")],
        [TaskState::Queued, TaskState::Leased, TaskState::Succeeded, TaskState::Cancelled]
    );
    assert_eq!(q.list(&TaskFilter { states: vec![TaskState::Leased], ..Default::default() }).expect("list").len(), 1);
    f.advance(999);
    assert!(q.expire().unwrap().is_empty(), "a full lease after the restart");
    f.advance(1);
    assert_eq!(q.expire().unwrap()[0].task, "l");
    assert_eq!(q.stats().queued, [1, 0, 1]);
}
