//! `ember bench k8s`'s third figure, "agent-sandbox": kubernetes-sigs/
//! agent-sandbox's SandboxClaim (served by ember's operator) created and
//! watched to Ready as its Python client waits, from a SandboxWarmPool of
//! the same size and template as the other figures' pool (agent-sandbox's
//! pools are ember pools of their own, `swp-<namespace>-<name>`). Its claims'
//! status carries no launch kind: the cold ones are counted afterwards from
//! the node (their times stay in the figure, which says how many).
use super::k8s::{self, create_and_watch, timed, wait_filled, wait_until, Claimed, Figure, K8sArgs, LABEL, POOL};
use anyhow::Context;
use ember_client::{query, Client};
use ember_operator::agents::crd::{
    NameRef, SandboxClaim, SandboxClaimSpec, SandboxTemplate, SandboxTemplateSpec, SandboxWarmPool, SandboxWarmPoolSpec,
};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

/// The figure, or `None` when agent-sandbox's CRDs are not installed.
pub(super) async fn run(
    client: &Client,
    kube: &kube::Client,
    idle: u32,
    args: &K8sArgs,
) -> anyhow::Result<Option<Figure>> {
    let templates: Api<SandboxTemplate> = Api::namespaced(kube.clone(), &args.namespace);
    let pod = serde_json::json!({"containers": [{"name": "sandbox", "image": super::pool::TEMPLATE}]});
    let spec = SandboxTemplateSpec::of_pod(pod);
    match templates.create(&PostParams::default(), &SandboxTemplate::new(POOL, spec)).await {
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
        r => drop(r.context("creating the bench's SandboxTemplate")?),
    }
    let pools: Api<SandboxWarmPool> = Api::namespaced(kube.clone(), &args.namespace);
    let spec = SandboxWarmPoolSpec {
        replicas: Some(i32::try_from(idle).unwrap_or(i32::MAX)),
        sandbox_template_ref: NameRef { name: POOL.into() },
        update_strategy: None,
    };
    let made = pools.create(&PostParams::default(), &SandboxWarmPool::new(POOL, spec)).await;
    let res = match made {
        Ok(_) => measure(client, kube, idle, args).await,
        Err(e) => Err(e).context("creating the bench's SandboxWarmPool"),
    };
    let pool_gone = async {
        pools.delete(POOL, &DeleteParams::default()).await?;
        wait_until("the SandboxWarmPool gone", || async { Ok(pools.get_opt(POOL).await?.is_none()) }).await
    }
    .await;
    let template_gone = templates.delete(POOL, &DeleteParams::default()).await;
    let fig = res?;
    pool_gone?;
    template_gone.context("deleting the bench's SandboxTemplate")?;
    Ok(Some(fig))
}

async fn measure(client: &Client, kube: &kube::Client, idle: u32, args: &K8sArgs) -> anyhow::Result<Figure> {
    let node = super::pool::BenchPool { name: ember_operator::agents::controller::node_pool(&args.namespace, POOL) };
    wait_filled(client, &node, idle).await?;
    let claims: Api<SandboxClaim> = Api::namespaced(kube.clone(), &args.namespace);
    let api = claims.clone();
    let outcomes = timed(args, move || claim(api.clone())).await;
    // Counted before the claims go: the sandboxes of the pool that came cold.
    let q = query([("metadata", query([(ember_operator::claim::POOL_KEY, node.name.as_str())]).as_str())]);
    let made = client.list_sandboxes(&q).await.context("listing the claimed sandboxes")?;
    let cold = made.iter().filter(|s| s.launch.as_ref().is_some_and(|l| l.kind != "warm")).count();
    let lp = ListParams::default().labels(&format!("{LABEL}=agent-sandbox"));
    claims.delete_collection(&DeleteParams::default(), &lp).await.context("deleting the bench's claims")?;
    wait_until("the bench's claims gone", || async { Ok(claims.list(&lp).await?.items.is_empty()) }).await?;
    let mut fig = k8s::figure("agent-sandbox", outcomes);
    fig.cold = cold;
    Ok(fig)
}

/// A claim of the bench's warm pool, watched to Ready with a sandbox named,
/// as agent-sandbox's client waits.
async fn claim(claims: Api<SandboxClaim>) -> Claimed {
    let spec = SandboxClaimSpec {
        warm_pool_ref: NameRef { name: POOL.into() },
        lifecycle: None,
        additional_pod_metadata: None,
        env: Vec::new(),
        volume_claim_templates: Vec::new(),
    };
    create_and_watch(&claims, SandboxClaim::new("", spec), "agent-sandbox", |c: SandboxClaim| {
        let st = c.status.unwrap_or_default();
        let ready = st.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        (ready && !st.sandbox.name.is_empty()).then_some(true)
    })
    .await
}
