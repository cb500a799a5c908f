//! The embedded queue against a fake clock and a temp dir: leases, fencing,
//! expiry, dead letters, tiers, caps, idempotency, and reopening.
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
fn failures_retry_then_dead_letter_with_every_reason_and_term_is_final() {
    let f = Fixture::new("dlq");
    let q = f.open(QueueConfig::default());
    q.submit("t1", spec(Tier::Standard, 3)).unwrap();
    for n in 1..=3 {
        let (l, _) = q.lease("w").unwrap().expect("leased");
        let r = q.finish(&l, Outcome::Retry { reason: format!("exit code {n}"), exit_code: Some(n) }).unwrap();
        assert_eq!(r.state, if n < 3 { TaskState::Queued } else { TaskState::DeadLettered });
    }
    let r = q.get("t1").unwrap();
    let reasons: Vec<_> = r.attempts.iter().map(|a| a.reason.clone().unwrap()).collect();
    assert_eq!(reasons, ["exit code 1", "exit code 2", "exit code 3"]);
    assert!(q.lease("w").unwrap().is_none());

    q.submit("t2", spec(Tier::Standard, 3)).unwrap();
    let (l, _) = q.lease("w").unwrap().unwrap();
    assert_eq!(q.finish(&l, Outcome::Fail { reason: "no such template".into() }).unwrap().state, TaskState::Failed);
    assert!(matches!(q.cancel("t2"), Err(QueueError::Finished { .. })));
}

#[test]
fn tiers_are_strict_within_one_aging_and_aging_prevents_starvation() {
    let f = Fixture::new("tiers");
    let q = f.open(QueueConfig { aging_ms: 10_000, ..Default::default() });
    q.submit("b", spec(Tier::Batch, 1)).unwrap();
    f.advance(10);
    q.submit("s", spec(Tier::Standard, 1)).unwrap();
    f.advance(10);
    q.submit("i", spec(Tier::Interactive, 1)).unwrap();
    let order: Vec<_> = (0..3).map(|_| q.lease("w").unwrap().unwrap().0.task).collect();
    assert_eq!(order, ["i", "s", "b"]);

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
fn a_key_returns_the_same_task_and_cancel_stops_a_lease() {
    let f = Fixture::new("key");
    let q = f.open(QueueConfig::default());
    let mut s = spec(Tier::Standard, 1);
    s.key = Some("k1".into());
    let (a, new_a) = q.submit("t1", s.clone()).unwrap();
    let (b, new_b) = q.submit("t2", s).unwrap();
    assert_eq!((a.id.as_str(), b.id.as_str(), new_a, new_b), ("t1", "t1", true, false));
    let (l, _) = q.lease("w").unwrap().unwrap();
    assert_eq!(q.cancel("t1").unwrap().state, TaskState::Cancelled);
    assert!(matches!(q.heartbeat(&l), Err(QueueError::Fenced { .. })), "a cancelled lease is fenced");
    assert_eq!(q.stats().active, [0, 0, 0]);
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
    assert_eq!(q.list(&TaskFilter { states: vec![TaskState::Leased], ..Default::default() }).len(), 1);
    f.advance(999);
    assert!(q.expire().unwrap().is_empty(), "a full lease after the restart");
    f.advance(1);
    assert_eq!(q.expire().unwrap()[0].task, "l");
    assert_eq!(q.stats().queued, [1, 0, 1]);
}
