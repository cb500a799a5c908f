//! `ember bench k8s [--kubeconfig FILE]`: claim → Ready through the
//! Kubernetes API beside the same claims through ember's API, from one pool.
//!
//! The bench makes a SandboxPool (`ember.run`) of `--idle` replicas, which
//! the running `ember operator` (against the same API server and this node)
//! turns into the node pool `k8s-<namespace>-ember-bench-k8s`. Two figures,
//! each from a full, quiet pool, timed the same way (one function, from the
//! request sent to the answer seen, in the client):
//! - "kubernetes": a SandboxClaim created, then watched from the create's
//!   resourceVersion (as agent-sandbox's client waits) until `Ready=True`;
//!   its cost is the operator's reconcile, the node's claim and the status
//!   write and watch on the API server;
//! - "ember API": `POST /v1/sandboxes` with the node pool as `poolRef`.
//!
//! Between figures the claims are deleted (their finalizers remove the
//! sandboxes) and the sandboxes removed, untimed. The host's load average is
//! printed before and after: the figures are this machine's at that load.
use super::stats::{Series, Summary};
use anyhow::Context;
use ember_client::Client;
use ember_operator::crd::{SandboxClaim, SandboxClaimSpec, SandboxPool, SandboxPoolSpec};
use ember_types::api::CreateSandboxRequest;
use futures_util::{StreamExt, TryStreamExt};
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use serde::Serialize;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

pub(super) const POOL: &str = "ember-bench-k8s";
/// The label on the bench's claims, to delete them together.
pub(crate) const LABEL: &str = "ember.run/bench";
/// How long one claim may take to be Ready before it counts as failed.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(clap::Args, Debug, Clone)]
pub struct K8sArgs {
    /// A kubeconfig file; without it, the in-cluster config or $KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of the pool and the claims.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Claims per figure.
    #[arg(long, default_value_t = 50)]
    pub claims: usize,
    /// Concurrent claiming tasks.
    #[arg(long, default_value_t = 4)]
    pub tasks: usize,
    /// The pool's idle target (default: --claims, so a figure misses only
    /// when refills lag).
    #[arg(long)]
    pub idle: Option<u32>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Figure {
    through: &'static str,
    ready: Summary,
    pub(super) cold: usize,
    failed: usize,
}

/// One claim: its sandbox or claim name, and whether it came warm.
pub(crate) type Claimed = Result<(String, bool), String>;

pub async fn run(client: &Client, args: K8sArgs) -> anyhow::Result<i32> {
    if args.claims == 0 || args.tasks == 0 {
        anyhow::bail!("--claims and --tasks must not be zero");
    }
    let kube = crate::commands::operator::kube_client(args.kubeconfig.as_deref()).await?;
    let idle = args.idle.unwrap_or(u32::try_from(args.claims).unwrap_or(u32::MAX));
    let load_before = loadavg();
    let pools: Api<SandboxPool> = Api::namespaced(kube.clone(), &args.namespace);
    let spec = SandboxPoolSpec {
        template: super::pool::TEMPLATE.into(),
        replicas: i32::try_from(idle).unwrap_or(i32::MAX),
        ..Default::default()
    };
    pools
        .create(&PostParams::default(), &SandboxPool::new(POOL, spec))
        .await
        .with_context(|| format!("creating SandboxPool {}/{POOL}", args.namespace))?;
    let node = super::pool::BenchPool { name: ember_operator::node_pool_name(&args.namespace, POOL) };
    let res = super::pool::interruptible(figures(client, &kube, &node, idle, &args)).await;
    let removed = delete_pool(&pools).await;
    let figs = res?;
    removed.with_context(|| format!("deleting SandboxPool {}/{POOL}", args.namespace))?;
    let load_after = loadavg();
    if args.json {
        let out = serde_json::json!({
            "claims": args.claims, "tasks": args.tasks, "idle": idle,
            "loadBefore": load_before, "loadAfter": load_after, "figures": figs,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "\nember bench k8s: {} claims per figure, {} tasks, a pool of {idle} (node pool {})",
            args.claims, args.tasks, node.name
        );
        println!("load average before: {load_before}; after: {load_after}");
        println!("{:<12} {:>10} {:>10} {:>10} {:>6} {:>7}", "through", "p50", "p99", "max", "cold", "failed");
        let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}ms"));
        for f in &figs {
            let r = &f.ready;
            println!(
                "{:<12} {:>10} {:>10} {:>10} {:>6} {:>7}",
                f.through,
                ms(r.p50_ms),
                ms(r.p99_ms),
                ms(r.max_ms),
                f.cold,
                f.failed
            );
        }
    }
    Ok(i32::from(figs.iter().any(|f| f.failed > 0)))
}

/// `/proc/loadavg`'s three averages.
pub(crate) fn loadavg() -> String {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

async fn figures(
    client: &Client,
    kube: &kube::Client,
    node: &super::pool::BenchPool,
    idle: u32,
    args: &K8sArgs,
) -> anyhow::Result<Vec<Figure>> {
    let claims: Api<SandboxClaim> = Api::namespaced(kube.clone(), &args.namespace);
    // The operator makes the node pool from the SandboxPool: wait for it to be there.
    wait_filled(client, node, idle).await?;
    let api = claims.clone();
    let k8s = timed(args, move || claim_through_kubernetes(api.clone())).await;
    let gone = delete_claims(&claims).await;
    node.wait_full(client, idle).await?;
    gone?;
    let req = CreateSandboxRequest {
        template: Some(super::pool::TEMPLATE.into()),
        extensions: Some([("poolRef".to_string(), node.name.clone())].into()),
        ..Default::default()
    };
    let ember_client = client.clone();
    let ember = timed(args, move || {
        let (client, req) = (ember_client.clone(), req.clone());
        async move {
            let (s, _) = client.create_sandbox(&req).await.map_err(|e| e.to_string())?;
            Ok((s.id.clone(), s.launch.is_some_and(|l| l.kind == "warm")))
        }
    })
    .await;
    let ids = ember.1.iter().filter_map(|r| r.as_ref().ok()).map(|(id, _)| id.clone()).collect();
    let left = super::pool::remove_all(client, ids).await;
    if !left.is_empty() {
        eprintln!("could not remove {} claimed sandboxes: {left:?}", left.len());
    }
    let mut out = vec![figure("kubernetes", k8s), figure("ember API", ember)];
    match super::k8s_agents::run(client, kube, idle, args).await? {
        Some(f) => out.push(f),
        None => eprintln!("agent-sandbox: not measured (its CRDs are not installed)"),
    }
    Ok(out)
}

pub(super) fn figure(through: &'static str, (mut series, outcomes): (Series, Vec<Claimed>)) -> Figure {
    let (mut cold, mut failed) = (0, 0);
    for o in outcomes {
        match o {
            Ok((_, false)) => cold += 1,
            Ok(_) => {}
            Err(e) => {
                failed += 1;
                series.fail(e);
            }
        }
    }
    Figure { through, ready: series.summary(), cold, failed }
}

/// `args.claims` claims by `args.tasks` tasks, each timed from before `claim`
/// is called to its answer: the warm ones' times, and every outcome.
pub(super) async fn timed<F, Fut>(args: &K8sArgs, claim: F) -> (Series, Vec<Claimed>)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Claimed> + Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    for _ in 0..args.tasks {
        let (next, claim, total) = (next.clone(), claim.clone(), args.claims);
        set.spawn(async move {
            let mut got = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < total {
                let t0 = Instant::now();
                let r = claim().await;
                got.push((t0.elapsed(), r));
            }
            got
        });
    }
    let (mut series, mut outcomes) = (Series::default(), Vec::new());
    while let Some(r) = set.join_next().await {
        for (took, r) in r.unwrap_or_default() {
            if matches!(r, Ok((_, true))) {
                series.push(took);
            }
            outcomes.push(r);
        }
    }
    (series, outcomes)
}

/// A SandboxClaim of the bench's pool, watched to `Ready=True`.
async fn claim_through_kubernetes(claims: Api<SandboxClaim>) -> Claimed {
    let c = SandboxClaim::new("", SandboxClaimSpec { pool_ref: POOL.into(), timeout_seconds: None });
    create_and_watch(&claims, c, "k8s", |c: SandboxClaim| {
        let st = c.status.unwrap_or_default();
        let ready = st.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then(|| st.launch.as_deref() == Some("warm"))
    })
    .await
}

/// Creates `obj` under a generated name with the bench's `label`, then
/// watches it from the create's resourceVersion (as agent-sandbox's client
/// waits for its claims) until `ready` answers (whether it came warm).
pub(crate) async fn create_and_watch<K, F>(api: &Api<K>, mut obj: K, label: &str, ready: F) -> Claimed
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(K) -> Option<bool>,
{
    let meta = obj.meta_mut();
    meta.name = None;
    meta.generate_name = Some("bench-".into());
    meta.labels = Some([(LABEL.to_string(), label.to_string())].into());
    let made = api.create(&PostParams::default(), &obj).await.map_err(|e| format!("create: {e}"))?;
    let name = made.meta().name.clone().unwrap_or_default();
    let rv = made.meta().resource_version.clone().unwrap_or_default();
    let wp = WatchParams::default().fields(&format!("metadata.name={name}")).timeout(READY_TIMEOUT.as_secs() as u32);
    let mut events = api.watch(&wp, &rv).await.map_err(|e| format!("watch {name}: {e}"))?.boxed();
    while let Some(ev) = events.try_next().await.map_err(|e| format!("watch {name}: {e}"))? {
        let (WatchEvent::Added(o) | WatchEvent::Modified(o)) = ev else { continue };
        if let Some(warm) = ready(o) {
            return Ok((name, warm));
        }
    }
    Err(format!("{name} not Ready within {READY_TIMEOUT:?}"))
}

/// Deletes the bench's claims and waits until their finalizers have removed
/// their sandboxes and the claims are gone.
async fn delete_claims(claims: &Api<SandboxClaim>) -> anyhow::Result<()> {
    let lp = ListParams::default().labels(&format!("{LABEL}=k8s"));
    claims.delete_collection(&DeleteParams::default(), &lp).await.context("deleting the bench's claims")?;
    wait_until("the bench's claims gone", || async { Ok(claims.list(&lp).await?.items.is_empty()) }).await
}

/// Deletes the bench's SandboxPool and waits until its finalizer has deleted
/// the node pool and the resource is gone.
async fn delete_pool(pools: &Api<SandboxPool>) -> anyhow::Result<()> {
    pools.delete(POOL, &DeleteParams::default()).await?;
    wait_until("the SandboxPool gone", || async { Ok(pools.get_opt(POOL).await?.is_none()) }).await
}

/// Polls `done` every 100 ms until it holds; fails after [`READY_TIMEOUT`]
/// naming `what` (these waits are the operator's: it may not be running).
pub(crate) async fn wait_until<F, Fut>(what: &str, done: F) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + READY_TIMEOUT;
    while !done().await? {
        if Instant::now() > deadline {
            anyhow::bail!("{what}: not within {READY_TIMEOUT:?}; is `ember operator` running?");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The node pool the operator makes from a pool resource, there and full.
pub(super) async fn wait_filled(client: &Client, node: &super::pool::BenchPool, idle: u32) -> anyhow::Result<()> {
    let what = format!("node pool {}", node.name);
    wait_until(&what, || async { Ok(client.get_pool(&node.name).await.is_ok()) }).await?;
    node.wait_full(client, idle).await.map(drop)
}
