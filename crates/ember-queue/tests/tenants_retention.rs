//! Per-tenant caps on running tasks, and retention of finished tasks: the
//! journal forgets them, so a reopened queue does not bring them back.
mod common;

use common::{spec, Fixture};
use ember_queue::{Outcome, Pruned, QueueConfig, QueueError, Retention, TaskQueue};
use ember_types::task::{TaskSpec, Tier};
use std::collections::BTreeMap;

fn for_tenant(tenant: Option<&str>) -> TaskSpec {
    TaskSpec { tenant: tenant.map(String::from), ..spec(Tier::Standard, 1) }
}

#[test]
fn a_tenant_at_its_cap_is_stepped_over_and_others_run() {
    let f = Fixture::new("tenants");
    let cfg = QueueConfig {
        tenant_cap: Some(1),
        tenant_caps: BTreeMap::from([("big".to_string(), 2)]),
        ..Default::default()
    };
    let q = f.open(cfg);
    // Submitted oldest first: a1 a2 a3 (tenant a), b1 b2 (big), d1 (no tenant: "default").
    for (id, t) in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "big"), ("b2", "big"), ("b3", "big")] {
        q.submit(id, for_tenant(Some(t))).unwrap();
        f.advance(1);
    }
    q.submit("d1", for_tenant(None)).unwrap();
    q.submit("d2", for_tenant(None)).unwrap();
    let mut got = Vec::new();
    while let Some((l, _)) = q.lease("w").unwrap() {
        got.push(l);
    }
    let ids: Vec<&str> = got.iter().map(|l| l.task.as_str()).collect();
    // a: cap 1 (the default); big: its own cap 2; tasks without a tenant share "default", cap 1.
    assert_eq!(ids, ["a1", "b1", "b2", "d1"], "oldest eligible first, capped tenants stepped over");
    // A slot of tenant a frees: its next task, not another tenant's, is eligible.
    q.finish(&got[0], Outcome::Succeeded).unwrap();
    assert_eq!(q.lease("w").unwrap().unwrap().0.task, "a2");
    assert!(q.lease("w").unwrap().is_none());
    // A cancelled lease frees its tenant's slot too.
    q.cancel("b1").unwrap();
    assert_eq!(q.lease("w").unwrap().unwrap().0.task, "b3");
}

#[test]
fn retention_drops_old_and_surplus_finished_tasks_for_good() {
    let f = Fixture::new("retention");
    let cfg =
        QueueConfig { retention: Retention { max_age_ms: Some(10_000), max_finished: Some(2) }, ..Default::default() };
    let q = f.open(cfg.clone());
    let mut keyed = spec(Tier::Standard, 1);
    keyed.key = Some("k".into());
    q.submit("old", keyed.clone()).unwrap();
    let (l, _) = q.lease("w").unwrap().unwrap();
    q.finish(&l, Outcome::Succeeded).unwrap();
    f.advance(5_000);
    for id in ["f1", "f2", "f3"] {
        q.submit(id, spec(Tier::Standard, 1)).unwrap();
        let (l, _) = q.lease("w").unwrap().unwrap();
        q.finish(&l, Outcome::Retry { reason: "no".into(), exit_code: Some(1) }).unwrap(); // dead-lettered
        f.advance(1);
    }
    q.submit("waiting", spec(Tier::Standard, 1)).unwrap();
    // Four finished, at most two kept: the two oldest go, even before their age.
    let pruned = q.prune().unwrap();
    let ids: Vec<&str> = pruned.iter().map(|p| p.task.as_str()).collect();
    assert_eq!(ids, ["old", "f1"]);
    assert_eq!(pruned[0], Pruned { task: "old".into(), attempts: 1 });
    assert!(matches!(q.get("old"), Err(QueueError::NotFound(_))));
    assert!(q.prune().unwrap().is_empty(), "nothing more is due");
    // Past the age, the rest go; a queued task is never dropped.
    f.advance(10_000);
    assert_eq!(q.prune().unwrap().len(), 2);
    // The dropped key is free again.
    let (again, created) = q.submit("new", keyed).unwrap();
    assert!(created && again.id == "new");
    drop(q);
    let q = f.open(cfg);
    let all: Vec<String> = q.list(&Default::default()).into_iter().map(|r| r.id).collect();
    assert_eq!(all, ["waiting", "new"], "the journal forgot the dropped tasks");
}
