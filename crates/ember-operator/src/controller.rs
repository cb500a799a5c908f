//! The IO around the pure plans: kube-runtime controllers for SandboxPool and
//! SandboxClaim, each pass reading the node (ember's HTTP API), taking the
//! planned step and writing the resource's status. Finalizers make deleting a
//! resource remove what it made on the node. The node's state changes without
//! a Kubernetes event (claims, refills), so each pass requeues itself.
use crate::claim::{self, Apply, CLAIM_KEY, POOL_KEY};
use crate::crd::{SandboxClaim, SandboxPool};
use crate::pool::{self, Desired};
use crate::{node_pool_name, Error};
use ember_client::{query, Client as Ember, ClientError};
use ember_types::api::{CreateSandboxRequest, PoolInfo, SandboxInfo};
use futures_util::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{finalizer, Event};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
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
    let ctx = Arc::new(Ctx { kube: cfg.kube.clone(), ember, ember_url: cfg.ember_url, resync: cfg.resync });
    let (agents_kube, agents_ctx) = (cfg.kube.clone(), ctx.clone());
    let agents = async move {
        if cfg.agent_sandbox {
            crate::agents::controller::run(agents_kube, agents_ctx).await
        }
    };
    let pools = Controller::new(Api::<SandboxPool>::all(cfg.kube.clone()), watcher::Config::default())
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
        .run(reconcile_claim, retry, ctx.clone())
        .for_each(|r| async move { log("SandboxClaim", r) });
    let sandboxes = Controller::new(Api::<crate::crd::Sandbox>::all(cfg.kube.clone()), watcher::Config::default())
        .shutdown_on_signal()
        .run(crate::sandbox::reconcile, retry, ctx)
        .for_each(|r| async move { log("Sandbox", r) });
    tokio::join!(pools, claims, sandboxes, agents);
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
    let ns = obj.namespace().unwrap_or_default();
    let api: Api<SandboxPool> = Api::namespaced(ctx.kube.clone(), &ns);
    let key = format!("SandboxPool {ns}/{}", obj.name_any());
    finalizer(&api, POOL_FINALIZER, obj, |event| async {
        match event {
            Event::Apply(p) => apply_pool(&p, &ns, &api, &ctx).await,
            Event::Cleanup(p) => delete_node_pool(&ctx, &node_pool_name(&ns, &p.name_any())).await,
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

async fn apply_pool(p: &SandboxPool, ns: &str, api: &Api<SandboxPool>, ctx: &Ctx) -> Result<Action, Error> {
    let name = p.name_any();
    let node = node_pool_name(ns, &name);
    let desired = Desired::from_spec(node.clone(), &p.spec);
    let action = pool::plan(Some(&desired), get_pool(ctx, &node).await?.as_ref());
    let replaced = matches!(action, pool::Action::Delete(_));
    if let Err(e) = step_pool(ctx, action).await {
        let Some(why) = refused(&e) else { return Err(ember_err(ctx)(e)) };
        let mut status = p.status.clone().unwrap_or_default();
        let cond = crate::crd::Condition::new("Ready", false, "NodeRefused", why).generation(p.metadata.generation);
        status.conditions = crate::conditions::set(&status.conditions, cond, &now());
        patch_status(api, &name, status).await?;
        return Ok(Action::requeue(ctx.resync));
    }
    if replaced {
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let Some(observed) = get_pool(ctx, &node).await? else { return Ok(Action::requeue(Duration::from_secs(1))) };
    let claimed = labelled(ctx, POOL_KEY, &node).await?.iter().filter(|s| s.status.state == "Running").count();
    let selector = format!("{POOL_KEY}={node}");
    let generation = p.metadata.generation;
    let status = pool::status(p.status.as_ref(), &observed, claimed as u32, generation, selector, &now());
    let settled = status.idle >= status.target && status.starting == 0;
    if p.status.as_ref() != Some(&status) {
        patch_status(api, &name, &status).await?;
    }
    Ok(Action::requeue(if settled { ctx.resync } else { Duration::from_millis(500) }))
}

async fn reconcile_claim(obj: Arc<SandboxClaim>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = obj.namespace().unwrap_or_default();
    let api: Api<SandboxClaim> = Api::namespaced(ctx.kube.clone(), &ns);
    let key = format!("SandboxClaim {ns}/{}", obj.name_any());
    finalizer(&api, CLAIM_FINALIZER, obj, |event| async {
        match event {
            Event::Apply(c) => apply_claim(&c, &ns, &api, &ctx).await,
            Event::Cleanup(c) => {
                remove_claimed(&ctx, &c.uid().unwrap_or_default()).await?;
                Ok(Action::await_change())
            }
        }
    })
    .await
    .map_err(finalizer_err(&key))
}

/// A claim's uid (the label its node sandbox carries).
pub(crate) fn claim_uid(c: &impl ResourceExt, ns: &str) -> Result<String, Error> {
    c.uid().ok_or_else(|| Error::Invalid {
        kind: "SandboxClaim",
        namespace: ns.into(),
        name: c.name_any(),
        message: "no uid".into(),
    })
}

/// Keeps the claim's sandbox, removes the extra ones a repeated claim made.
pub(crate) async fn keep_bound(ctx: &Ctx, keep: &str, remove: Vec<String>) -> Result<Option<SandboxInfo>, Error> {
    for id in remove {
        found(ctx.ember.delete_sandbox(&id).await).map_err(ember_err(ctx))?;
    }
    found(ctx.ember.get_sandbox(keep).await).map_err(ember_err(ctx))
}

async fn apply_claim(c: &SandboxClaim, ns: &str, api: &Api<SandboxClaim>, ctx: &Ctx) -> Result<Action, Error> {
    let name = c.name_any();
    let uid = claim_uid(c, ns)?;
    let mut error = None;
    let bound = match claim::plan_apply(&labelled(ctx, CLAIM_KEY, &uid).await?) {
        Apply::Bound { keep, remove } => keep_bound(ctx, &keep, remove).await?,
        Apply::Claim => match claim_one(c, ns, &uid, ctx).await {
            Ok(s) => Some(s),
            Err(e) => {
                error = Some(refused(&e).ok_or_else(|| ember_err(ctx)(e))?);
                None
            }
        },
    };
    let status = claim::status(
        c.status.as_ref(),
        bound.as_ref(),
        error.as_deref(),
        &ctx.ember_url,
        c.metadata.generation,
        &now(),
    );
    let ready = crate::conditions::find(&status.conditions, "Ready").is_some_and(|r| r.is_true());
    if c.status.as_ref() != Some(&status) {
        patch_status(api, &name, &status).await?;
    }
    Ok(Action::requeue(if ready || error.is_some() { ctx.resync } else { Duration::from_millis(500) }))
}

/// Claims a sandbox from the claim's pool: ember answers from an idle one
/// when the pool has one, else starts one cold (a miss the pool sizes for).
async fn claim_one(c: &SandboxClaim, ns: &str, uid: &str, ctx: &Ctx) -> Result<SandboxInfo, ClientError> {
    let pools: Api<SandboxPool> = Api::namespaced(ctx.kube.clone(), ns);
    let Ok(pool) = pools.get(&c.spec.pool_ref).await else {
        return Err(ClientError::Api {
            status: 404,
            code: "POOL::NOT_FOUND".into(),
            message: format!("no SandboxPool {ns}/{}", c.spec.pool_ref),
        });
    };
    let node = node_pool_name(ns, &c.spec.pool_ref);
    let req = CreateSandboxRequest {
        template: Some(pool.spec.template.clone()),
        resources: pool.spec.resources.as_ref().map(crate::resources),
        runtime_class: pool.spec.runtime_class.clone(),
        timeout: c.spec.timeout_seconds,
        metadata: Some(BTreeMap::from([(CLAIM_KEY.into(), uid.into()), (POOL_KEY.into(), node.clone())])),
        extensions: Some(BTreeMap::from([("poolRef".into(), node)])),
        ..Default::default()
    };
    Ok(ctx.ember.create_sandbox(&req).await?.0)
}
