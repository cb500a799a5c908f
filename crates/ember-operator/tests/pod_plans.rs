//! Pod mode's pure planner (`pods::plan`): observed Pods/PVCs + the desired
//! pool → the actions, the Pod a claim takes, the status.
use ember_operator::crd::{PodPoolSpec, PodWorkspace, Resources};
use ember_operator::pods::plan::{self, Action, Desired, ObservedPod, ObservedPvc, POOL_LABEL};
use std::collections::BTreeSet;

fn desired(replicas: u32, workspace: bool) -> Desired {
    Desired {
        pool: "py".into(),
        namespace: "ns".into(),
        image: "python:3.12-slim".into(),
        replicas,
        runtime_class: Some("gvisor".into()),
        resources: Some(Resources { memory: Some("256Mi".into()), cpu: Some("500m".into()), ..Default::default() }),
        pod: PodPoolSpec {
            command: vec!["sleep".into(), "infinity".into()],
            workspace: workspace.then(|| PodWorkspace { size: "1Gi".into(), storage_class_name: None }),
            port: None,
        },
        owner: None,
    }
}

fn pod(name: &str, ready: bool) -> ObservedPod {
    ObservedPod { name: name.into(), claimed_by: None, ready, ended: false, deleting: false, ip: None }
}

fn pvc(name: &str) -> ObservedPvc {
    ObservedPvc { name: name.into(), deleting: false, claimed: false }
}

fn names(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::CreatePvc(v) => format!("+pvc {}", v.metadata.name.clone().unwrap_or_default()),
            Action::CreatePod(p) => format!("+pod {}", p.metadata.name.clone().unwrap_or_default()),
            Action::DeletePod(n) => format!("-pod {n}"),
            Action::DeletePvc(n) => format!("-pvc {n}"),
        })
        .collect()
}

#[test]
fn an_empty_pool_gets_its_pods_each_with_a_workspace_pvc() {
    let a = plan::plan(Some(&desired(2, true)), &[], &[], &BTreeSet::new());
    assert_eq!(names(&a), ["+pvc py-0", "+pod py-0", "+pvc py-1", "+pod py-1"]);
    let Action::CreatePod(p) = &a[1] else { panic!("{a:?}") };
    let spec = p.spec.as_ref().expect("spec");
    assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
    assert_eq!(spec.automount_service_account_token, Some(false));
    let sc = spec.security_context.as_ref().expect("pod security context");
    assert_eq!(
        (sc.run_as_non_root, sc.seccomp_profile.as_ref().map(|s| s.type_.as_str())),
        (Some(true), Some("RuntimeDefault"))
    );
    let c = &spec.containers[0];
    let csc = c.security_context.as_ref().expect("container security context");
    assert_eq!(csc.allow_privilege_escalation, Some(false));
    assert_eq!(csc.capabilities.as_ref().and_then(|c| c.drop.clone()), Some(vec!["ALL".to_string()]));
    assert_eq!(c.volume_mounts.as_ref().map(|m| m[0].mount_path.as_str()), Some("/workspace"));
    let port = c.ports.as_ref().map(|p| p[0].container_port);
    assert_eq!(port, Some(8888), "agent-sandbox's runtime port when the pool names none");
    let claim = spec.volumes.as_ref().and_then(|v| v[0].persistent_volume_claim.as_ref()).expect("the PVC volume");
    assert_eq!(claim.claim_name, "py-0");
    assert_eq!(p.metadata.labels.as_ref().and_then(|l| l.get(POOL_LABEL)).map(String::as_str), Some("py"));
    let Action::CreatePvc(v) = &a[0] else { panic!("{a:?}") };
    let req = v.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref());
    assert_eq!(req.and_then(|r| r.get("storage")).map(|q| q.0.as_str()), Some("1Gi"));
}

#[test]
fn a_pass_on_a_stale_cache_asks_for_the_same_names_again() {
    // The first pass's creates not yet in the cache: the same names, which
    // the API server answers AlreadyExists (a no-op), never new ones.
    let first = plan::plan(Some(&desired(2, false)), &[], &[], &BTreeSet::new());
    let again = plan::plan(Some(&desired(2, false)), &[], &[], &BTreeSet::new());
    assert_eq!(names(&first), names(&again));
    assert_eq!(names(&first), ["+pod py-0", "+pod py-1"]);
}

#[test]
fn a_pvc_whose_pod_was_lost_gets_its_pod_before_a_new_name_is_taken() {
    let a = plan::plan(Some(&desired(2, true)), &[pod("py-0", true)], &[pvc("py-0"), pvc("py-1")], &BTreeSet::new());
    assert_eq!(names(&a), ["+pod py-1"]);
    // A deleting PVC (held by pvc-protection) keeps its name taken.
    let gone = ObservedPvc { name: "py-1".into(), deleting: true, claimed: false };
    let a = plan::plan(Some(&desired(2, true)), &[pod("py-0", true)], &[pvc("py-0"), gone], &BTreeSet::new());
    assert_eq!(names(&a), ["+pvc py-2", "+pod py-2"]);
    // A claimed sandbox's workspace is never another sandbox's.
    let claimed = ObservedPvc { name: "py-1".into(), deleting: false, claimed: true };
    let a = plan::plan(Some(&desired(2, true)), &[pod("py-0", true)], &[pvc("py-0"), claimed], &BTreeSet::new());
    assert_eq!(names(&a), ["+pvc py-2", "+pod py-2"]);
}

#[test]
fn claimed_and_answered_pods_are_not_warm_and_never_removed() {
    let mut claimed = pod("py-0", true);
    claimed.claimed_by = Some("uid-1".into());
    let pods = [claimed, pod("py-1", true), pod("py-2", false)];
    let answered = BTreeSet::from(["py-1".to_string()]);
    // One warm (py-2) of 2 wanted: a new one; the claimed two stay.
    let a = plan::plan(Some(&desired(2, false)), &pods, &[], &answered);
    assert_eq!(names(&a), ["+pod py-3"]);
    // Scaled to 0 or the pool deleted: only the warm one goes.
    assert_eq!(names(&plan::plan(Some(&desired(0, false)), &pods, &[], &answered)), ["-pod py-2"]);
    assert_eq!(names(&plan::plan(None, &pods, &[], &answered)), ["-pod py-2"]);
}

#[test]
fn scaling_down_removes_the_pods_not_ready_first_with_their_pvcs() {
    let pods = [pod("py-0", true), pod("py-1", false), pod("py-2", true)];
    let pvcs = [pvc("py-0"), pvc("py-1"), pvc("py-2")];
    let a = plan::plan(Some(&desired(1, true)), &pods, &pvcs, &BTreeSet::new());
    assert_eq!(names(&a), ["-pod py-1", "-pvc py-1", "-pod py-2", "-pvc py-2"]);
}

#[test]
fn an_ended_warm_pod_is_replaced_not_restarted() {
    let mut ended = pod("py-0", false);
    ended.ended = true;
    let a = plan::plan(Some(&desired(1, false)), &[ended], &[], &BTreeSet::new());
    assert_eq!(names(&a), ["-pod py-0", "+pod py-1"]);
}

#[test]
fn a_claim_takes_a_ready_warm_pod_only() {
    let mut claimed = pod("py-0", true);
    claimed.claimed_by = Some("uid-1".into());
    let pods = [claimed, pod("py-1", false), pod("py-2", true), pod("py-3", true)];
    assert_eq!(plan::pick(&pods, &BTreeSet::new()).map(|p| p.name.as_str()), Some("py-2"));
    let answered = BTreeSet::from(["py-2".to_string()]);
    assert_eq!(plan::pick(&pods, &answered).map(|p| p.name.as_str()), Some("py-3"));
    let all = BTreeSet::from(["py-2".to_string(), "py-3".to_string()]);
    assert_eq!(plan::pick(&pods, &all), None, "py-1 is not Ready");
}

#[test]
fn the_status_counts_ready_starting_and_claimed_pods() {
    let mut claimed = pod("py-0", true);
    claimed.claimed_by = Some("uid-1".into());
    let pods = [claimed, pod("py-1", true), pod("py-2", false)];
    let st = plan::status(None, &desired(2, false), &pods, &BTreeSet::new(), Some(3), "2026-01-01T00:00:00Z");
    assert_eq!((st.idle, st.starting, st.claimed, st.target, st.replicas), (1, 1, 1, 2, 1));
    assert_eq!(st.selector, "ember.run/pool=py");
    assert_eq!(st.conditions[0].reason, "Filling");
}

#[test]
fn a_claimed_pods_endpoint_is_a_url() {
    assert_eq!(ember_operator::pods::plan::endpoint("10.1.0.7", 8888), "http://10.1.0.7:8888");
    assert_eq!(ember_operator::pods::plan::endpoint("fd00::7", 80), "http://[fd00::7]:80");
}
