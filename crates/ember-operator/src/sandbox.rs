//! Sandbox (`ember.run`) → one sandbox started cold on the node from the
//! resource's template: no pool, the node launches it per resource (the
//! on-demand path lab 2 times through the API server). As for claims
//! (`claim.rs`), the node sandbox carries the resource's uid in its metadata
//! ([`SANDBOX_KEY`]) and is found again by it, so an operator restarted
//! between the node's answer and the status write adopts it instead of
//! starting a second one; the finalizer removes it when the resource goes.
use crate::claim::{self, Apply};
use crate::claim_controller::keep_bound;
use crate::controller::{ember_err, labelled, now, patch_status, refused, remove_labelled, under_finalizer, Ctx};
use crate::crd::{Sandbox, SandboxStatus};
use crate::{conditions, Error};
use ember_client::ClientError;
use ember_types::api::{CreateSandboxRequest, SandboxInfo};
use kube::runtime::controller::Action;
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Sandbox metadata naming the Sandbox resource (its uid) that owns it.
pub const SANDBOX_KEY: &str = "ember.run.sandbox";
/// Removes the node sandbox of a deleted Sandbox resource.
pub const SANDBOX_FINALIZER: &str = "ember.run/sandbox";

/// The resource's status for the node sandbox bound to it (`None`: the node
/// refused it with `error`, e.g. no such template); `started_at` is when the
/// operator asked the node, kept from the pass that did.
pub fn status(
    prev: Option<&SandboxStatus>,
    bound: Option<&SandboxInfo>,
    error: Option<&str>,
    started_at: Option<String>,
    generation: Option<i64>,
    now: &str,
) -> SandboxStatus {
    let ready = claim::ready(bound, error, "CreateFailed").generation(generation);
    let prev_conditions = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    SandboxStatus {
        sandbox_id: bound.map(|s| s.id.clone()),
        phase: bound.map(|s| s.status.state.clone()).or_else(|| error.map(|_| "Failed".into())),
        started_at,
        conditions: conditions::set(prev_conditions, ready, now),
    }
}

pub(crate) async fn reconcile(obj: Arc<Sandbox>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let c = &*ctx;
    under_finalizer(
        "Sandbox",
        SANDBOX_FINALIZER,
        obj,
        c,
        |sb, ns, api| async move { apply(&sb, &ns, &api, c).await },
        |sb, _| async move {
            remove_labelled(c, SANDBOX_KEY, &sb.uid().unwrap_or_default()).await?;
            Ok(Action::await_change())
        },
    )
    .await
}

async fn apply(sb: &Sandbox, ns: &str, api: &Api<Sandbox>, ctx: &Ctx) -> Result<Action, Error> {
    let name = sb.name_any();
    let uid = sb.uid().ok_or_else(|| Error::Invalid {
        kind: "Sandbox",
        namespace: ns.into(),
        name: name.clone(),
        message: "no uid".into(),
    })?;
    let mut started_at = sb.status.as_ref().and_then(|s| s.started_at.clone());
    let mut error = None;
    let bound = match claim::plan_apply(&labelled(ctx, SANDBOX_KEY, &uid).await?) {
        Apply::Bound { keep, remove } => keep_bound(ctx, &keep, remove).await?,
        Apply::Claim => {
            started_at = Some(now());
            match create(sb, &uid, ctx).await {
                Ok(s) => Some(s),
                Err(e) => {
                    error = Some(refused(&e).ok_or_else(|| ember_err(ctx)(e))?);
                    None
                }
            }
        }
    };
    let status =
        status(sb.status.as_ref(), bound.as_ref(), error.as_deref(), started_at, sb.metadata.generation, &now());
    let ready = conditions::find(&status.conditions, "Ready").is_some_and(|r| r.is_true());
    if sb.status.as_ref() != Some(&status) {
        patch_status(api, &name, &status).await?;
    }
    Ok(Action::requeue(if ready || error.is_some() { ctx.resync } else { Duration::from_millis(500) }))
}

/// A cold create on the node from the resource's template.
async fn create(sb: &Sandbox, uid: &str, ctx: &Ctx) -> Result<SandboxInfo, ClientError> {
    let req = CreateSandboxRequest {
        template: Some(sb.spec.template.clone()),
        resources: sb.spec.resources.as_ref().map(crate::resources),
        timeout: sb.spec.timeout_seconds,
        metadata: Some(BTreeMap::from([(SANDBOX_KEY.into(), uid.into())])),
        ..Default::default()
    };
    Ok(ctx.ember.create_sandbox(&req).await?.0)
}
