//! The nodes as the chart's DaemonSet runs them (its `ember serve` flags in
//! deploy/helm/ember/templates/node.yaml: `--cluster=<NATS>`, `--node`,
//! `--snapshot-store=nats`, `--snapshot-key-file`; as processes, no kubelet
//! here), two of them on one NATS cluster, the operator talking to one of them as
//! to the chart's Service: a SandboxPool keeps its sandboxes warm across the
//! cluster and reports them, a SandboxClaim is answered warm, and a claim
//! through the other node's API (never the Kubernetes API) is warm too.
use super::{claim_ready, eventually, Operator};
use crate::common::Daemon;
use ember_operator::crd::{SandboxClaim, SandboxClaimSpec, SandboxPool, SandboxPoolSpec};
use ember_types::api::CreateSandboxRequest;
use kube::api::{Api, PostParams};

fn node(nats: &crate::nats::NatsCluster, name: &str) -> Daemon {
    let key = nats.dir.join("snapshot.key");
    ember_snapshot::ManifestKey::load_or_create(&key).expect("the cluster's manifest key");
    let urls = nats.urls().join(",");
    let key = key.to_str().expect("a UTF-8 temp path");
    Daemon::start_with(&["--cluster", &urls, "--node", name, "--snapshot-store", "nats", "--snapshot-key-file", key])
}

#[test]
fn daemonset_nodes_keep_the_pool_warm_and_claims_go_around_kubernetes() {
    // NATS's harness blocks on its own runtime: started outside the test's.
    let nats = crate::nats::NatsCluster::start("k8s-nodes", 3);
    let (a, b) = (node(&nats, "a"), node(&nats, "b"));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(the_operator_drives_them(&a, &b));
}

async fn the_operator_drives_them(a: &Daemon, b: &Daemon) {
    let server = ember_operator::testing::ApiServer::start().await;
    let kube = server.client().await;
    super::install_crds(&kube).await;
    let _operator = Operator::start(&server.kubeconfig, &a.url, &[]);

    let pools: Api<SandboxPool> = Api::namespaced(kube.clone(), "default");
    let spec = SandboxPoolSpec { template: "host".into(), replicas: 2, ..Default::default() };
    pools.create(&PostParams::default(), &SandboxPool::new("warm", spec)).await.expect("SandboxPool accepted");
    let pool = ember_operator::node_pool_name("default", "warm");
    eventually("2 idle across the cluster, in the status and through the other node", 480, || async {
        let st = pools.get_status("warm").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        let other = b.client.get_pool(&pool).await.map_err(|e| e.to_string())?;
        (st.idle == 2 && other.idle == 2 && other.starting == 0)
            .then_some(())
            .ok_or_else(|| format!("status {st:?}, through b {other:?}"))
    })
    .await;

    let claims: Api<SandboxClaim> = Api::namespaced(kube.clone(), "default");
    let claim = SandboxClaim::new("c1", SandboxClaimSpec { pool_ref: "warm".into(), timeout_seconds: None });
    claims.create(&PostParams::default(), &claim).await.expect("claim accepted");
    let st = claim_ready(&claims, "c1").await;
    assert_eq!(st.launch.as_deref(), Some("warm"), "{st:?}");

    // Through b's API: a poolRef create, the Kubernetes API not on its path.
    let req = CreateSandboxRequest {
        template: Some("host".into()),
        extensions: Some([("poolRef".to_string(), pool.clone())].into()),
        ..Default::default()
    };
    let (direct, _) = b.client.create_sandbox(&req).await.expect("a claim through b");
    assert_eq!(direct.launch.map(|l| l.kind), Some("warm".to_string()));
}
