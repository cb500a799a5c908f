//! ember's operator against a live Kubernetes API server (etcd +
//! kube-apiserver from `scripts/kube-test-env.sh`, started per test by
//! `ember_operator::testing`) and a real `ember serve`: the CRDs install and
//! are served, a SandboxPool keeps that many sandboxes warm on the node and
//! reports it, the scale subresource scales it, a SandboxClaim is answered
//! from a warm sandbox and deleting it removes the sandbox (finalizer).
#[path = "k8s/agent_sandbox.rs"]
mod agent_sandbox;
#[path = "k8s/bench.rs"]
mod bench;
#[path = "../../../crates/ember-operator/tests/support/chart.rs"]
mod chart_support;
mod common;
#[path = "k8s/daemonset_nodes.rs"]
mod daemonset_nodes;
#[path = "k8s/lab2.rs"]
mod lab2;
#[path = "../../../crates/ember-cluster/tests/common/mod.rs"]
mod nats;
#[path = "k8s/pod_mode.rs"]
mod pod_mode;
#[path = "k8s/templates.rs"]
mod templates;
#[path = "k8s/without_agent_crds.rs"]
mod without_agent_crds;
#[path = "k8s/workspaces.rs"]
mod workspaces;

use common::Daemon;
use ember_operator::crd::{SandboxClaim, SandboxClaimSpec, SandboxPool, SandboxPoolSpec};
use ember_operator::k8s_openapi::api::coordination::v1::Lease;
use ember_operator::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::Deserialize;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `ember operator` as a process, killed on drop.
struct Operator(Child);

impl Operator {
    fn start(kubeconfig: &std::path::Path, ember_url: &str, extra: &[&str]) -> Operator {
        Operator(Operator::command(kubeconfig, ember_url, extra).spawn().expect("ember operator starts"))
    }

    /// With its log (stderr) written to `log`, for tests that read it.
    fn start_logged(kubeconfig: &std::path::Path, ember_url: &str, extra: &[&str], log: &std::path::Path) -> Operator {
        let file = std::fs::File::create(log).expect("log file");
        let child =
            Operator::command(kubeconfig, ember_url, extra).stderr(file).spawn().expect("ember operator starts");
        Operator(child)
    }

    fn command(kubeconfig: &std::path::Path, ember_url: &str, extra: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
        cmd.arg("operator")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--ember-url", ember_url])
            .args(if extra.contains(&"--resync") { &[][..] } else { &["--resync", "1s"][..] })
            .args(extra)
            .env("EMBER_LOG", "info,kube=warn")
            .stdin(Stdio::null());
        cmd
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `check` every 250 ms until it returns `Some`, for at most `tries`
/// polls; panics with `what` and the last value seen.
async fn eventually<T, F, Fut>(what: &str, tries: u32, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut last = String::new();
    for _ in 0..tries {
        match check().await {
            Ok(v) => return v,
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("{what}: never happened; last seen: {last}");
}

/// ember's CRDs and agent-sandbox's (the operator serves both).
fn all_crds() -> Vec<CustomResourceDefinition> {
    ember_operator::crd::all().into_iter().chain(ember_operator::agents::crd::all()).collect()
}

async fn install_crds(kube: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(kube.clone());
    for crd in all_crds() {
        crds.create(&PostParams::default(), &crd).await.expect("CRD accepted");
    }
    for crd in all_crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        eventually(&format!("CRD {name} Established"), 120, || async {
            let got = crds.get(&name).await.map_err(|e| e.to_string())?;
            let conds = got.status.and_then(|s| s.conditions).unwrap_or_default();
            conds
                .iter()
                .find(|c| c.type_ == "Established" && c.status == "True")
                .map(|_| ())
                .ok_or_else(|| format!("{conds:?}"))
        })
        .await;
    }
}

/// A live API server with ember's CRDs installed, a client of it, and a
/// real `ember serve`.
async fn setup() -> (ember_operator::testing::ApiServer, kube::Client, Daemon) {
    let server = ember_operator::testing::ApiServer::start().await;
    let kube = server.client().await;
    install_crds(&kube).await;
    (server, kube, Daemon::start())
}

async fn claim_ready(claims: &Api<SandboxClaim>, name: &str) -> ember_operator::crd::SandboxClaimStatus {
    eventually(&format!("claim {name} Ready"), 240, || async {
        let st = claims.get_status(name).await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        let ready = st.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(st.clone()).ok_or_else(|| format!("{st:?}"))
    })
    .await
}

async fn create_pool(kube: &kube::Client, replicas: i32) -> Api<SandboxPool> {
    let pools: Api<SandboxPool> = Api::namespaced(kube.clone(), "default");
    let spec = SandboxPoolSpec { template: "host".into(), replicas, ..Default::default() };
    pools.create(&PostParams::default(), &SandboxPool::new("warm", spec)).await.expect("SandboxPool accepted");
    pools
}

async fn wait_idle(daemon: &Daemon, node: &str, idle: u32) {
    eventually(&format!("{idle} idle on the node"), 240, || async {
        let p = daemon.client.get_pool(node).await.map_err(|e| e.to_string())?;
        (p.idle == idle && p.max == idle).then_some(()).ok_or_else(|| format!("{p:?}"))
    })
    .await;
}

/// The Lease's holder and transitions, once someone holds it.
async fn lease_holder(leases: &Api<Lease>) -> Result<(String, i32), String> {
    let l = leases.get("ember-operator").await.map_err(|e| e.to_string())?;
    let spec = l.spec.unwrap_or_default();
    Ok((spec.holder_identity.ok_or("no holder")?, spec.lease_transitions.unwrap_or(0)))
}

/// Two replicas with --leader-elect: one holds the Lease and reconciles;
/// when it is SIGKILLed (no release), the other takes the Lease once it
/// expires and reconciles the next change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_elect_one_leader_and_the_other_takes_over() {
    let (server, kube, daemon) = setup().await;
    let elect = ["--leader-elect", "--lease-duration", "3s"];
    let mut ops = vec![
        Operator::start(&server.kubeconfig, &daemon.url, &elect),
        Operator::start(&server.kubeconfig, &daemon.url, &elect),
    ];
    let leases: Api<Lease> = Api::namespaced(kube.clone(), "default");
    let (first, transitions) = eventually("a leader", 240, || lease_holder(&leases)).await;
    assert_eq!(transitions, 0);
    let pids: Vec<u32> = ops.iter().map(|o| o.0.id()).collect();
    let leader = pids.iter().position(|p| first.ends_with(&format!("-{p}"))).expect("the holder is one of the two");

    let pools = create_pool(&kube, 1).await;
    let node = ember_operator::node_pool_name("default", "warm");
    wait_idle(&daemon, &node, 1).await;

    drop(ops.remove(leader));
    let (second, transitions) = eventually("the other replica leading", 240, || async {
        let (h, t) = lease_holder(&leases).await?;
        (h != first).then_some((h.clone(), t)).ok_or_else(|| format!("still {h}"))
    })
    .await;
    assert!(second.ends_with(&format!("-{}", ops[0].0.id())), "{second}");
    assert_eq!(transitions, 1);
    let scale = serde_json::json!({ "spec": { "replicas": 2 } });
    pools.patch_scale("warm", &PatchParams::default(), &Patch::Merge(&scale)).await.expect("scale accepted");
    wait_idle(&daemon, &node, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_resource_keeps_sandboxes_warm_and_claims_come_from_it() {
    let (server, kube, daemon) = setup().await;
    let _operator = Operator::start(&server.kubeconfig, &daemon.url, &[]);

    let pools: Api<SandboxPool> = Api::namespaced(kube.clone(), "default");
    let pool = SandboxPool::new("warm", SandboxPoolSpec { template: "host".into(), replicas: 2, ..Default::default() });
    pools.create(&PostParams::default(), &pool).await.expect("SandboxPool accepted");
    let node = ember_operator::node_pool_name("default", "warm");

    // The node keeps two warm and the resource says so.
    let status = eventually("2 idle on the node and in the status", 240, || async {
        let on_node = daemon.client.get_pool(&node).await.map_err(|e| e.to_string())?;
        let st = pools.get_status("warm").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        let ready = st.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        (on_node.idle == 2 && st.idle == 2 && st.target == 2 && ready)
            .then_some(st.clone())
            .ok_or_else(|| format!("node idle {}, status {st:?}", on_node.idle))
    })
    .await;
    assert_eq!((status.replicas, status.claimed, status.node_pool.as_str()), (2, 0, node.as_str()));
    // The capacity arithmetic behind the target: the pool's bounds, and the node's λ and W as numbers.
    let cap = &status.capacity;
    assert_eq!((cap.min, cap.max), (0, 2), "{cap:?}");
    assert!(cap.arrival_per_sec >= 0.0 && cap.refill_secs >= 0.0 && cap.in_flight_demand >= 0.0, "{cap:?}");

    // `kubectl scale`: through the scale subresource.
    let scale = serde_json::json!({ "spec": { "replicas": 3 } });
    pools.patch_scale("warm", &PatchParams::default(), &Patch::Merge(&scale)).await.expect("scale accepted");
    eventually("3 idle after scaling", 240, || async {
        let on_node = daemon.client.get_pool(&node).await.map_err(|e| e.to_string())?;
        let sc = pools.get_scale("warm").await.map_err(|e| e.to_string())?;
        let replicas = sc.status.as_ref().map(|s| s.replicas);
        (on_node.idle == 3 && on_node.max == 3 && replicas == Some(3))
            .then_some(())
            .ok_or_else(|| format!("node {}/{} idle/max, scale status {replicas:?}", on_node.idle, on_node.max))
    })
    .await;

    // A claim is answered from a warm sandbox.
    let claims: Api<SandboxClaim> = Api::namespaced(kube.clone(), "default");
    let claim = SandboxClaim::new("c1", SandboxClaimSpec { pool_ref: "warm".into(), timeout_seconds: None });
    claims.create(&PostParams::default(), &claim).await.expect("SandboxClaim accepted");
    let st = claim_ready(&claims, "c1").await;
    let id = st.sandbox_id.clone().expect("the claim names its sandbox");
    assert_eq!(st.launch.as_deref(), Some("warm"), "answered from the pool: {st:?}");
    assert_eq!(st.endpoint, Some(format!("{}/v1/sandboxes/{id}", daemon.url)));
    let sb = daemon.client.get_sandbox(&id).await.expect("the sandbox is on the node");
    assert_eq!(sb.status.state, "Running");
    let uid = claims.get("c1").await.expect("claim").metadata.uid.expect("uid");
    assert_eq!(sb.metadata.get(ember_operator::claim::CLAIM_KEY), Some(&uid));
    eventually("the pool counts the claimed sandbox", 240, || async {
        let st = pools.get_status("warm").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        (st.claimed == 1).then_some(()).ok_or_else(|| format!("{st:?}"))
    })
    .await;

    // Deleting the claim removes its sandbox before the claim goes.
    claims.delete("c1", &DeleteParams::default()).await.expect("delete accepted");
    eventually("the claim gone and its sandbox removed", 240, || async {
        let claim_gone = matches!(claims.get("c1").await, Err(kube::Error::Api(e)) if e.code == 404);
        let sandbox = daemon.client.get_sandbox(&id).await;
        let sandbox_gone = matches!(&sandbox, Err(ember_client::ClientError::Api { status: 404, .. }));
        (claim_gone && sandbox_gone)
            .then_some(())
            .ok_or_else(|| format!("claim gone {claim_gone}, sandbox {sandbox:?}"))
    })
    .await;

    // Deleting the pool resource removes the node's pool.
    pools.delete("warm", &DeleteParams::default()).await.expect("delete accepted");
    eventually("the node pool removed", 240, || async {
        match daemon.client.get_pool(&node).await {
            Err(ember_client::ClientError::Api { status: 404, .. }) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// An operator killed after the node answered a claim but before it wrote
/// the claim's status (here: the sandboxes made on the node while no operator
/// runs, labelled as the operator labels them, one of them a repeated claim)
/// converges when restarted: the claim is bound to the oldest sandbox, the
/// extra one is removed, and no further sandbox is claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_adopts_the_claims_sandbox_instead_of_claiming_again() {
    use ember_operator::claim::{CLAIM_KEY, POOL_KEY};
    let (server, kube, daemon) = setup().await;
    create_pool(&kube, 1).await;
    let node = ember_operator::node_pool_name("default", "warm");
    let claims: Api<SandboxClaim> = Api::namespaced(kube.clone(), "default");
    let claim = SandboxClaim::new("c1", SandboxClaimSpec { pool_ref: "warm".into(), timeout_seconds: None });
    let uid = claims.create(&PostParams::default(), &claim).await.expect("claim").metadata.uid.expect("uid");
    let mut made = Vec::new();
    for _ in 0..2 {
        let s = daemon
            .create(|r| {
                r.metadata = Some([(CLAIM_KEY.to_string(), uid.clone()), (POOL_KEY.to_string(), node.clone())].into());
            })
            .await;
        made.push(s.id);
    }

    let _operator = Operator::start(&server.kubeconfig, &daemon.url, &[]);
    let st = claim_ready(&claims, "c1").await;
    assert_eq!(st.sandbox_id.as_deref(), Some(made[0].as_str()), "bound to the oldest: {st:?}");
    eventually("the repeated claim's sandbox removed", 240, || async {
        match daemon.client.get_sandbox(&made[1]).await {
            Err(ember_client::ClientError::Api { status: 404, .. }) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // The pool was made meanwhile and filled; no further sandbox carries the claim.
    wait_idle(&daemon, &node, 1).await;
    let q = ember_client::query([("metadata", ember_client::query([(CLAIM_KEY, uid.as_str())]).as_str())]);
    let labelled: Vec<String> =
        daemon.client.list_sandboxes(&q).await.expect("list").into_iter().map(|s| s.id).collect();
    assert_eq!(labelled, [made[0].clone()]);
}

/// Every object the chart renders (CRDs included), with the node DaemonSet,
/// the NetworkPolicy, the PodSecurity-labelled namespace and a pool, is
/// accepted by the live API server in a server-side dry run: schema, defaults
/// and validation as a real `kubectl apply --dry-run=server` would check them
/// (nothing is run: there is no kubelet here). What the rest needs to exist
/// first (the CRDs, the namespace) is created for real, as helm would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_charts_objects_pass_a_server_side_dry_run() {
    use kube::api::{DynamicObject, GroupVersionKind};
    let helm = std::env::var_os("EMBER_HELM")
        .unwrap_or_else(|| panic!("EMBER_HELM is not set: run `eval \"$(scripts/kube-test-env.sh)\"` first"));
    // NATS's chart, a dependency, stood in for (its repository is out of reach here).
    let (_dir, chart) = chart_support::with_nats_stub(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    let values =
        ["podSecurity.createNamespace=true", "pools[0].name=py", "pools[0].template=host", "pools[0].replicas=2"];
    let out = Command::new(helm)
        .args(["template", "ember", "--include-crds", "--namespace", "ember-system"])
        .args(values.iter().flat_map(|v| ["--set", v]))
        .arg(&chart)
        .output()
        .expect("helm runs");
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(doc).expect("a YAML document");
        if !value.is_null() {
            objects.push(serde_yaml::from_value::<DynamicObject>(value).expect("a Kubernetes object"));
        }
    }
    let first = |o: &DynamicObject| {
        o.types.as_ref().is_some_and(|t| t.kind == "CustomResourceDefinition" || t.kind == "Namespace")
    };

    let server = ember_operator::testing::ApiServer::start().await;
    let kube = server.client().await;
    let mut kinds = Vec::new();
    for pass in [true, false] {
        let discovery = kube::discovery::Discovery::new(kube.clone()).run().await.expect("discovery");
        let params = PostParams { dry_run: !pass, ..Default::default() };
        for obj in objects.iter().filter(|o| first(o) == pass) {
            let types = obj.types.clone().expect("apiVersion and kind");
            let gvk = GroupVersionKind::try_from(&types).expect("group/version");
            let (ar, caps) = discovery.resolve_gvk(&gvk).unwrap_or_else(|| panic!("{types:?} is not served"));
            let api: Api<DynamicObject> = match caps.scope {
                kube::discovery::Scope::Namespaced => Api::namespaced_with(kube.clone(), "ember-system", &ar),
                kube::discovery::Scope::Cluster => Api::all_with(kube.clone(), &ar),
            };
            if let Err(e) = api.create(&params, obj).await {
                panic!("{} {} refused: {e}", types.kind, obj.metadata.name.clone().unwrap_or_default());
            }
            kinds.push(types.kind);
        }
        if pass {
            wait_established(&kube).await;
        }
    }
    let ns = kube::Api::<ember_operator::k8s_openapi::api::core::v1::Namespace>::all(kube.clone());
    let labels = ns.get("ember-system").await.expect("the namespace").metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("pod-security.kubernetes.io/enforce").map(String::as_str), Some("privileged"));
    kinds.sort();
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "DaemonSet",
            "Deployment",
            "Namespace",
            "NetworkPolicy",
            "Role",
            "RoleBinding",
            "SandboxPool",
            "Service",
            "ServiceAccount"
        ]
    );
}

/// Every CRD on the server Established (served).
async fn wait_established(kube: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(kube.clone());
    eventually("every CRD Established", 120, || async {
        let list = crds.list(&Default::default()).await.map_err(|e| e.to_string())?;
        let pending: Vec<String> = list
            .items
            .iter()
            .filter(|c| {
                let conds = c.status.as_ref().and_then(|s| s.conditions.as_ref());
                !conds.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
            })
            .filter_map(|c| c.metadata.name.clone())
            .collect();
        pending.is_empty().then_some(()).ok_or_else(|| format!("{pending:?}"))
    })
    .await;
}

/// A claim made before its pool (or with it, in one `kubectl apply`) is
/// answered as soon as the node's pool exists, not at the next resync: the
/// claim controller watches SandboxPools. The resync is an hour here and the
/// claim has settled (not Ready, pool missing), so only that watch can wake
/// it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_made_with_its_pool_is_answered_once_the_pool_is_up() {
    let (server, kube, daemon) = setup().await;
    let _operator = Operator::start(&server.kubeconfig, &daemon.url, &["--resync", "1h"]);
    let claims: Api<SandboxClaim> = Api::namespaced(kube.clone(), "default");
    let claim = SandboxClaim::new("c1", SandboxClaimSpec { pool_ref: "warm".into(), timeout_seconds: None });
    claims.create(&PostParams::default(), &claim).await.expect("claim");
    eventually("the claim waiting for its pool", 240, || async {
        let st = claims.get_status("c1").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        let waiting =
            st.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "ClaimFailed");
        waiting.then_some(()).ok_or_else(|| format!("{st:?}"))
    })
    .await;
    create_pool(&kube, 1).await;
    let st = claim_ready(&claims, "c1").await;
    assert!(st.sandbox_id.is_some(), "{st:?}");
}
