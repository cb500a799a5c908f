//! The IO around `plan.rs`: kube-runtime controllers for SandboxWarmPool and
//! SandboxClaim (agent-sandbox's), level-triggered and requeued as ember's
//! own are (`crate::controller`), with finalizers: deleting a warm pool
//! deletes its ember pool, deleting a claim removes its ember sandbox and its
//! Sandbox resource (no garbage collector runs for the owner reference
//! where only an API server does).
use super::crd::{Blueprint, PodTemplate, Sandbox, SandboxClaim, SandboxSpec, SandboxTemplate, SandboxWarmPool};
use super::plan;
use crate::claim::{self, Apply, CLAIM_KEY, POOL_KEY};
use crate::claim_controller::{claim_uid, keep_bound};
use crate::controller::{
    delete_node_pool, drive_pool, ember_err, found, get_pool, labelled, log, now, patch_status, refused,
    remove_claimed, requeue_pool, retry, under_finalizer, Ctx, PoolPass, CLAIM_FINALIZER,
};
use crate::crd::Condition;
use crate::Error;
use ember_types::agent_sandbox::{NAMESPACE_KEY, SANDBOX_KEY};
use ember_types::api::{CreateSandboxRequest, SandboxInfo, WorkspaceMountSpec};
use futures_util::StreamExt;
use kube::api::GroupVersionKind;
use kube::api::{DeleteParams, PostParams};
use kube::discovery::Discovery;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Resource, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Deletes the ember pool of a deleted SandboxWarmPool.
pub const WARM_POOL_FINALIZER: &str = "ember.run/warm-pool";
/// agent-sandbox's label naming the claim a Sandbox answers.
const CLAIM_UID_LABEL: &str = "agents.x-k8s.io/claim-uid";

/// The ember pool a SandboxWarmPool drives: `swp-<namespace>-<name>`, apart
/// from ember's own SandboxPools' `k8s-…` of the same name.
pub fn node_pool(namespace: &str, name: &str) -> String {
    crate::node_pool_name_prefixed("swp", namespace, name)
}

/// agent-sandbox's kinds the API server does not serve (its CRDs not
/// installed), as `group/version kind`.
pub async fn missing_kinds(kube: &kube::Client) -> Result<Vec<String>, kube::Error> {
    let gvks = [
        GroupVersionKind::gvk(&Sandbox::group(&()), &Sandbox::version(&()), &Sandbox::kind(&())),
        GroupVersionKind::gvk(
            &SandboxTemplate::group(&()),
            &SandboxTemplate::version(&()),
            &SandboxTemplate::kind(&()),
        ),
        GroupVersionKind::gvk(&SandboxClaim::group(&()), &SandboxClaim::version(&()), &SandboxClaim::kind(&())),
        GroupVersionKind::gvk(
            &SandboxWarmPool::group(&()),
            &SandboxWarmPool::version(&()),
            &SandboxWarmPool::kind(&()),
        ),
    ];
    let groups: Vec<&str> = gvks.iter().map(|g| g.group.as_str()).collect();
    let discovery = Discovery::new(kube.clone()).filter(&groups).run().await?;
    let missing = gvks.iter().filter(|g| discovery.resolve_gvk(g).is_none());
    Ok(missing.map(|g| format!("{}/{} {}", g.group, g.version, g.kind)).collect())
}

/// Runs agent-sandbox's controllers when the API server serves its CRDs.
/// Without them a watch would fail and retry for ever, a warning each time:
/// instead this says once that they are off (ember's own controllers run
/// either way), and they stay off until the operator restarts.
pub(crate) async fn run_if_served(kube: kube::Client, ctx: Arc<Ctx>) {
    let mut warned = false;
    let missing = loop {
        match missing_kinds(&kube).await {
            Ok(m) => break m,
            // The API server not answering yet: ember's own watches retry too.
            Err(e) if !warned => {
                tracing::warn!("discovering agent-sandbox's CRDs: {e}; retrying");
                warned = true;
            }
            Err(e) => tracing::debug!("discovering agent-sandbox's CRDs: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    if !missing.is_empty() {
        tracing::warn!(
            missing = missing.join(", "),
            "agent-sandbox's CRDs are not installed: its controllers are off, ember.run's are served; \
             install them (`ember operator crds | kubectl apply -f -`) and restart the operator, \
             or pass --no-agent-sandbox to silence this"
        );
        return;
    }
    run(kube, ctx).await
}

async fn run(kube: kube::Client, ctx: Arc<Ctx>) {
    let pools = Controller::new(Api::<SandboxWarmPool>::all(kube.clone()), watcher::Config::default());
    // A warm pool waiting for its template (made before it, or in the same
    // apply) is woken by the template's changes, not left until the resync;
    // a template's change reaches the pools made from it.
    let pool_store = pools.store();
    let templates = Api::<SandboxTemplate>::all(kube.clone());
    let pools = pools
        .watches(templates, watcher::Config::default(), move |t: SandboxTemplate| {
            let (ns, name) = (t.namespace(), t.name_any());
            let made_from = pool_store
                .state()
                .into_iter()
                .filter(|p| p.namespace() == ns && p.spec.sandbox_template_ref.name == name);
            made_from.map(|p| ObjectRef::from_obj(&*p)).collect::<Vec<_>>()
        })
        .shutdown_on_signal()
        .run(reconcile_pool, retry, ctx.clone())
        .for_each(|r| async move { log("SandboxWarmPool", r) });
    let claims = Controller::new(Api::<SandboxClaim>::all(kube.clone()), watcher::Config::default());
    // A claim waiting for its warm pool is woken by the pool's changes.
    let store = claims.store();
    let claims = claims
        .watches(Api::<SandboxWarmPool>::all(kube), watcher::Config::default(), move |p: SandboxWarmPool| {
            let (ns, name) = (p.namespace(), p.name_any());
            let waiting =
                store.state().into_iter().filter(|c| c.namespace() == ns && c.spec.warm_pool_ref.name == name);
            waiting.map(|c| ObjectRef::from_obj(&*c)).collect::<Vec<_>>()
        })
        .shutdown_on_signal()
        .run(reconcile_claim, retry, ctx)
        .for_each(|r| async move { log("agent-sandbox SandboxClaim", r) });
    tokio::join!(pools, claims);
}

async fn reconcile_pool(obj: Arc<SandboxWarmPool>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let c = &*ctx;
    under_finalizer(
        "SandboxWarmPool",
        WARM_POOL_FINALIZER,
        obj,
        c,
        |p, ns, api| async move { apply_pool(&p, &ns, &api, c).await },
        |p, ns| async move { delete_node_pool(c, &node_pool(&ns, &p.name_any())).await },
    )
    .await
}

/// Writes why the warm pool is not served, and waits for a change or the resync.
async fn refuse_pool(
    p: &SandboxWarmPool,
    api: &Api<SandboxWarmPool>,
    ctx: &Ctx,
    reason: &str,
    why: String,
) -> Result<Action, Error> {
    let status = plan::pool_refused(p.status.as_ref(), reason, why, &now());
    if p.status.as_ref() != Some(&status) {
        patch_status(api, &p.name_any(), &status).await?;
    }
    Ok(Action::requeue(ctx.resync))
}

async fn apply_pool(p: &SandboxWarmPool, ns: &str, api: &Api<SandboxWarmPool>, ctx: &Ctx) -> Result<Action, Error> {
    let node = node_pool(ns, &p.name_any());
    let templates: Api<SandboxTemplate> = Api::namespaced(ctx.kube.clone(), ns);
    let tref = &p.spec.sandbox_template_ref.name;
    let Some(template) = templates.get_opt(tref).await? else {
        return refuse_pool(p, api, ctx, "TemplateNotFound", format!("no SandboxTemplate {ns}/{tref}")).await;
    };
    let desired = match plan::desired(node.clone(), p, &template) {
        Ok(d) => d,
        Err(why) => return refuse_pool(p, api, ctx, "InvalidConfiguration", why).await,
    };
    let pass = drive_pool(ctx, &desired).await?;
    let observed = match &pass {
        PoolPass::Refused(why) => return refuse_pool(p, api, ctx, "NodeRefused", why.clone()).await,
        PoolPass::Replaced | PoolPass::Pending => return Ok(requeue_pool(ctx, &pass)),
        PoolPass::Observed(o) => o,
    };
    let status = plan::pool_status(observed, p.metadata.generation, format!("{POOL_KEY}={node}"));
    if p.status.as_ref() != Some(&status) {
        patch_status(api, &p.name_any(), &status).await?;
    }
    Ok(requeue_pool(ctx, &pass))
}

async fn reconcile_claim(obj: Arc<SandboxClaim>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let c = &*ctx;
    under_finalizer(
        "agent-sandbox SandboxClaim",
        CLAIM_FINALIZER,
        obj,
        c,
        |claim, ns, api| async move { apply_claim(&claim, &ns, &api, c).await },
        |claim, ns| async move {
            remove_claimed(c, &claim.uid().unwrap_or_default()).await?;
            remove_workspaces(c, &ns, &claim).await?;
            let sandboxes: Api<Sandbox> = Api::namespaced(c.kube.clone(), &ns);
            match sandboxes.delete(&claim.name_any(), &DeleteParams::default()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                r => drop(r?),
            }
            Ok(Action::await_change())
        },
    )
    .await
}

/// Why no sandbox was claimed.
enum NotClaimed {
    /// Not yet: the warm pool's ember pool is still being made.
    Pending,
    /// Never as asked: the reason and message for the claim's status.
    Refused(&'static str, String),
}

async fn apply_claim(c: &SandboxClaim, ns: &str, api: &Api<SandboxClaim>, ctx: &Ctx) -> Result<Action, Error> {
    let name = c.name_any();
    let uid = claim_uid(c, ns)?;
    let mut error = None;
    let bound = match claim::plan_apply(&labelled(ctx, CLAIM_KEY, &uid).await?) {
        Apply::Bound { keep, remove } => keep_bound(ctx, &keep, remove).await?,
        Apply::Claim => match claim_one(c, ns, &uid, ctx).await? {
            Ok(s) => Some(s),
            Err(NotClaimed::Pending) => None,
            Err(NotClaimed::Refused(reason, why)) => {
                error = Some((reason, why));
                None
            }
        },
    };
    let ready = plan::ready(bound.as_ref(), error.as_ref().map(|(r, w)| (*r, w.as_str())));
    if let Some(s) = &bound {
        // Before the claim says Ready, the Sandbox it names exists.
        ensure_sandbox(c, ns, &uid, s, ready.clone(), ctx).await?;
    }
    let status =
        plan::claim_status(c.status.as_ref(), &name, ready.clone(), bound.is_some(), c.metadata.generation, &now());
    if c.status.as_ref() != Some(&status) {
        patch_status(api, &name, &status).await?;
    }
    Ok(Action::requeue(if ready.is_true() || error.is_some() { ctx.resync } else { Duration::from_millis(500) }))
}

/// Claims a sandbox from the warm pool's ember pool: an idle one when it has
/// one, else one started cold. The sandbox's metadata names the claim (found
/// again by it) and the Sandbox resource (the router finds it by that).
async fn claim_one(c: &SandboxClaim, ns: &str, uid: &str, ctx: &Ctx) -> Result<Result<SandboxInfo, NotClaimed>, Error> {
    let pool_name = &c.spec.warm_pool_ref.name;
    let pools: Api<SandboxWarmPool> = Api::namespaced(ctx.kube.clone(), ns);
    let Some(warm) = pools.get_opt(pool_name).await? else {
        return Ok(Err(NotClaimed::Refused("WarmPoolNotFound", format!("no SandboxWarmPool {ns}/{pool_name}"))));
    };
    let node = node_pool(ns, pool_name);
    let Some(pool) = get_pool(ctx, &node).await? else { return Ok(Err(NotClaimed::Pending)) };
    let tref = &warm.spec.sandbox_template_ref.name;
    let Some(template) = Api::<SandboxTemplate>::namespaced(ctx.kube.clone(), ns).get_opt(tref).await? else {
        return Ok(Err(NotClaimed::Refused("InvalidConfiguration", format!("no SandboxTemplate {ns}/{tref}"))));
    };
    let extras = match super::extras::extras(ns, &c.name_any(), &c.spec, &template) {
        Ok(x) => x,
        Err((reason, why)) => return Ok(Err(NotClaimed::Refused(reason, why))),
    };
    if let Err(why) = make_workspaces(ctx, &extras.volumes).await? {
        return Ok(Err(NotClaimed::Refused(super::extras::VOLUMES_REJECTED, why)));
    }
    let shutdown = c.spec.lifecycle.as_ref().and_then(|l| l.shutdown_time.as_deref());
    let timeout = match plan::timeout_secs(shutdown, k8s_openapi::jiff::Timestamp::now()) {
        Ok(t) => t,
        Err(why) => return Ok(Err(NotClaimed::Refused("InvalidConfiguration", why))),
    };
    let metadata = BTreeMap::from([
        (CLAIM_KEY.into(), uid.into()),
        (POOL_KEY.into(), node.clone()),
        (NAMESPACE_KEY.into(), ns.into()),
        (SANDBOX_KEY.into(), c.name_any()),
    ]);
    let req = CreateSandboxRequest {
        template: Some(pool.template.clone()),
        runtime_class: Some(pool.runtime_class.clone()),
        timeout,
        metadata: Some(metadata),
        extensions: Some(BTreeMap::from([("poolRef".into(), node)])),
        // A warm claim binds both: env for its commands, workspaces mounted into it.
        env: (!extras.env.is_empty()).then(|| extras.env.into_iter().map(|(k, v)| (k, Some(v))).collect()),
        workspaces: extras
            .volumes
            .iter()
            .map(|v| WorkspaceMountSpec {
                name: v.workspace.clone(),
                mount_path: Some(v.mount_path.clone()),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    match ctx.ember.create_sandbox(&req).await {
        Ok((s, _)) => Ok(Ok(s)),
        Err(e) => match refused(&e) {
            Some(why) => Ok(Err(NotClaimed::Refused("InvalidConfiguration", why))),
            None => Err(ember_err(ctx)(e)),
        },
    }
}

/// The claim's volumes as ember workspaces (one made by an earlier pass, or
/// before a restart, is kept); `Ok(Err(why))` when ember refuses one.
async fn make_workspaces(ctx: &Ctx, volumes: &[super::extras::Volume]) -> Result<Result<(), String>, Error> {
    for v in volumes {
        match ctx.ember.create_workspace(&v.workspace, &v.size).await {
            Ok(_) => {}
            Err(ember_client::ClientError::Api { code, .. }) if code == "WORKSPACE::ALREADY_EXISTS" => {}
            Err(e) => return refused(&e).map(Err).ok_or_else(|| ember_err(ctx)(e)),
        }
    }
    Ok(Ok(()))
}

/// A deleted claim's workspaces, once its sandbox is gone: the volumes its
/// spec and template name (a template changed since leaves the old ones).
async fn remove_workspaces(ctx: &Ctx, ns: &str, c: &SandboxClaim) -> Result<(), Error> {
    let warm = Api::<SandboxWarmPool>::namespaced(ctx.kube.clone(), ns).get_opt(&c.spec.warm_pool_ref.name).await?;
    let tref = warm.map(|w| w.spec.sandbox_template_ref.name);
    let template = match tref {
        Some(t) => Api::<SandboxTemplate>::namespaced(ctx.kube.clone(), ns).get_opt(&t).await?,
        None => None,
    };
    let Some(Ok(extras)) = template.map(|t| super::extras::extras(ns, &c.name_any(), &c.spec, &t)) else {
        return Ok(());
    };
    for v in extras.volumes {
        found(ctx.ember.delete_workspace(&v.workspace).await).map_err(ember_err(ctx))?;
    }
    Ok(())
}

/// The Sandbox resource of the claim's name, owned by the claim, its Ready
/// condition the claim's.
async fn ensure_sandbox(
    c: &SandboxClaim,
    ns: &str,
    uid: &str,
    s: &SandboxInfo,
    ready: Condition,
    ctx: &Ctx,
) -> Result<(), Error> {
    let api: Api<Sandbox> = Api::namespaced(ctx.kube.clone(), ns);
    let name = c.name_any();
    let existing = match api.get_opt(&name).await? {
        Some(sb) => sb,
        None => {
            let template = PodTemplate {
                spec: serde_json::json!({}),
                metadata: c.spec.additional_pod_metadata.clone().unwrap_or_default(),
            };
            let spec = SandboxSpec {
                blueprint: Blueprint { pod_template: template, ..Default::default() },
                lifecycle: c.spec.lifecycle.clone().unwrap_or_default(),
                operating_mode: None,
            };
            let mut sb = Sandbox::new(&name, spec);
            sb.metadata.annotations = Some(BTreeMap::from([(plan::SANDBOX_ID_ANNOTATION.into(), s.id.clone())]));
            sb.metadata.labels = Some(BTreeMap::from([(CLAIM_UID_LABEL.into(), uid.into())]));
            sb.metadata.owner_references = c.controller_owner_ref(&()).map(|o| vec![o]);
            api.create(&PostParams::default(), &sb).await?
        }
    };
    let status = plan::sandbox_status(existing.status.as_ref(), ready, &now());
    if existing.status.as_ref() != Some(&status) {
        patch_status(&api, &name, &status).await?;
    }
    Ok(())
}
