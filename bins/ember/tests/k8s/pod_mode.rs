//! Pod mode against the live API server: a SandboxPool with `mode: pod`
//! becomes warm Pods (the pool's runtimeClassName, a security context the
//! namespace's PodSecurity `restricted` level admits, the pool's labels) and
//! a workspace PVC each, all accepted by the API server for real. No kubelet
//! runs here, so no Pod ever runs: the test sets a Pod's status Ready through
//! the status subresource, standing in for the kubelet, and the test makes
//! the namespace's `default` ServiceAccount (the controller manager's job).
//! A claim is answered with that Pod from the operator's informer cache, the
//! ownership patch lands after the answer, and deleting the claim deletes the
//! Pod (the claim's finalizer). No ember node is involved: the operator's
//! `--ember-url` points at nothing.
use super::{eventually, install_crds, Operator};
use ember_operator::crd::{
    PodPoolSpec, PodWorkspace, PoolMode, Resources, SandboxClaim, SandboxClaimSpec, SandboxPool, SandboxPoolSpec,
};
use ember_operator::k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, ServiceAccount};
use ember_operator::k8s_openapi::api::node::v1::RuntimeClass;
use ember_operator::pods::plan::{CLAIM_LABEL, POOL_LABEL};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;

const NS: &str = "sandboxes";

async fn namespace_and_runtime_class(kube: &kube::Client) {
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": NS, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}
    }))
    .expect("namespace");
    Api::<Namespace>::all(kube.clone()).create(&PostParams::default(), &ns).await.expect("namespace created");
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}})).expect("sa");
    Api::<ServiceAccount>::namespaced(kube.clone(), NS).create(&PostParams::default(), &sa).await.expect("sa");
    let rc: RuntimeClass =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "gvisor"}, "handler": "runsc"})).expect("rc");
    Api::<RuntimeClass>::all(kube.clone()).create(&PostParams::default(), &rc).await.expect("RuntimeClass");
}

fn pool_spec(replicas: i32) -> SandboxPoolSpec {
    SandboxPoolSpec {
        template: "python:3.12-slim".into(),
        replicas,
        resources: Some(Resources { memory: Some("256Mi".into()), cpu: Some("500m".into()), ..Default::default() }),
        runtime_class: Some("gvisor".into()),
        mode: PoolMode::Pod,
        pod: Some(PodPoolSpec {
            command: vec!["sleep".into(), "infinity".into()],
            workspace: Some(PodWorkspace { size: "1Gi".into(), storage_class_name: None }),
            port: Some(8080),
        }),
    }
}

async fn pool_pods(pods: &Api<Pod>) -> Result<Vec<Pod>, String> {
    let lp = ListParams::default().labels(&format!("{POOL_LABEL}=py"));
    Ok(pods.list(&lp).await.map_err(|e| e.to_string())?.items)
}

fn rv(o: &impl ResourceExt) -> u64 {
    // etcd's revision, global to every object: writes compare in time.
    o.resource_version().and_then(|v| v.parse().ok()).expect("a numeric resourceVersion (etcd)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_mode_keeps_warm_pods_and_a_claim_takes_a_ready_one() {
    let server = ember_operator::testing::ApiServer::start().await;
    let kube = server.client().await;
    install_crds(&kube).await;
    namespace_and_runtime_class(&kube).await;
    let _operator = Operator::start(&server.kubeconfig, "http://127.0.0.1:9", &[]);
    let pools: Api<SandboxPool> = Api::namespaced(kube.clone(), NS);
    pools.create(&PostParams::default(), &SandboxPool::new("py", pool_spec(2))).await.expect("SandboxPool accepted");
    let (pods, pvcs): (Api<Pod>, Api<PersistentVolumeClaim>) =
        (Api::namespaced(kube.clone(), NS), Api::namespaced(kube.clone(), NS));

    // Two warm Pods and their PVCs, made as objects the server accepted.
    let made = eventually("2 warm Pods", 240, || async {
        let got = pool_pods(&pods).await?;
        let names: Vec<String> = got.iter().map(|p| p.name_any()).collect();
        (names == ["py-0", "py-1"]).then_some(got).ok_or_else(|| format!("{names:?}"))
    })
    .await;
    for p in &made {
        let spec = p.spec.clone().expect("spec");
        assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(spec.containers[0].image.as_deref(), Some("python:3.12-slim"));
        let sc = spec.security_context.clone().expect("security context");
        assert_eq!((sc.run_as_non_root, sc.run_as_user), (Some(true), Some(65532)));
        let owner = p.owner_references().first().map(|o| (o.kind.clone(), o.name.clone()));
        assert_eq!(owner, Some(("SandboxPool".into(), "py".into())));
        let pvc = pvcs.get(&p.name_any()).await.expect("its workspace PVC");
        assert_eq!(pvc.labels().get(POOL_LABEL).map(String::as_str), Some("py"));
    }
    eventually("the pool says 2 starting, none Ready", 240, || async {
        let st = pools.get_status("py").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        (st.starting == 2 && st.idle == 0 && st.target == 2).then_some(()).ok_or_else(|| format!("{st:?}"))
    })
    .await;

    // A claim while no Pod is Ready waits; py-1 turned Ready answers it.
    let claims: Api<SandboxClaim> = Api::namespaced(kube.clone(), NS);
    let claim = SandboxClaim::new("c1", SandboxClaimSpec { pool_ref: "py".into(), timeout_seconds: None });
    let uid = claims.create(&PostParams::default(), &claim).await.expect("claim").uid().expect("uid");
    eventually("the claim waiting for a Ready Pod", 240, || async {
        let st = claims.get_status("c1").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        st.conditions.iter().any(|c| c.reason == "NoWarmPod").then_some(()).ok_or_else(|| format!("{st:?}"))
    })
    .await;
    let ready = serde_json::json!({"status": {"phase": "Running", "podIP": "10.1.0.7",
        "conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status("py-1", &PatchParams::default(), &Patch::Merge(&ready)).await.expect("the kubelet's stand-in");
    let st = super::claim_ready(&claims, "c1").await;
    assert_eq!(st.sandbox_id.as_deref(), Some("py-1"), "the Ready Pod: {st:?}");
    // The Pod's server as a base URL, as a client (agent-sandbox's direct connection) takes it.
    assert_eq!((st.endpoint.as_deref(), st.launch.as_deref()), (Some("http://10.1.0.7:8080"), Some("warm")));

    // The ownership patch, after the answer.
    let owned = eventually("py-1 labelled and owned by the claim", 240, || async {
        let p = pods.get("py-1").await.map_err(|e| e.to_string())?;
        let owner = p.owner_references().first().map(|o| o.uid.clone());
        (p.labels().get(CLAIM_LABEL) == Some(&uid) && owner.as_ref() == Some(&uid))
            .then_some(p.clone())
            .ok_or_else(|| format!("{:?} {owner:?}", p.labels()))
    })
    .await;
    let answered = claims.get("c1").await.expect("claim");
    assert!(
        rv(&answered) < rv(&owned),
        "the claim's answer ({}) was written before the Pod's patch ({})",
        rv(&answered),
        rv(&owned)
    );
    let pvc = pvcs.get("py-1").await.expect("py-1's PVC");
    assert_eq!(pvc.labels().get(CLAIM_LABEL), Some(&uid));

    // The pool refills: py-1 is the claim's, a new warm Pod takes its place.
    eventually("the pool counts the claim and refills", 240, || async {
        let st = pools.get_status("py").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        let names: Vec<String> = pool_pods(&pods).await?.iter().map(|p| p.name_any()).collect();
        (st.claimed == 1 && names == ["py-0", "py-1", "py-2"]).then_some(()).ok_or_else(|| format!("{names:?} {st:?}"))
    })
    .await;

    // Deleting the claim deletes its Pod and its PVC (the finalizer).
    claims.delete("c1", &DeleteParams::default()).await.expect("delete accepted");
    eventually("the claim gone with its Pod", 240, || async {
        let claim_gone = matches!(claims.get("c1").await, Err(kube::Error::Api(e)) if e.code == 404);
        let pod_gone = matches!(pods.get("py-1").await, Err(kube::Error::Api(e)) if e.code == 404);
        // No controller manager removes pvc-protection's finalizer here:
        // the PVC stays Terminating, deleted as far as the API goes.
        let pvc_deleted = match pvcs.get("py-1").await {
            Ok(v) => v.metadata.deletion_timestamp.is_some(),
            Err(kube::Error::Api(e)) => e.code == 404,
            Err(_) => false,
        };
        (claim_gone && pod_gone && pvc_deleted)
            .then_some(())
            .ok_or_else(|| format!("{claim_gone} {pod_gone} {pvc_deleted}"))
    })
    .await;
}
