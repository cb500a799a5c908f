//! The IO around the pure plans: kube-runtime controllers for SandboxPool and
//! SandboxClaim, each pass reading the node (ember's HTTP API), taking the
//! planned step and writing the resource's status. Finalizers make deleting a
//! resource remove what it made on the node. The node's state changes without
//! a Kubernetes event (claims, refills), so each pass requeues itself.
use crate::claim::{self, CLAIM_KEY, POOL_KEY};
use crate::crd::{PoolMode, SandboxClaim, SandboxPool, SandboxTemplate, Workspace};
use crate::pool::{self, Desired};
use crate::template::TemplateRef;
use crate::{node_pool_name, Error};
use ember_client::{query, Client as Ember, ClientError};
use ember_types::api::{PoolInfo, SandboxInfo};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{finalizer, Event};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

/// Removes the node pool of a deleted SandboxPool.
pub const POOL_FINALIZER: &str = "ember.run/pool";
/// Removes the sandbox of a deleted SandboxClaim.
pub const CLAIM_FINALIZER: &str = "ember.run/claim";
pub(crate) const MANAGER: &str = "ember-operator";

pub struct Config {
    pub kube: kube::Client,
    /// The ember node's API (`http://host:port`).
    pub ember_url: String,
    pub api_key: Option<String>,
    /// How often a settled resource is read again from the node.
    pub resync: Duration,
    /// Reconcile only while holding this Lease (several replicas, one leader).
    pub leader: Option<Leader>,
    /// Also serve kubernetes-sigs/agent-sandbox's resources (`agents/`).
    pub agent_sandbox: bool,
}

/// The Lease replicas elect their leader on (`lease.rs`).
pub struct Leader {
    pub namespace: String,
    pub name: String,
    /// Unique per replica (hostname and pid).
    pub identity: String,
    pub lease: Duration,
}

pub(crate) struct Ctx {
    pub(crate) kube: kube::Client,
    pub(crate) ember: Ember,
    pub(crate) ember_url: String,
    pub(crate) resync: Duration,
    /// The informer cache of pod-mode pools' Pods (`pods/`).
    pub(crate) pods: Store<Pod>,
    /// Pod-mode claims answered whose ownership patch the cache lacks.
    pub(crate) answered: crate::pods::controller::Answered,
    /// The SandboxPools as the pool controller's watch holds them.
    pub(crate) pools: Store<SandboxPool>,
}

/// Runs both controllers until SIGINT/SIGTERM; with a `leader` Lease, only
/// once it holds it, and returns `LeaseLost` if it stops holding it (the
/// process must then exit: another replica may be reconciling already).
pub async fn run(mut cfg: Config) -> Result<(), Error> {
    let Some(leader) = cfg.leader.take() else { return controllers(cfg).await };
    let elector =
        crate::lease::Elector::new(cfg.kube.clone(), &leader.namespace, &leader.name, &leader.identity, leader.lease);
    tracing::info!(lease = %leader.name, identity = %leader.identity, "waiting for the lease");
    elector.acquire().await?;
    tracing::info!(lease = %leader.name, identity = %leader.identity, "leading");
    tokio::select! {
        r = controllers(cfg) => r,
        lost = elector.keep() => Err(lost),
    }
}

async fn controllers(cfg: Config) -> Result<(), Error> {
    let ember = Ember::new(&cfg.ember_url, cfg.api_key.clone())
        .map_err(|source| Error::Ember { url: cfg.ember_url.clone(), source })?;
    let pools = Controller::new(Api::<SandboxPool>::all(cfg.kube.clone()), watcher::Config::default());
    let (pods, pod_writer) = reflector::store();
    let pod_watch = watcher::Config::default().labels(crate::pods::plan::POOL_LABEL);
    let pod_cache = reflector(pod_writer, watcher(Api::<Pod>::all(cfg.kube.clone()), pod_watch.clone()))
        .default_backoff()
        .for_each(|_| std::future::ready(()));
    let ctx = Arc::new(Ctx {
        kube: cfg.kube.clone(),
        ember,
        ember_url: cfg.ember_url,
        resync: cfg.resync,
        pods,
        answered: Default::default(),
        pools: pools.store(),
    });
    let (agents_kube, agents_ctx) = (cfg.kube.clone(), ctx.clone());
    let agents = async move {
        if cfg.agent_sandbox {
            crate::agents::controller::run_if_served(agents_kube, agents_ctx).await
        }
    };
    // A pod-mode pool's Pods turning Ready (the kubelet's status) wake it;
    // so does the SandboxTemplate it names being accepted or changed.
    let pool_store = pools.store();
    let pools = pools
        .owns(Api::<Pod>::all(cfg.kube.clone()), pod_watch)
        .watches(Api::<SandboxTemplate>::all(cfg.kube.clone()), watcher::Config::default(), move |t| {
            let (ns, name) = (t.namespace(), t.name_any());
            let made_from = pool_store.state().into_iter().filter(|p| p.namespace() == ns && p.spec.template == name);
            made_from.map(|p| ObjectRef::from_obj(&*p)).collect::<Vec<_>>()
        })
        .shutdown_on_signal()
        .run(reconcile_pool, retry, ctx.clone())
        .for_each(|r| async move { log("SandboxPool", r) });
    let claims = Controller::new(Api::<SandboxClaim>::all(cfg.kube.clone()), watcher::Config::default());
    // A claim waiting for its pool (made before it, or in the same apply)
    // is woken by the pool's changes, not left until the next resync.
    let store = claims.store();
    let claims = claims
        .watches(Api::<SandboxPool>::all(cfg.kube.clone()), watcher::Config::default(), move |p: SandboxPool| {
            let (ns, name) = (p.namespace(), p.name_any());
            let waiting = store.state().into_iter().filter(|c| c.namespace() == ns && c.spec.pool_ref == name);
            waiting.map(|c| ObjectRef::from_obj(&*c)).collect::<Vec<_>>()
        })
        .shutdown_on_signal()
        .run(crate::claim_controller::reconcile, retry, ctx.clone())
        .for_each(|r| async move { log("SandboxClaim", r) });
    let sandboxes = Controller::new(Api::<crate::crd::Sandbox>::all(cfg.kube.clone()), watcher::Config::default())
        .shutdown_on_signal()
        .run(crate::sandbox::reconcile, retry, ctx.clone())
        .for_each(|r| async move { log("Sandbox", r) });
    // A template held by a pool is woken when the pool goes (a pool naming
    // no SandboxTemplate, `host`, wakes nothing).
    let templates = Controller::new(Api::<SandboxTemplate>::all(cfg.kube.clone()), watcher::Config::default());
    let template_store = templates.store();
    let templates = templates
        .watches(Api::<SandboxPool>::all(cfg.kube.clone()), watcher::Config::default(), move |p| {
            let named = ObjectRef::new(&p.spec.template).within(&p.namespace().unwrap_or_default());
            template_store.get(&named).is_some().then_some(named)
        })
        .shutdown_on_signal()
        .run(crate::template_controller::reconcile, retry, ctx.clone())
        .for_each(|r| async move { log("SandboxTemplate", r) });
    let workspaces = Controller::new(Api::<Workspace>::all(cfg.kube.clone()), watcher::Config::default())
        .shutdown_on_signal()
        .run(crate::workspace_controller::reconcile, retry, ctx)
        .for_each(|r| async move { log("Workspace", r) });
    tokio::select! {
        _ = async { tokio::join!(pools, claims, sandboxes, templates, workspaces, agents) } => {}
        // The cache's watch retries for ever: it ends only with the process.
        _ = pod_cache => {}
    }
    Ok(())
}

pub(crate) fn log<T: std::fmt::Debug, E: std::fmt::Display>(kind: &str, r: Result<T, E>) {
    match r {
        Ok(o) => tracing::debug!(kind, "reconciled {o:?}"),
        Err(e) => tracing::warn!(kind, "reconcile failed: {e}"),
    }
}

pub(crate) fn retry<K>(_: Arc<K>, e: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!("retrying after: {e}");
    Action::requeue(Duration::from_secs(2))
}

pub(crate) fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

pub(crate) fn ember_err(ctx: &Ctx) -> impl Fn(ClientError) -> Error + '_ {
    move |source| Error::Ember { url: ctx.ember_url.clone(), source }
}

/// The node's answer, with 404 as `None`.
pub(crate) fn found<T>(r: Result<T, ClientError>) -> Result<Option<T>, ClientError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(ClientError::Api { status: 404, .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A 4xx from the node: the request itself is wrong (no such template,
/// bounds refused); retrying it unchanged cannot help, the status says why.
pub(crate) fn refused(e: &ClientError) -> Option<String> {
    match e {
        ClientError::Api { status: 400..=499, code, message } => Some(format!("{code}: {message}")),
        _ => None,
    }
}

pub(crate) async fn labelled(ctx: &Ctx, key: &str, value: &str) -> Result<Vec<SandboxInfo>, Error> {
    let q = query([("metadata", query([(key, value)]).as_str())]);
    ctx.ember.list_sandboxes(&q).await.map_err(ember_err(ctx))
}

pub(crate) async fn patch_status<K>(api: &Api<K>, name: &str, status: impl serde::Serialize) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = Patch::Merge(serde_json::json!({ "status": status }));
    api.patch_status(name, &PatchParams::apply(MANAGER), &patch).await?;
    Ok(())
}

pub(crate) fn finalizer_err<E: std::fmt::Display>(obj: &str) -> impl Fn(E) -> Error + '_ {
    move |e| Error::Finalizer(obj.to_string(), e.to_string())
}

async fn reconcile_pool(obj: Arc<SandboxPool>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let c = &*ctx;
    under_finalizer(
        "SandboxPool",
        POOL_FINALIZER,
        obj,
        c,
        |p, ns, api| async move {
            match p.spec.mode {
                PoolMode::Node => apply_pool(&p, &ns, &api, c).await,
                PoolMode::Pod => crate::pods::controller::apply_pool(&p, &ns, &api, c).await,
            }
        },
        |p, ns| async move {
            match p.spec.mode {
                PoolMode::Node => delete_node_pool(c, &node_pool_name(&ns, &p.name_any())).await,
                PoolMode::Pod => crate::pods::controller::cleanup_pool(&p, &ns, c).await,
            }
        },
    )
    .await
}

/// One pass over a namespaced resource under its finalizer, the skeleton of
/// every controller here: `apply` while it lives (the finalizer added
/// first), `cleanup` once it is being deleted (the finalizer removed when
/// cleanup succeeds, so what it made never outlives it).
pub(crate) async fn under_finalizer<K, A, AF, C, CF>(
    kind: &str,
    name: &str,
    obj: Arc<K>,
    ctx: &Ctx,
    apply: A,
    cleanup: C,
) -> Result<Action, Error>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    A: FnOnce(Arc<K>, String, Api<K>) -> AF,
    AF: std::future::Future<Output = Result<Action, Error>>,
    C: FnOnce(Arc<K>, String) -> CF,
    CF: std::future::Future<Output = Result<Action, Error>>,
{
    let ns = obj.namespace().unwrap_or_default();
    let api: Api<K> = Api::namespaced(ctx.kube.clone(), &ns);
    let key = format!("{kind} {ns}/{}", obj.name_any());
    let (events_api, events_ns) = (api.clone(), ns.clone());
    finalizer(&api, name, obj, move |event| async move {
        match event {
            Event::Apply(o) => apply(o, events_ns, events_api).await,
            Event::Cleanup(o) => cleanup(o, events_ns).await,
        }
    })
    .await
    .map_err(finalizer_err(&key))
}

/// A deleted pool resource's cleanup: its node pool deleted (if still there).
pub(crate) async fn delete_node_pool(ctx: &Ctx, node: &str) -> Result<Action, Error> {
    step_pool(ctx, pool::plan(None, get_pool(ctx, node).await?.as_ref())).await.map_err(ember_err(ctx))?;
    Ok(Action::await_change())
}

/// A deleted claim's cleanup: every node sandbox labelled with its uid removed.
pub(crate) async fn remove_claimed(ctx: &Ctx, uid: &str) -> Result<(), Error> {
    remove_labelled(ctx, CLAIM_KEY, uid).await
}

/// Every node sandbox whose metadata has `key` = `value`, removed.
pub(crate) async fn remove_labelled(ctx: &Ctx, key: &str, value: &str) -> Result<(), Error> {
    for id in claim::plan_cleanup(&labelled(ctx, key, value).await?) {
        found(ctx.ember.delete_sandbox(&id).await).map_err(ember_err(ctx))?;
    }
    Ok(())
}

pub(crate) async fn get_pool(ctx: &Ctx, node: &str) -> Result<Option<PoolInfo>, Error> {
    found(ctx.ember.get_pool(node).await).map_err(ember_err(ctx))
}

pub(crate) async fn step_pool(ctx: &Ctx, action: pool::Action) -> Result<(), ClientError> {
    match action {
        pool::Action::Create(req) => ctx.ember.create_pool(&req).await.map(drop),
        pool::Action::Resize { name, req } => ctx.ember.resize_pool(&name, &req).await.map(drop),
        pool::Action::Delete(name) => found(ctx.ember.delete_pool(&name).await).map(drop),
        pool::Action::Nothing => Ok(()),
    }
}

/// What one pass over a node pool found once the planned step was taken.
pub(crate) enum PoolPass {
    /// The node refused the step (a 4xx: no such template, bounds refused):
    /// the resource's status says why, no hot retry.
    Refused(String),
    /// Made from another template or class: deleted, made anew next pass.
    Replaced,
    /// Not on the node yet (created this pass).
    Pending,
    /// The node's pool as it is now.
    Observed(Box<PoolInfo>),
}

/// The node-pool pass shared by SandboxPool and agent-sandbox's
/// SandboxWarmPool: read the node's pool, take `pool::plan`'s one step
/// toward `desired`, read it again.
pub(crate) async fn drive_pool(ctx: &Ctx, desired: &Desired) -> Result<PoolPass, Error> {
    let action = pool::plan(Some(desired), get_pool(ctx, &desired.name).await?.as_ref());
    let replaced = matches!(action, pool::Action::Delete(_));
    if let Err(e) = step_pool(ctx, action).await {
        return refused(&e).map(PoolPass::Refused).ok_or_else(|| ember_err(ctx)(e));
    }
    if replaced {
        return Ok(PoolPass::Replaced);
    }
    Ok(get_pool(ctx, &desired.name).await?.map_or(PoolPass::Pending, |o| PoolPass::Observed(Box::new(o))))
}

/// When to look again at a pool after a pass: soon while it converges, at
/// the resync once settled (the node refills without a Kubernetes event).
pub(crate) fn requeue_pool(ctx: &Ctx, pass: &PoolPass) -> Action {
    match pass {
        PoolPass::Refused(_) => Action::requeue(ctx.resync),
        PoolPass::Replaced => Action::requeue(Duration::from_millis(200)),
        PoolPass::Pending => Action::requeue(Duration::from_secs(1)),
        PoolPass::Observed(o) if o.idle >= o.sizing.target && o.starting == 0 => Action::requeue(ctx.resync),
        PoolPass::Observed(_) => Action::requeue(Duration::from_millis(500)),
    }
}

async fn apply_pool(p: &SandboxPool, ns: &str, api: &Api<SandboxPool>, ctx: &Ctx) -> Result<Action, Error> {
    let name = p.name_any();
    let node = node_pool_name(ns, &name);
    let mut desired = Desired::from_spec(node.clone(), &p.spec);
    let (pass, reason) = match crate::template_controller::resolve(ctx, ns, &p.spec.template).await? {
        TemplateRef::Node(t) | TemplateRef::Made(t) => {
            desired.template = t;
            (drive_pool(ctx, &desired).await?, "NodeRefused")
        }
        // Woken by the template's watch once ember accepts it.
        TemplateRef::NotReady(why) => (PoolPass::Refused(why), "TemplateNotReady"),
    };
    let mut status = p.status.clone().unwrap_or_default();
    match &pass {
        PoolPass::Refused(why) => {
            let cond = crate::crd::Condition::new("Ready", false, reason, why.clone());
            status.conditions =
                crate::conditions::set(&status.conditions, cond.generation(p.metadata.generation), &now());
        }
        PoolPass::Replaced | PoolPass::Pending => return Ok(requeue_pool(ctx, &pass)),
        PoolPass::Observed(observed) => {
            let claimed = labelled(ctx, POOL_KEY, &node).await?.iter().filter(|s| s.status.state == "Running").count();
            let selector = format!("{POOL_KEY}={node}");
            let generation = p.metadata.generation;
            status = pool::status(p.status.as_ref(), observed, claimed as u32, generation, selector, &now());
        }
    }
    if p.status.as_ref() != Some(&status) {
        patch_status(api, &name, &status).await?;
    }
    Ok(requeue_pool(ctx, &pass))
}
