//! ember's own SandboxTemplate against the live API server and a real node:
//! it becomes an ember template (`k8s-<namespace>-<name>`), its status says
//! whether ember took it (`Ready`, `observedGeneration`), a SandboxPool naming
//! it builds from it and claims come from that pool, a changed spec replaces
//! the node's template, a refused one says why, and deleting it waits while a
//! pool uses it (a condition, no retry loop), then removes the template.
use super::{claim_ready, eventually, Operator};
use ember_operator::crd::{
    Resources, SandboxClaim, SandboxClaimSpec, SandboxPool, SandboxPoolSpec, SandboxTemplate, SandboxTemplateSpec,
    SandboxTemplateStatus,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

fn spec(memory: &str) -> SandboxTemplateSpec {
    SandboxTemplateSpec {
        image: "host".into(),
        resources: Some(Resources { memory: Some(memory.into()), ..Default::default() }),
        runtime_class: None,
        env: [("GREETING".to_string(), "hi".to_string())].into(),
        entrypoint: None,
        user: None,
        workdir: None,
    }
}

/// The status once `Ready` is `ready` for the resource's current generation.
async fn settled(api: &Api<SandboxTemplate>, name: &str, ready: bool) -> SandboxTemplateStatus {
    eventually(&format!("SandboxTemplate {name} Ready={ready}"), 240, || async {
        let t = api.get_status(name).await.map_err(|e| e.to_string())?;
        let st = t.status.clone().unwrap_or_default();
        let cond = st.conditions.iter().find(|c| c.type_ == "Ready");
        let ok = cond.is_some_and(|c| c.is_true() == ready) && st.observed_generation == t.metadata.generation;
        ok.then_some(st.clone()).ok_or_else(|| format!("{st:?}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_resource_becomes_an_ember_template_that_pools_build_from() {
    let (server, kube, daemon) = super::setup().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("operator.log");
    let _operator = Operator::start_logged(&server.kubeconfig, &daemon.url, &[], &log);
    let templates: Api<SandboxTemplate> = Api::namespaced(kube.clone(), "default");
    templates.create(&PostParams::default(), &SandboxTemplate::new("py", spec("256Mi"))).await.expect("accepted");

    let st = settled(&templates, "py", true).await;
    assert_eq!((st.template.as_deref(), st.observed_generation), (Some("k8s-default-py"), Some(1)), "{st:?}");
    let on_node = daemon.client.get_template("k8s-default-py").await.expect("the node has the template");
    assert_eq!((on_node.resources.memory_bytes, on_node.env.get("GREETING")), (256 << 20, Some(&"hi".to_string())));

    // A pool naming it builds from it, and a claim comes from that pool.
    let pools: Api<SandboxPool> = Api::namespaced(kube.clone(), "default");
    let pool = SandboxPool::new("warm", SandboxPoolSpec { template: "py".into(), replicas: 1, ..Default::default() });
    pools.create(&PostParams::default(), &pool).await.expect("SandboxPool accepted");
    let node_pool = ember_operator::node_pool_name("default", "warm");
    eventually("the node pool built from the template, 1 idle", 240, || async {
        let p = daemon.client.get_pool(&node_pool).await.map_err(|e| e.to_string())?;
        (p.template == "k8s-default-py" && p.idle == 1).then_some(()).ok_or_else(|| format!("{p:?}"))
    })
    .await;
    let claims: Api<SandboxClaim> = Api::namespaced(kube.clone(), "default");
    let claim = SandboxClaim::new("c1", SandboxClaimSpec { pool_ref: "warm".into(), timeout_seconds: None });
    claims.create(&PostParams::default(), &claim).await.expect("claim accepted");
    let claimed = claim_ready(&claims, "c1").await;
    assert_eq!(claimed.launch.as_deref(), Some("warm"), "{claimed:?}");
    let id = claimed.sandbox_id.expect("a sandbox");
    let (_, out, _) = daemon.sh(&id, "echo $GREETING", None).await;
    assert_eq!(out.trim(), "hi", "the template's env");

    // A changed spec replaces the node's template.
    let patch = serde_json::json!({ "spec": { "resources": { "memory": "512Mi" } } });
    templates.patch("py", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patched");
    let st = settled(&templates, "py", true).await;
    assert_eq!(st.observed_generation, Some(2));
    let on_node = daemon.client.get_template("k8s-default-py").await.expect("the node has the template");
    assert_eq!(on_node.resources.memory_bytes, 512 << 20);

    // Deleting it waits while the pool builds from it, and says so.
    templates.delete("py", &DeleteParams::default()).await.expect("delete accepted");
    eventually("the deletion held by the pool", 240, || async {
        let st = templates.get_status("py").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        let held = st.conditions.iter().find(|c| c.type_ == "DeletionBlocked");
        held.is_some_and(|c| c.is_true() && c.reason == "InUse" && c.message.contains("warm"))
            .then_some(())
            .ok_or_else(|| format!("{st:?}"))
    })
    .await;
    // Several resyncs (1 s) later: still there, on the node too, and no
    // failure was retried meanwhile.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert!(templates.get("py").await.is_ok(), "the resource waits");
    daemon.client.get_template("k8s-default-py").await.expect("the node keeps the template");
    let text = std::fs::read_to_string(&log).expect("the operator's log");
    let failing: Vec<&str> = text.lines().filter(|l| l.contains("WARN")).collect();
    assert!(failing.is_empty(), "no failure retried while held:\n{}", failing.join("\n"));

    // The pool gone, the template goes (the pool's watch wakes it).
    claims.delete("c1", &DeleteParams::default()).await.expect("delete accepted");
    pools.delete("warm", &DeleteParams::default()).await.expect("delete accepted");
    eventually("the resource and the node's template gone", 240, || async {
        let cr_gone = matches!(templates.get("py").await, Err(kube::Error::Api(e)) if e.code == 404);
        let node = daemon.client.get_template("k8s-default-py").await;
        (cr_gone && node.is_err()).then_some(()).ok_or_else(|| format!("resource gone {cr_gone}, node {node:?}"))
    })
    .await;
}

/// A template ember refuses (a runtime class it does not have) says why and
/// is not retried hot; fixed, it is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_template_says_why_and_is_taken_once_fixed() {
    let (server, kube, daemon) = super::setup().await;
    let _operator = Operator::start(&server.kubeconfig, &daemon.url, &[]);
    let templates: Api<SandboxTemplate> = Api::namespaced(kube.clone(), "default");
    let bad = SandboxTemplateSpec { runtime_class: Some("no-such-class".into()), ..spec("256Mi") };
    templates.create(&PostParams::default(), &SandboxTemplate::new("bad", bad)).await.expect("accepted");
    let st = settled(&templates, "bad", false).await;
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!(ready.reason, "NodeRefused", "{st:?}");
    assert!(ready.message.contains("runtimeClass"), "ember's reason: {}", ready.message);
    assert_eq!(st.template, None);

    // A pool naming it waits for it, then fills once it is fixed.
    let pools: Api<SandboxPool> = Api::namespaced(kube.clone(), "default");
    let pool = SandboxPool::new("warm", SandboxPoolSpec { template: "bad".into(), replicas: 1, ..Default::default() });
    pools.create(&PostParams::default(), &pool).await.expect("SandboxPool accepted");
    eventually("the pool waiting for its template", 240, || async {
        let st = pools.get_status("warm").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        let waiting = st.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == "TemplateNotReady");
        waiting.then_some(()).ok_or_else(|| format!("{st:?}"))
    })
    .await;
    let patch = serde_json::json!({ "spec": { "runtimeClass": null } });
    templates.patch("bad", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patched");
    let st = settled(&templates, "bad", true).await;
    assert_eq!(st.template.as_deref(), Some("k8s-default-bad"));
    let node_pool = ember_operator::node_pool_name("default", "warm");
    eventually("the pool filled from the fixed template", 240, || async {
        let p = daemon.client.get_pool(&node_pool).await.map_err(|e| e.to_string())?;
        (p.template == "k8s-default-bad" && p.idle == 1).then_some(()).ok_or_else(|| format!("{p:?}"))
    })
    .await;
}
