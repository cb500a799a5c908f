//! The behaviour every [`TaskQueue`] backend shares, as test functions over
//! a [`Harness`]: the embedded queue runs them in `tests/conformance.rs`,
//! the JetStream queue in ember-cluster's tests, on a real 3-server
//! cluster. [`conformance_tests!`](crate::conformance_tests) makes one
//! `#[test]` per function. Behind the `testing` feature.
//!
//! Time: submission and transition times come from the harness's clock
//! ([`Harness::advance`]); lease expiry is the backend's own — the embedded
//! queue's deadline on that clock, JetStream's AckWait in real time — so a
//! test lets leases run out with [`Harness::expire_leases`] and takes the
//! next task with [`lease_due`], which waits as long as the backend needs.
use crate::{Lease, Outcome, QueueConfig, QueueError, Retention, TaskFilter, TaskQueue};
use ember_types::task::{TaskRecord, TaskSpec, TaskState, Tier};
use std::time::{Duration, Instant};

pub trait Harness {
    /// A handle on the harness's queue. Called again after the previous
    /// handle is dropped, it opens the same tasks again (a reopened journal,
    /// another node's client of the same cluster).
    fn open(&self, cfg: QueueConfig) -> Box<dyn TaskQueue>;
    /// Moves the clock the queue stamps records with.
    fn advance(&self, ms: i64);
    /// Makes every live lease of [`spec`]'s length (1 s) run out.
    fn expire_leases(&self, q: &dyn TaskQueue);
}

/// Longest a test waits for a task to become due (a redelivery after
/// AckWait, a Nak delay); past it the test fails naming what it waited for.
pub const DUE_WITHIN: Duration = Duration::from_secs(30);

/// The next lease for `worker`, once the backend offers one.
pub fn lease_due(q: &dyn TaskQueue, worker: &str) -> (Lease, TaskRecord) {
    let start = Instant::now();
    loop {
        if let Some(got) = q.lease(worker).expect("lease") {
            return got;
        }
        assert!(start.elapsed() < DUE_WITHIN, "no task became due for {worker} within {DUE_WITHIN:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A task of `tier` with `attempts` attempts and a 1 s lease.
pub fn spec(tier: Tier, attempts: u32) -> TaskSpec {
    TaskSpec {
        command: vec!["true".into()],
        template: "host".into(),
        workspace: None,
        tier,
        key: None,
        timeout_secs: 60,
        max_attempts: attempts,
        lease_ms: 1_000,
        heartbeat_ms: 300,
        env: Default::default(),
        tenant: None,
        reuse_sandbox: false,
    }
}

fn on(ws: Option<&str>) -> TaskSpec {
    TaskSpec { workspace: ws.map(String::from), ..spec(Tier::Standard, 2) }
}

pub fn a_lease_is_exclusive_and_fenced_after_expiry(h: &dyn Harness) {
    let q = h.open(QueueConfig::default());
    q.submit("t1", spec(Tier::Standard, 3)).unwrap();
    let (a, _) = lease_due(&*q, "w1");
    assert!(q.lease("w2").unwrap().is_none(), "leased to exactly one worker");
    q.heartbeat(&a).unwrap();
    h.expire_leases(&*q);
    let (b, rec) = lease_due(&*q, "w2");
    let reason = rec.attempts[0].reason.as_deref().unwrap_or_default();
    assert_eq!((b.attempt, reason.contains("lease expired")), (2, true), "{reason}");
    // The first worker comes back: every report of its attempt is refused.
    assert!(matches!(q.heartbeat(&a), Err(QueueError::Fenced { current: 2, .. })));
    assert!(matches!(q.finish(&a, Outcome::Succeeded), Err(QueueError::Fenced { .. })));
    assert!(matches!(q.started(&a, "sb", None), Err(QueueError::Fenced { .. })));
    assert!(matches!(q.placed(&a, "sb"), Err(QueueError::Fenced { .. })));
    q.placed(&b, "sb2").unwrap();
    assert_eq!(q.started(&b, "sb2", Some(7)).unwrap().attempts[1].workspace_epoch, Some(7));
    let r = q.finish(&b, Outcome::Succeeded).unwrap();
    assert_eq!(r.state, TaskState::Succeeded);
    assert!(matches!(q.finish(&b, Outcome::Succeeded), Err(QueueError::Fenced { .. })), "finished once");
    let states: Vec<_> = r.transitions.iter().map(|t| (t.state, t.attempt)).collect();
    use TaskState::*;
    assert_eq!(states, [(Queued, 0), (Leased, 1), (Queued, 1), (Leased, 2), (Running, 2), (Succeeded, 2)]);
    assert_eq!(q.get("t1").unwrap(), r);
}

pub fn failures_retry_then_dead_letter_and_term_is_final(h: &dyn Harness) {
    let q = h.open(QueueConfig::default());
    q.submit("t1", spec(Tier::Standard, 3)).unwrap();
    for n in 1..=3 {
        let (l, _) = lease_due(&*q, "w");
        let r = q.finish(&l, Outcome::Retry { reason: format!("exit code {n}"), exit_code: Some(n) }).unwrap();
        assert_eq!(r.state, if n < 3 { TaskState::Queued } else { TaskState::DeadLettered });
    }
    let r = q.get("t1").unwrap();
    let reasons: Vec<_> = r.attempts.iter().map(|a| a.reason.clone().unwrap()).collect();
    assert_eq!(reasons, ["exit code 1", "exit code 2", "exit code 3"]);
    assert!(q.lease("w").unwrap().is_none());

    q.submit("t2", spec(Tier::Standard, 3)).unwrap();
    let (l, _) = lease_due(&*q, "w");
    assert_eq!(q.finish(&l, Outcome::Fail { reason: "no such template".into() }).unwrap().state, TaskState::Failed);
    assert!(matches!(q.cancel("t2"), Err(QueueError::Finished { .. })));
    assert!(q.lease("w").unwrap().is_none(), "a failed task is not offered again");
}

pub fn tiers_are_taken_in_order(h: &dyn Harness) {
    let q = h.open(QueueConfig { aging_ms: 10_000, ..Default::default() });
    for (id, tier) in [("b", Tier::Batch), ("s", Tier::Standard), ("i", Tier::Interactive)] {
        q.submit(id, spec(tier, 1)).unwrap();
        h.advance(10);
    }
    // Order holds among tasks the workers can see: on JetStream a tier's
    // consumer learns of a publish a moment after the publish is acked.
    let start = Instant::now();
    while q.stats().queued != [1, 1, 1] {
        assert!(start.elapsed() < DUE_WITHIN, "the three tasks never showed as queued: {:?}", q.stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    let order: Vec<_> = (0..3).map(|_| lease_due(&*q, "w").0.task).collect();
    assert_eq!(order, ["i", "s", "b"]);
}

pub fn a_key_returns_the_same_task_and_cancel_fences_a_lease(h: &dyn Harness) {
    let q = h.open(QueueConfig::default());
    let mut s = spec(Tier::Standard, 1);
    s.key = Some("k1 with spaces/and.dots".into());
    let (a, new_a) = q.submit("t1", s.clone()).unwrap();
    let (b, new_b) = q.submit("t2", s).unwrap();
    assert_eq!((a.id.as_str(), b.id.as_str(), new_a, new_b), ("t1", "t1", true, false));
    assert!(matches!(q.get("t2"), Err(QueueError::NotFound(_))));
    let (l, _) = lease_due(&*q, "w");
    assert_eq!(q.cancel("t1").unwrap().state, TaskState::Cancelled);
    assert!(matches!(q.heartbeat(&l), Err(QueueError::Fenced { .. })), "a cancelled lease is fenced");
    assert!(matches!(q.finish(&l, Outcome::Succeeded), Err(QueueError::Fenced { .. })));
    q.submit("t3", spec(Tier::Standard, 1)).unwrap();
    q.cancel("t3").unwrap();
    assert!(q.lease("w").unwrap().is_none(), "a cancelled queued task is not offered");
}

/// An idempotency key is its tenant's: another tenant's submit of the same
/// key is a task of its own (it answered the first tenant's task, command
/// and env included), and a second submit within one tenant is still the
/// first task. The admin's key `acme/k` (no tenant) is not tenant acme's
/// key `k` either way round.
pub fn a_key_is_its_tenants(h: &dyn Harness) {
    let q = h.open(QueueConfig::default());
    let keyed = |tenant: Option<&str>, key: &str| {
        let mut s = spec(Tier::Standard, 1);
        (s.key, s.tenant) = (Some(key.into()), tenant.map(String::from));
        s
    };
    let (a, new_a) = q.submit("ta", keyed(Some("acme"), "k")).unwrap();
    let (b, new_b) = q.submit("tb", keyed(Some("globex"), "k")).unwrap();
    assert_eq!((a.id.as_str(), b.id.as_str(), new_a, new_b), ("ta", "tb", true, true));
    let (again, new) = q.submit("tc", keyed(Some("globex"), "k")).unwrap();
    assert_eq!((again.id.as_str(), new), ("tb", false));
    let (admin, new) = q.submit("td", keyed(None, "acme/k")).unwrap();
    assert_eq!((admin.id.as_str(), new), ("td", true), "the admin's acme/k is not acme's k");
    let (other, new) = q.submit("te", keyed(Some("acme"), "k2")).unwrap();
    assert_eq!((other.id.as_str(), new), ("te", true));
    let (admin, new) = q.submit("tf", keyed(None, "acme/k2")).unwrap();
    assert_eq!((admin.id.as_str(), new), ("tf", true), "nor is acme's k2 the admin's acme/k2");
    let (again, new) = q.submit("tg", keyed(None, "acme/k")).unwrap();
    assert_eq!((again.id.as_str(), new), ("td", false), "the admin's own key is still its own");
}

pub fn another_handle_sees_every_state(h: &dyn Harness) {
    {
        let q = h.open(QueueConfig::default());
        for (id, tier) in [("q", Tier::Batch), ("l", Tier::Interactive), ("d", Tier::Standard), ("c", Tier::Batch)] {
            q.submit(id, spec(tier, 2)).unwrap();
            h.advance(1);
        }
        let (l, _) = lease_due(&*q, "w");
        assert_eq!(l.task, "l");
        let (d, _) = lease_due(&*q, "w");
        q.started(&d, "sb", None).unwrap();
        q.finish(&d, Outcome::Succeeded).unwrap();
        q.cancel("c").unwrap();
    }
    let q = h.open(QueueConfig::default());
    let state = |id: &str| q.get(id).unwrap().state;
    use TaskState::*;
    assert_eq!([state("q"), state("l"), state("d"), state("c")], [Queued, Leased, Succeeded, Cancelled]);
    let ids = |f: TaskFilter| q.list(&f).expect("list").into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(TaskFilter { states: vec![Leased], ..Default::default() }), ["l"]);
    assert_eq!(ids(TaskFilter { tiers: vec![Tier::Batch], ..Default::default() }), ["q", "c"]);
    assert_eq!(ids(TaskFilter::default()), ["q", "l", "d", "c"], "oldest first");
}

pub fn a_held_workspace_is_not_leased_again_until_its_attempt_ends(h: &dyn Harness) {
    let q = h.open(QueueConfig::default());
    for (id, ws) in [("w1", Some("w")), ("w2", Some("w")), ("v1", Some("v")), ("n1", None), ("w3", Some("w"))] {
        q.submit(id, on(ws)).unwrap();
        h.advance(1);
    }
    let mut got = Vec::new();
    while let Some((l, _)) = q.lease("x").unwrap() {
        got.push(l);
    }
    let ids: Vec<&str> = got.iter().map(|l| l.task.as_str()).collect();
    assert_eq!(ids, ["w1", "v1", "n1"], "w2 and w3 wait for w1's attempt");
    for l in &got[1..] {
        q.finish(l, Outcome::Succeeded).unwrap();
    }
    // A failed attempt keeps w1 ahead of w2 (submission order).
    q.finish(&got[0], Outcome::Retry { reason: "exit 1".into(), exit_code: Some(1) }).unwrap();
    let (l, _) = lease_due(&*q, "x");
    assert_eq!((l.task.as_str(), l.attempt), ("w1", 2));
    assert!(q.lease("x").unwrap().is_none(), "w is held again");
    q.finish(&l, Outcome::Succeeded).unwrap();
    let (l, _) = lease_due(&*q, "x");
    assert_eq!(l.task, "w2");
    // An expired lease frees the workspace for its own next attempt only.
    h.expire_leases(&*q);
    let (l, _) = lease_due(&*q, "x");
    assert_eq!((l.task.as_str(), l.attempt), ("w2", 2));
    // A cancelled attempt frees it.
    q.cancel("w2").unwrap();
    assert_eq!(lease_due(&*q, "x").0.task, "w3");
}

pub fn another_handle_still_holds_the_workspaces_of_live_attempts(h: &dyn Harness) {
    {
        let q = h.open(QueueConfig::default());
        q.submit("a", on(Some("w"))).unwrap();
        h.advance(1);
        q.submit("b", on(Some("w"))).unwrap();
        assert_eq!(lease_due(&*q, "x").0.task, "a");
    }
    let q = h.open(QueueConfig::default());
    assert!(q.lease("x").unwrap().is_none(), "a's attempt still holds w");
}

pub fn retention_drops_old_and_surplus_finished_tasks_for_good(h: &dyn Harness) {
    let cfg =
        QueueConfig { retention: Retention { max_age_ms: Some(10_000), max_finished: Some(2) }, ..Default::default() };
    let q = h.open(cfg.clone());
    let mut keyed = spec(Tier::Standard, 1);
    keyed.key = Some("k".into());
    q.submit("old", keyed.clone()).unwrap();
    let (l, _) = lease_due(&*q, "w");
    q.finish(&l, Outcome::Succeeded).unwrap();
    h.advance(5_000);
    for id in ["f1", "f2", "f3"] {
        q.submit(id, spec(Tier::Standard, 1)).unwrap();
        let (l, _) = lease_due(&*q, "w");
        q.finish(&l, Outcome::Retry { reason: "no".into(), exit_code: Some(1) }).unwrap(); // dead-lettered
        h.advance(1);
    }
    q.submit("waiting", spec(Tier::Standard, 1)).unwrap();
    // Four finished, at most two kept: the two oldest go, even before their age.
    let pruned = q.prune().unwrap();
    let ids: Vec<(&str, u32)> = pruned.iter().map(|p| (p.task.as_str(), p.attempts)).collect();
    assert_eq!(ids, [("old", 1), ("f1", 1)]);
    assert!(matches!(q.get("old"), Err(QueueError::NotFound(_))));
    assert!(q.prune().unwrap().is_empty(), "nothing more is due");
    // Past the age, the rest go; a queued task is never dropped.
    h.advance(10_000);
    assert_eq!(q.prune().unwrap().len(), 2);
    // The dropped key is free again.
    let (again, created) = q.submit("new", keyed).unwrap();
    assert!(created && again.id == "new");
    drop(q);
    let q = h.open(cfg);
    let all: Vec<String> = q.list(&Default::default()).expect("list").into_iter().map(|r| r.id).collect();
    assert_eq!(all, ["waiting", "new"], "the dropped tasks are gone for good");
}

/// One `#[test]` per conformance function, each on a fresh harness from
/// `$make` (an expression evaluated per test, given the test's name).
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@each $make;
            a_lease_is_exclusive_and_fenced_after_expiry,
            failures_retry_then_dead_letter_and_term_is_final,
            tiers_are_taken_in_order,
            a_key_returns_the_same_task_and_cancel_fences_a_lease,
            a_key_is_its_tenants,
            another_handle_sees_every_state,
            a_held_workspace_is_not_leased_again_until_its_attempt_ends,
            another_handle_still_holds_the_workspaces_of_live_attempts,
            retention_drops_old_and_surplus_finished_tasks_for_good,
        );
    };
    (@each $make:expr; $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                let h = ($make)(stringify!($name));
                $crate::conformance::$name(&h);
            }
        )*
    };
}
