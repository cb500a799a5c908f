//! An operator started on an API server without agent-sandbox's CRDs (only
//! ember.run's installed, agent-sandbox's controllers on by default): it
//! serves ember's own resources and says once that agent-sandbox's
//! controllers are off, instead of a watch failing and retrying in a loop.
use super::{eventually, Operator};
use ember_operator::crd::{SandboxPool, SandboxPoolSpec};
use ember_operator::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_agent_sandboxs_crds_the_operator_serves_its_own_and_warns_once() {
    let server = ember_operator::testing::ApiServer::start().await;
    let kube = server.client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(kube.clone());
    for crd in ember_operator::crd::all() {
        crds.create(&PostParams::default(), &crd).await.expect("CRD accepted");
    }
    super::wait_established(&kube).await;
    let daemon = crate::common::Daemon::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("operator.log");
    let _operator = Operator::start_logged(&server.kubeconfig, &daemon.url, &[], &log);

    let pools: Api<SandboxPool> = Api::namespaced(kube.clone(), "default");
    let spec = SandboxPoolSpec { template: "host".into(), replicas: 1, ..Default::default() };
    pools.create(&PostParams::default(), &SandboxPool::new("warm", spec)).await.expect("SandboxPool accepted");
    let node = ember_operator::node_pool_name("default", "warm");
    eventually("the pool Ready with 1 idle", 240, || async {
        let st = pools.get_status("warm").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        let ready = st.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        (ready && st.idle == 1 && st.node_pool == node).then_some(()).ok_or_else(|| format!("{st:?}"))
    })
    .await;
    // Long enough for a failing watch to have retried several times (its
    // backoff starts under a second).
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let text = std::fs::read_to_string(&log).expect("the operator's log");
    let warned: Vec<&str> = text.lines().filter(|l| l.contains("agent-sandbox's CRDs are not installed")).collect();
    assert_eq!(warned.len(), 1, "one warning that agent-sandbox's controllers are off:\n{text}");
    assert!(warned[0].contains("extensions.agents.x-k8s.io/v1beta1 SandboxWarmPool"), "{}", warned[0]);
    let failing: Vec<&str> =
        text.lines().filter(|l| l.contains("WARN") && !l.contains("agent-sandbox's CRDs are not installed")).collect();
    assert!(failing.is_empty(), "no other warning (a failing watch, a failed reconcile):\n{text}");
}
