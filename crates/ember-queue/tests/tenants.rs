//! Per-tenant caps on running tasks (the embedded backend only, so far;
//! retention is in the conformance suite).
mod common;

use common::{spec, Fixture};
use ember_queue::{Outcome, QueueConfig, TaskQueue};
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
