//! The reconcilers' pure plans: every case of observed × desired, and
//! properties over random inputs.
use ember_operator::claim::{self, Apply};
use ember_operator::pool::{self, Action, Desired};
use ember_types::api::{LaunchInfo, PoolInfo, PoolSizing, SandboxInfo, SandboxStatus};
use proptest::prelude::*;

fn desired(replicas: u32) -> Desired {
    Desired { name: "k8s-ns-p".into(), template: "host".into(), replicas, resources: None, runtime_class: None }
}

fn node_pool(min: u32, max: u32, target: u32, idle: u32) -> PoolInfo {
    PoolInfo {
        name: "k8s-ns-p".into(),
        template: "host".into(),
        min,
        max,
        target: target.into(),
        runtime_class: "native".into(),
        idle,
        sizing: PoolSizing { target: target.clamp(min, max), ..Default::default() },
        ..Default::default()
    }
}

#[test]
fn a_missing_node_pool_is_created_with_a_fixed_target() {
    let Action::Create(req) = pool::plan(Some(&desired(3)), None) else { panic!("expected a create") };
    assert_eq!((req.name.as_deref(), req.template.as_str(), req.min, req.max), (Some("k8s-ns-p"), "host", 0, 3));
    assert_eq!(req.target, Some(3.into()));
}

#[test]
fn a_scaled_resource_resizes_and_a_matching_one_does_nothing() {
    assert_eq!(pool::plan(Some(&desired(3)), Some(&node_pool(0, 3, 3, 1))), Action::Nothing);
    let Action::Resize { name, req } = pool::plan(Some(&desired(5)), Some(&node_pool(0, 3, 3, 3))) else {
        panic!("expected a resize")
    };
    assert_eq!((name.as_str(), req.min, req.max, req.target), ("k8s-ns-p", Some(0), Some(5), Some(5.into())));
    // Scaled to zero: a pool that keeps nothing idle, not a deleted one.
    assert!(matches!(pool::plan(Some(&desired(0)), Some(&node_pool(0, 3, 3, 3))), Action::Resize { .. }));
}

#[test]
fn another_template_or_class_replaces_the_node_pool() {
    let mut d = desired(2);
    d.template = "python".into();
    assert_eq!(pool::plan(Some(&d), Some(&node_pool(0, 2, 2, 2))), Action::Delete("k8s-ns-p".into()));
    let mut d = desired(2);
    d.runtime_class = Some("runsc".into());
    assert_eq!(pool::plan(Some(&d), Some(&node_pool(0, 2, 2, 2))), Action::Delete("k8s-ns-p".into()));
    // Unset class: whatever the node chose is kept.
    assert_eq!(pool::plan(Some(&desired(2)), Some(&node_pool(0, 2, 2, 2))), Action::Nothing);
}

#[test]
fn a_deleted_resource_removes_the_node_pool_once() {
    assert_eq!(pool::plan(None, Some(&node_pool(0, 2, 2, 2))), Action::Delete("k8s-ns-p".into()));
    assert_eq!(pool::plan(None, None), Action::Nothing);
}

#[test]
fn pool_status_reports_the_node_and_its_arithmetic() {
    let mut o = node_pool(0, 4, 4, 1);
    o.starting = 2;
    o.sizing.arrival_per_sec = 0.5;
    o.sizing.refill_secs = 2.0;
    let s = pool::status(None, &o, 2, Some(3), "ember.run.pool=k8s-ns-p".into(), "t1");
    assert_eq!((s.replicas, s.idle, s.starting, s.claimed, s.target), (1, 1, 2, 2, 4));
    assert_eq!((s.capacity.arrival_per_sec, s.capacity.refill_secs, s.capacity.max), (0.5, 2.0, 4));
    let ready = &s.conditions[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str(), ready.observed_generation),
        ("False", "Filling", Some(3))
    );
    o.idle = 4;
    let s2 = pool::status(Some(&s), &o, 2, Some(3), s.selector.clone(), "t2");
    assert_eq!(
        (s2.conditions[0].status.as_str(), s2.conditions[0].last_transition_time.as_deref()),
        ("True", Some("t2"))
    );
}

fn sandbox(id: &str, created: &str, state: &str) -> SandboxInfo {
    SandboxInfo {
        id: id.into(),
        status: SandboxStatus { state: state.into(), reason: None, message: None, last_transition_at: None },
        entrypoint: Vec::new(),
        created_at: created.into(),
        expires_at: None,
        image: None,
        metadata: Default::default(),
        template: "host".into(),
        runtime_class: "native".into(),
        resources: Default::default(),
        launch: Some(LaunchInfo { kind: "warm".into(), micros: 900, phases: Default::default() }),
        workspaces: Vec::new(),
        network: None,
        snapshot_id: None,
        secrets: Vec::new(),
    }
}

#[test]
fn a_claim_without_a_sandbox_claims_one_and_a_bound_one_keeps_it() {
    assert_eq!(claim::plan_apply(&[]), Apply::Claim);
    let s = sandbox("a", "2026-01-01T00:00:01Z", "Running");
    assert_eq!(claim::plan_apply(&[s]), Apply::Bound { keep: "a".into(), remove: vec![] });
}

#[test]
fn a_claim_answered_twice_keeps_the_oldest_and_removes_the_rest() {
    let found = [
        sandbox("b", "2026-01-01T00:00:02Z", "Running"),
        sandbox("a", "2026-01-01T00:00:01Z", "Running"),
        sandbox("c", "2026-01-01T00:00:03Z", "Terminated"),
    ];
    assert_eq!(claim::plan_apply(&found), Apply::Bound { keep: "a".into(), remove: vec!["b".into()] });
}

#[test]
fn an_ended_sandbox_is_not_replaced_and_the_claim_says_why() {
    let s = sandbox("a", "2026-01-01T00:00:01Z", "Terminated");
    assert_eq!(claim::plan_apply(std::slice::from_ref(&s)), Apply::Bound { keep: "a".into(), remove: vec![] });
    let st = claim::status(None, Some(&s), None, "http://n:1", None, "t");
    assert_eq!((st.conditions[0].status.as_str(), st.conditions[0].reason.as_str()), ("False", "SandboxEnded"));
}

#[test]
fn claim_status_names_the_sandbox_endpoint_and_launch() {
    let s = sandbox("a", "2026-01-01T00:00:01Z", "Running");
    let st = claim::status(None, Some(&s), None, "http://127.0.0.1:7420/", Some(1), "t");
    assert_eq!(st.sandbox_id.as_deref(), Some("a"));
    assert_eq!(st.endpoint.as_deref(), Some("http://127.0.0.1:7420/v1/sandboxes/a"));
    assert_eq!(st.launch.as_deref(), Some("warm"));
    assert!(st.conditions[0].is_true());
    let failed = claim::status(None, None, Some("POOL::NOT_FOUND: no SandboxPool ns/x"), "http://n:1", None, "t");
    assert_eq!((failed.conditions[0].reason.as_str(), failed.sandbox_id), ("ClaimFailed", None));
}

#[test]
fn cleanup_removes_every_labelled_sandbox_not_already_going() {
    let found = [sandbox("a", "1", "Running"), sandbox("b", "2", "Removing"), sandbox("c", "3", "Terminated")];
    assert_eq!(claim::plan_cleanup(&found), ["a", "c"]);
}

/// Half-second steps written as ember writes them: "…:03Z", "…:03.5Z".
fn time(halves: u16) -> String {
    let (s, half) = (halves / 2, halves % 2 == 1);
    format!("2026-01-01T00:00:{s:02}{}Z", if half { ".5" } else { "" })
}

fn state() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["Pending", "Running", "Paused", "Stopping", "Terminated", "Failed", "Removing"])
}

proptest! {
    /// Whatever the node holds for a claim: exactly one sandbox is kept, it
    /// is the oldest, it is never removed, and nothing already ended is
    /// removed again.
    #[test]
    fn one_sandbox_answers_a_claim(raw in prop::collection::vec((0u16..40, state()), 1..8)) {
        let found: Vec<SandboxInfo> = raw
            .iter()
            .enumerate()
            .map(|(i, (t, st))| sandbox(&format!("s{i}"), &time(*t), st))
            .collect();
        let Apply::Bound { keep, remove } = claim::plan_apply(&found) else { panic!("a found sandbox is kept") };
        let oldest = found.iter().zip(&raw).map(|(s, (t, _))| (t, &s.id)).min().map(|(_, id)| id.clone());
        prop_assert_eq!(Some(keep.clone()), oldest);
        prop_assert!(!remove.contains(&keep));
        prop_assert_eq!(remove.len() + 1 + found.iter().filter(|s| s.id != keep && matches!(s.status.state.as_str(), "Terminated" | "Failed" | "Stopping" | "Removing")).count(), found.len());
    }

    /// Planning again after the planned step converges: a created or resized
    /// pool plans nothing more.
    #[test]
    fn the_pool_plan_converges(replicas in 0u32..50, min in 0u32..50, max in 0u32..50, target in 0u32..50) {
        let d = desired(replicas);
        let node = node_pool(min, max.max(min), target, 0);
        let next = match pool::plan(Some(&d), Some(&node)) {
            Action::Nothing => node,
            Action::Resize { req, .. } => PoolInfo {
                min: req.min.unwrap_or(node.min),
                max: req.max.unwrap_or(node.max),
                target: req.target.unwrap_or(node.target.clone()),
                ..node
            },
            other => return Err(TestCaseError::fail(format!("unexpected {other:?}"))),
        };
        prop_assert_eq!(pool::plan(Some(&d), Some(&next)), Action::Nothing);
    }
}

#[test]
fn the_oldest_is_found_by_time_not_by_text() {
    // RFC 3339 as ember writes it drops a zero fraction: as text, "01.5Z"
    // sorts before "01Z" although it is half a second later.
    let found =
        [sandbox("later", "2026-01-01T00:00:01.5Z", "Running"), sandbox("first", "2026-01-01T00:00:01Z", "Running")];
    assert_eq!(claim::plan_apply(&found), Apply::Bound { keep: "first".into(), remove: vec!["later".into()] });
}

#[test]
fn a_sandbox_resource_is_ready_once_the_node_runs_it_and_failed_when_the_node_refused() {
    use ember_operator::{conditions, sandbox};
    let s = sandbox("a", "2026-01-01T00:00:01Z", "Running");
    let st = sandbox::status(None, Some(&s), None, Some("t0".into()), Some(1), "t1");
    assert_eq!((st.sandbox_id.as_deref(), st.phase.as_deref()), (Some("a"), Some("Running")));
    let ready = conditions::find(&st.conditions, "Ready").expect("Ready");
    assert!(ready.is_true());
    assert_eq!((ready.last_transition_time.as_deref(), st.started_at.as_deref()), (Some("t1"), Some("t0")));
    let st = sandbox::status(Some(&st), None, Some("TEMPLATE::NOT_FOUND: x"), None, Some(2), "t2");
    let ready = conditions::find(&st.conditions, "Ready").expect("Ready");
    assert_eq!((ready.reason.as_str(), st.phase.as_deref()), ("CreateFailed", Some("Failed")));
}
