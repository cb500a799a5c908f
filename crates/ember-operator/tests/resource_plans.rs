//! The SandboxTemplate and Workspace reconcilers' pure plans and statuses:
//! each case of observed × desired.
use ember_operator::crd::{Condition, SandboxPool, SandboxPoolSpec, SandboxTemplate, SandboxTemplateSpec};
use ember_operator::template::{self, Action, Desired, TemplateRef};
use ember_operator::workspace;
use ember_types::api::{WorkspaceInfo, WorkspaceLease, WorkspaceSnapshotInfo};
use ember_types::image::TemplateInfo;

fn spec() -> SandboxTemplateSpec {
    SandboxTemplateSpec {
        image: "host".into(),
        resources: None,
        runtime_class: None,
        env: Default::default(),
        entrypoint: None,
        user: None,
        workdir: None,
    }
}

fn desired(generation: i64, observed: Option<i64>) -> Desired {
    Desired {
        req: template::request("k8s-ns-t".into(), &spec()),
        generation: Some(generation),
        observed_generation: observed,
    }
}

fn on_node() -> TemplateInfo {
    TemplateInfo {
        name: "k8s-ns-t".into(),
        builtin: false,
        image: None,
        image_digest: None,
        runtime_class: "native".into(),
        resources: Default::default(),
        network: Default::default(),
        user: None,
        workdir: None,
        env: Default::default(),
        entrypoint: None,
        created_at: None,
    }
}

#[test]
fn a_template_is_made_once_and_replaced_for_a_newer_spec() {
    let Action::Create(req) = template::plan(Some(&desired(1, None)), None, &[]) else { panic!("a create") };
    assert_eq!((req.name.as_str(), req.image.as_deref()), ("k8s-ns-t", None), "`host` is the host's rootfs");
    assert_eq!(template::plan(Some(&desired(1, Some(1))), Some(&on_node()), &[]), Action::Nothing);
    assert!(matches!(template::plan(Some(&desired(2, Some(1))), Some(&on_node()), &[]), Action::Replace(_)));
    // Taken by a node that lost it since: made again.
    assert!(matches!(template::plan(Some(&desired(2, Some(2))), None, &[]), Action::Create(_)));
    let python = SandboxTemplateSpec { image: "python:3.12".into(), ..spec() };
    assert_eq!(template::request("x".into(), &python).image.as_deref(), Some("python:3.12"));
}

#[test]
fn a_deleted_template_waits_for_its_pools_then_goes() {
    let users = vec!["warm".to_string()];
    assert_eq!(template::plan(None, Some(&on_node()), &users), Action::Hold(users.clone()));
    assert_eq!(template::plan(None, None, &users), Action::Hold(users), "held even before the node has it");
    assert_eq!(template::plan(None, Some(&on_node()), &[]), Action::Delete("k8s-ns-t".into()));
    assert_eq!(template::plan(None, None, &[]), Action::Nothing);
}

#[test]
fn only_node_mode_pools_naming_the_template_use_it() {
    let pool = |name: &str, template: &str, pod: bool| {
        let mode = if pod { ember_operator::crd::PoolMode::Pod } else { Default::default() };
        SandboxPool::new(name, SandboxPoolSpec { template: template.into(), mode, ..Default::default() })
    };
    let pools = [pool("b", "t", false), pool("a", "t", false), pool("c", "other", false), pool("d", "t", true)];
    assert_eq!(template::users(&pools, "t"), ["a", "b"]);
}

#[test]
fn a_pool_resolves_its_template_through_the_resource_once_ember_took_it() {
    assert_eq!(template::resolve("ns", "host", None), TemplateRef::Node("host".into()));
    let mut cr = SandboxTemplate::new("t", spec());
    cr.metadata.generation = Some(2);
    assert!(matches!(template::resolve("ns", "t", Some(&cr)), TemplateRef::NotReady(_)), "no status yet");
    let mut st = template::status(None, Some(&on_node()), None, Some(1), "t1");
    cr.status = Some(st.clone());
    assert!(matches!(template::resolve("ns", "t", Some(&cr)), TemplateRef::NotReady(_)), "an older generation");
    st.observed_generation = Some(2);
    cr.status = Some(st);
    assert_eq!(template::resolve("ns", "t", Some(&cr)), TemplateRef::Made("k8s-ns-t".into()));
    let refused = template::status(None, None, Some("runtimeClass: no such class"), Some(2), "t2");
    cr.status = Some(refused);
    let TemplateRef::NotReady(why) = template::resolve("ns", "t", Some(&cr)) else { panic!("not ready") };
    assert!(why.contains("no such class"), "{why}");
}

#[test]
fn a_held_deletion_is_a_condition_cleared_by_the_next_status() {
    let held = template::held(None, &["a".into(), "b".into()], "t1");
    let c = held.conditions.iter().find(|c| c.type_ == "DeletionBlocked").expect("DeletionBlocked");
    assert!(c.is_true() && c.message.contains("a, b"), "{c:?}");
    let next = template::status(Some(&held), Some(&on_node()), None, Some(1), "t2");
    assert_eq!(next.conditions.iter().map(|c| c.type_.as_str()).collect::<Vec<_>>(), ["Ready"]);
}

fn ws(lease: Option<(&str, u64)>, epoch: u64) -> WorkspaceInfo {
    WorkspaceInfo {
        name: "k8s-ns-w".into(),
        size_bytes: 64 << 20,
        epoch,
        lease: lease.map(|(h, e)| WorkspaceLease { holder: h.into(), epoch: e }),
        ..Default::default()
    }
}

#[test]
fn a_workspace_is_created_once_and_deleted_once() {
    let want = Some(("k8s-ns-w", "64Mi"));
    assert_eq!(workspace::plan(want, None), workspace::Action::Create { name: "k8s-ns-w".into(), size: "64Mi".into() });
    assert_eq!(workspace::plan(want, Some(&ws(None, 0))), workspace::Action::Nothing);
    assert_eq!(workspace::plan(None, Some(&ws(None, 0))), workspace::Action::Delete("k8s-ns-w".into()));
    assert_eq!(workspace::plan(None, None), workspace::Action::Nothing);
}

#[test]
fn a_workspace_status_follows_its_holder_and_epoch() {
    let held = workspace::status(None, Some(&ws(Some(("sb-1", 3)), 3)), None, None, Some(1), "t1");
    assert_eq!((held.phase.as_deref(), held.holder.as_deref(), held.epoch), (Some("Held"), Some("sb-1"), 3));
    let free = workspace::status(Some(&held), Some(&ws(None, 3)), None, None, Some(1), "t2");
    assert_eq!((free.phase.as_deref(), free.holder, free.epoch), (Some("Available"), None, 3));
    let ready = free.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!(ready.last_transition_time.as_deref(), Some("t1"), "Ready did not flap");
    let failed = workspace::status(None, None, None, Some("size: at least 16Mi"), Some(1), "t1");
    assert_eq!(failed.phase.as_deref(), Some("Failed"));
    assert!(failed.conditions.iter().any(|c: &Condition| c.reason == "NodeRefused"));
}

#[test]
fn the_last_checkpoint_is_the_newest_by_time_not_by_text() {
    let snap =
        |id: &str, at: &str| WorkspaceSnapshotInfo { id: id.into(), created_at: at.into(), ..Default::default() };
    // As text "…01Z" sorts after "…01.5Z"; as times it is older.
    let snaps = [snap("new", "2026-01-01T00:00:01.5Z"), snap("old", "2026-01-01T00:00:01Z")];
    assert_eq!(workspace::last_checkpoint(&snaps).map(|c| c.snapshot_id), Some("new".into()));
    assert_eq!(workspace::last_checkpoint(&[]), None);
}
