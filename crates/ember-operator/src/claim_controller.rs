//! The SandboxClaim controller's IO around `claim.rs`: a claim of a node-mode
//! pool is claimed from the node (`POST /v1/sandboxes` with the pool as
//! `poolRef`), found again by its uid in the sandbox's metadata; a claim of
//! a pod-mode pool goes to `pods::controller`. The finalizer removes what
//! answered it.
use crate::claim::{self, Apply, CLAIM_KEY, POOL_KEY};
use crate::controller::{
    ember_err, found, labelled, now, patch_status, refused, remove_claimed, under_finalizer, Ctx, CLAIM_FINALIZER,
};
use crate::crd::{PoolMode, SandboxClaim, SandboxPool};
use crate::template::TemplateRef;
use crate::{node_pool_name, Error};
use ember_client::ClientError;
use ember_types::api::{CreateSandboxRequest, SandboxInfo};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub(crate) async fn reconcile(obj: Arc<SandboxClaim>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let c = &*ctx;
    under_finalizer(
        "SandboxClaim",
        CLAIM_FINALIZER,
        obj,
        c,
        |claim, ns, api| async move { apply_claim(&claim, &ns, &api, c).await },
        |claim, ns| async move {
            // A pod-mode claim's Pod goes; else its sandbox on the node.
            if !crate::pods::controller::cleanup_claim(&claim, &ns, c).await? && !pod_mode(c, &ns, &claim) {
                remove_claimed(c, &claim.uid().unwrap_or_default()).await?;
            }
            Ok(Action::await_change())
        },
    )
    .await
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

/// The claim's pool, as the pool controller's cache holds it, if it is pod mode.
fn pod_pool(ctx: &Ctx, ns: &str, c: &SandboxClaim) -> Option<Arc<SandboxPool>> {
    let pool = ctx.pools.get(&ObjectRef::new(&c.spec.pool_ref).within(ns))?;
    (pool.spec.mode == PoolMode::Pod).then_some(pool)
}

fn pod_mode(ctx: &Ctx, ns: &str, c: &SandboxClaim) -> bool {
    pod_pool(ctx, ns, c).is_some()
}

async fn apply_claim(c: &SandboxClaim, ns: &str, api: &Api<SandboxClaim>, ctx: &Ctx) -> Result<Action, Error> {
    if let Some(pool) = pod_pool(ctx, ns, c) {
        return crate::pods::controller::apply_claim(c, ns, api, &pool, ctx).await;
    }
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
    if pool.spec.mode == PoolMode::Pod {
        // The pool controller's cache is behind the API server: retried.
        let message = format!("SandboxPool {ns}/{} (pod mode) not cached yet", c.spec.pool_ref);
        return Err(ClientError::Api { status: 503, code: "POOL::NOT_CACHED".into(), message });
    }
    let node = node_pool_name(ns, &c.spec.pool_ref);
    // The template the node pool was made with (a SandboxTemplate's own).
    let template = match crate::template_controller::resolve(ctx, ns, &pool.spec.template).await {
        Ok(TemplateRef::Node(t) | TemplateRef::Made(t)) => t,
        Ok(TemplateRef::NotReady(message)) => {
            return Err(ClientError::Api { status: 409, code: "TEMPLATE::NOT_READY".into(), message })
        }
        Err(e) => {
            return Err(ClientError::Api {
                status: 503,
                code: "KUBERNETES::UNAVAILABLE".into(),
                message: e.to_string(),
            })
        }
    };
    let req = CreateSandboxRequest {
        template: Some(template),
        resources: pool.spec.resources.as_ref().map(crate::resources),
        runtime_class: pool.spec.runtime_class.clone(),
        timeout: c.spec.timeout_seconds,
        metadata: Some(BTreeMap::from([(CLAIM_KEY.into(), uid.into()), (POOL_KEY.into(), node.clone())])),
        extensions: Some(BTreeMap::from([("poolRef".into(), node)])),
        ..Default::default()
    };
    Ok(ctx.ember.create_sandbox(&req).await?.0)
}
