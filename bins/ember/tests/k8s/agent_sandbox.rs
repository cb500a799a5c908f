//! kubernetes-sigs/agent-sandbox's API served by ember: a SandboxWarmPool
//! keeps an ember pool warm, and agent-sandbox's own Python client
//! (`k8s-agent-sandbox` from PyPI, unchanged) claims from it through the live
//! API server, waits for Ready and runs commands through `ember serve` as its
//! sandbox-router; deleting the claim through the client removes the ember
//! sandbox and the Sandbox resource.
use super::{eventually, setup, Operator};
use ember_operator::agents::controller::node_pool;
use ember_operator::agents::crd::{
    NameRef, Sandbox, SandboxClaim, SandboxTemplate, SandboxTemplateSpec, SandboxWarmPool, SandboxWarmPoolSpec,
};
use ember_types::agent_sandbox::SANDBOX_KEY;
use kube::api::{Api, PostParams};
use std::path::PathBuf;
use std::process::Command;

/// The venv's python with `k8s-agent-sandbox` (scripts/test.sh makes it).
fn python() -> PathBuf {
    let p = std::env::var_os("EMBER_AGENT_SANDBOX_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/agent-sandbox-venv/bin/python")
    });
    assert!(
        p.is_file(),
        "{} missing: python3 -m venv target/agent-sandbox-venv && \
         target/agent-sandbox-venv/bin/pip install k8s-agent-sandbox==1.0.8 (scripts/test.sh does)",
        p.display()
    );
    p
}

fn client(kubeconfig: &std::path::Path, args: &[&str]) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/k8s/agent_sandbox_client.py");
    let out =
        Command::new(python()).arg(script).args(args).env("KUBECONFIG", kubeconfig).output().expect("python runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "client {args:?} failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

async fn warm_pool(kube: &kube::Client, daemon: &crate::common::Daemon) -> String {
    let templates: Api<SandboxTemplate> = Api::namespaced(kube.clone(), "default");
    let pod = serde_json::json!({"containers": [{"name": "python-runtime", "image": "python-runtime-sandbox:latest"}]});
    let mut t = SandboxTemplate::new("python", SandboxTemplateSpec::of_pod(pod));
    // The image names no ember template here: the annotation does.
    t.metadata.annotations = Some([("ember.run/template".to_string(), "host".to_string())].into());
    templates.create(&PostParams::default(), &t).await.expect("SandboxTemplate accepted");
    let pools: Api<SandboxWarmPool> = Api::namespaced(kube.clone(), "default");
    let spec = SandboxWarmPoolSpec {
        replicas: Some(2),
        sandbox_template_ref: NameRef { name: "python".into() },
        update_strategy: None,
    };
    pools.create(&PostParams::default(), &SandboxWarmPool::new("python-pool", spec)).await.expect("warm pool accepted");
    let node = node_pool("default", "python-pool");
    eventually("the warm pool's status: 2 ready", 240, || async {
        let p = pools.get_status("python-pool").await.map_err(|e| e.to_string())?;
        let st = p.status.unwrap_or_default();
        (st.ready_replicas == 2).then_some(()).ok_or_else(|| format!("{st:?}"))
    })
    .await;
    let p = daemon.client.get_pool(&node).await.expect("the node has the pool");
    assert_eq!((p.template.as_str(), p.idle, p.max), ("host", 2, 2));
    node
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sandboxs_python_client_claims_and_runs_commands_through_ember() {
    let (server, kube, daemon) = setup().await;
    let _op = Operator::start(&server.kubeconfig, &daemon.url, &[]);
    let node = warm_pool(&kube, &daemon).await;

    let out = client(&server.kubeconfig, &["claim", &daemon.url, "python-pool"]);
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let claim = got["claim"].as_str().expect("claim name").to_string();
    assert_eq!(got["stdout"], "hello from ember\n", "{got}");
    assert_eq!(got["stderr"], "to stderr\n", "{got}");
    assert_eq!((got["exit_code"].as_i64(), got["failed_exit_code"].as_i64()), (Some(0), Some(3)), "{got}");
    assert_eq!(got["status"], "SandboxReady", "{got}");
    assert_eq!(got["again"], "again\n", "{got}");
    assert_eq!(got["missing_pool"], "WarmPoolNotFound", "{got}");
    // Its file calls: written, read back, listed, tested, and where its commands see it.
    assert_eq!(got["read"], "written by the client", "{got}");
    assert_eq!(got["listed"], serde_json::json!([["hello.txt", "file", 21]]), "{got}");
    assert_eq!(got["exists"], serde_json::json!([true, false]), "{got}");
    assert_eq!(got["seen_by_command"], "written by the client\n", "{got}");
    // The Sandbox the claim names is the claim's, and ember's sandbox behind
    // it came warm from the pool.
    assert_eq!(got["sandbox"].as_str(), Some(claim.as_str()), "{got}");
    let sandboxes: Api<Sandbox> = Api::namespaced(kube.clone(), "default");
    let sb = sandboxes.get(&claim).await.expect("the Sandbox resource exists");
    let id = sb.metadata.annotations.unwrap_or_default().get("ember.run/sandbox-id").cloned().expect("its ember id");
    let info = daemon.client.get_sandbox(&id).await.expect("ember has it");
    assert_eq!(info.metadata.get(SANDBOX_KEY), Some(&claim));
    assert_eq!(info.launch.map(|l| l.kind), Some("warm".to_string()));
    assert_eq!(info.metadata.get("ember.run.pool"), Some(&node));

    client(&server.kubeconfig, &["delete", &daemon.url, &claim]);
    let claims: Api<SandboxClaim> = Api::namespaced(kube.clone(), "default");
    eventually("the claim, its Sandbox and its ember sandbox gone", 240, || async {
        let c = claims.get_opt(&claim).await.map_err(|e| e.to_string())?;
        let s = sandboxes.get_opt(&claim).await.map_err(|e| e.to_string())?;
        let e = daemon.client.get_sandbox(&id).await.ok().filter(|i| i.status.state != "Terminated");
        (c.is_none() && s.is_none() && e.is_none()).then_some(()).ok_or_else(|| format!("{c:?} {s:?} {e:?}"))
    })
    .await;
}

/// A warm pool made before its SandboxTemplate (or in the same apply) is
/// served once the template exists, with a resync of an hour: only the
/// template's watch can wake it, and it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pool_made_before_its_template_fills_once_the_template_exists() {
    let (server, kube, daemon) = setup().await;
    let _op = Operator::start(&server.kubeconfig, &daemon.url, &["--resync", "1h"]);
    let pools: Api<SandboxWarmPool> = Api::namespaced(kube.clone(), "default");
    let spec = SandboxWarmPoolSpec {
        replicas: Some(1),
        sandbox_template_ref: NameRef { name: "late".into() },
        update_strategy: None,
    };
    pools.create(&PostParams::default(), &SandboxWarmPool::new("early", spec)).await.expect("warm pool accepted");
    eventually("the warm pool waiting for its template", 240, || async {
        let st = pools.get_status("early").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        let waiting = st.conditions.iter().any(|c| c.reason == "TemplateNotFound");
        waiting.then_some(()).ok_or_else(|| format!("{st:?}"))
    })
    .await;
    let templates: Api<SandboxTemplate> = Api::namespaced(kube.clone(), "default");
    let pod = serde_json::json!({"containers": [{"name": "c", "image": "host"}]});
    templates
        .create(&PostParams::default(), &SandboxTemplate::new("late", SandboxTemplateSpec::of_pod(pod)))
        .await
        .expect("template");
    eventually("the warm pool served", 240, || async {
        let st = pools.get_status("early").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        (st.ready_replicas == 1).then_some(()).ok_or_else(|| format!("{st:?}"))
    })
    .await;
    let p = daemon.client.get_pool(&node_pool("default", "early")).await.expect("the node pool");
    assert_eq!((p.template.as_str(), p.idle), ("host", 1));
}

/// A claim's `env` and `volumeClaimTemplates` under its template's policies
/// (`Overrides`, `Allowed`), through agent-sandbox's client: the template's
/// env, the claim's (one overriding the template's), the template's volume
/// and the claim's each an ember workspace mounted where the template's
/// container mounts it, the claim still answered warm; deleting the claim
/// deletes its workspaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claims_env_and_volumes_reach_its_sandbox() {
    let (server, kube, daemon) = setup().await;
    let _op = Operator::start(&server.kubeconfig, &daemon.url, &[]);
    let templates: Api<SandboxTemplate> = Api::namespaced(kube.clone(), "default");
    let pod = serde_json::json!({"containers": [{"name": "c", "image": "host",
        "env": [{"name": "A", "value": "from-template"}, {"name": "T", "value": "t"}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "scratch", "mountPath": "/scratch"}]}]});
    let mut spec = SandboxTemplateSpec::of_pod(pod);
    spec.blueprint.volume_claim_templates = vec![
        serde_json::json!({"metadata": {"name": "data"}, "spec": {"resources": {"requests": {"storage": "64Mi"}}}}),
    ];
    spec.env_vars_injection_policy = Some("Overrides".into());
    spec.volume_claim_templates_policy = Some("Allowed".into());
    templates.create(&PostParams::default(), &SandboxTemplate::new("withvol", spec)).await.expect("template");
    let pools: Api<SandboxWarmPool> = Api::namespaced(kube.clone(), "default");
    let wp = SandboxWarmPoolSpec {
        replicas: Some(1),
        sandbox_template_ref: NameRef { name: "withvol".into() },
        update_strategy: None,
    };
    pools.create(&PostParams::default(), &SandboxWarmPool::new("vol-pool", wp)).await.expect("warm pool");
    eventually("the warm pool ready", 240, || async {
        let st = pools.get_status("vol-pool").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        (st.ready_replicas == 1).then_some(()).ok_or_else(|| format!("{st:?}"))
    })
    .await;

    let out = client(&server.kubeconfig, &["extras", &daemon.url, "vol-pool"]);
    let got: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(got["stdout"], "from-claim b t\n/data mounted\n/scratch mounted\n", "{got}");
    let claim = got["claim"].as_str().expect("claim").to_string();
    let data = ember_operator::agents::extras::workspace_name("default", &claim, "data");
    let scratch = ember_operator::agents::extras::workspace_name("default", &claim, "scratch");
    let ws = daemon.client.get_workspace(&scratch).await.expect("the claim's volume is an ember workspace");
    assert_eq!(ws.size_bytes, 32 << 20);
    let sb = Api::<Sandbox>::namespaced(kube.clone(), "default").get(&claim).await.expect("Sandbox");
    let id = sb.metadata.annotations.unwrap_or_default().get("ember.run/sandbox-id").cloned().expect("ember id");
    let info = daemon.client.get_sandbox(&id).await.expect("ember has it");
    assert_eq!(info.launch.map(|l| l.kind), Some("warm".to_string()), "env and volumes bound at a warm claim");

    client(&server.kubeconfig, &["delete", &daemon.url, &claim]);
    eventually("the claim's workspaces deleted", 240, || async {
        let left: Vec<String> =
            daemon.client.list_workspaces().await.map_err(|e| e.to_string())?.into_iter().map(|w| w.name).collect();
        (!left.contains(&data) && !left.contains(&scratch)).then_some(()).ok_or_else(|| format!("{left:?}"))
    })
    .await;
}
