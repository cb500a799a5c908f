//! The SandboxTemplate controller's IO around `template.rs`: each pass reads
//! the node's template (ember's API) and the namespace's SandboxPools, takes
//! the planned step and writes the status. A deletion held by a pool writes
//! `DeletionBlocked` and waits (the pool's watch wakes it, the resync
//! otherwise) instead of failing and retrying hot.
use crate::controller::{ember_err, found, now, patch_status, refused, under_finalizer, Ctx};
use crate::crd::{SandboxPool, SandboxTemplate};
use crate::template::{self, Action, Desired, TemplateRef};
use crate::Error;
use ember_client::ClientError;
use ember_types::image::TemplateInfo;
use kube::runtime::controller::Action as Requeue;
use kube::{Api, Resource, ResourceExt};
use std::sync::Arc;

/// Removes the ember template of a deleted SandboxTemplate.
pub const TEMPLATE_FINALIZER: &str = "ember.run/template";

pub(crate) async fn reconcile(obj: Arc<SandboxTemplate>, ctx: Arc<Ctx>) -> Result<Requeue, Error> {
    let c = &*ctx;
    let ns = obj.namespace().unwrap_or_default();
    let node = template::ember_name(&ns, &obj.name_any());
    let deleting = obj.meta().deletion_timestamp.is_some();
    if deleting && obj.finalizers().iter().any(|f| f == TEMPLATE_FINALIZER) {
        if let Action::Hold(users) = template::plan(None, None, &users(c, &ns, &obj.name_any()).await?) {
            let status = template::held(obj.status.as_ref(), &users, &now());
            if obj.status.as_ref() != Some(&status) {
                patch_status(&Api::<SandboxTemplate>::namespaced(c.kube.clone(), &ns), &obj.name_any(), &status)
                    .await?;
            }
            return Ok(Requeue::requeue(c.resync));
        }
    }
    under_finalizer(
        "SandboxTemplate",
        TEMPLATE_FINALIZER,
        obj,
        c,
        |t, _, api| async move { apply(&t, &api, c).await },
        |t, ns| async move {
            // Held above while a pool names it; none does now.
            let outcome = step(c, template::plan(None, get(c, &node).await?.as_ref(), &[])).await?;
            let message = outcome.err().unwrap_or_default();
            if !message.is_empty() {
                return Err(Error::Invalid { kind: "SandboxTemplate", namespace: ns, name: t.name_any(), message });
            }
            Ok(Requeue::await_change())
        },
    )
    .await
}

async fn apply(t: &SandboxTemplate, api: &Api<SandboxTemplate>, ctx: &Ctx) -> Result<Requeue, Error> {
    let (ns, name) = (t.namespace().unwrap_or_default(), t.name_any());
    let node = template::ember_name(&ns, &name);
    let desired = Desired {
        req: template::request(node.clone(), &t.spec),
        generation: t.metadata.generation,
        observed_generation: t.status.as_ref().and_then(|s| s.observed_generation),
    };
    let action = template::plan(Some(&desired), get(ctx, &node).await?.as_ref(), &[]);
    if action == Action::Nothing && t.status.as_ref().is_some_and(|s| s.template.is_some()) {
        return Ok(Requeue::requeue(ctx.resync));
    }
    let error = step(ctx, action).await?.err();
    let status = template::status(
        t.status.as_ref(),
        get(ctx, &node).await?.as_ref(),
        error.as_deref(),
        t.metadata.generation,
        &now(),
    );
    if t.status.as_ref() != Some(&status) {
        patch_status(api, &name, &status).await?;
    }
    Ok(Requeue::requeue(ctx.resync))
}

/// Takes one planned step; `Ok(Err(why))` when ember refused it (a 4xx: a
/// bad image, an unknown runtime class), which retrying cannot mend.
async fn step(ctx: &Ctx, action: Action) -> Result<Result<(), String>, Error> {
    let r = match action {
        Action::Create(req) => ctx.ember.create_template(&req).await.map(drop),
        Action::Replace(req) => match absent(ctx.ember.delete_template(&req.name).await) {
            Ok(_) => ctx.ember.create_template(&req).await.map(drop),
            Err(e) => Err(e),
        },
        Action::Delete(name) => absent(ctx.ember.delete_template(&name).await).map(drop),
        Action::Hold(_) | Action::Nothing => Ok(()),
    };
    match r {
        Ok(()) => Ok(Ok(())),
        Err(e) => refused(&e).map(Err).ok_or_else(|| ember_err(ctx)(e)),
    }
}

async fn get(ctx: &Ctx, node: &str) -> Result<Option<TemplateInfo>, Error> {
    absent(ctx.ember.get_template(node).await).map_err(ember_err(ctx))
}

/// ember's answer, with "no such template" as `None`: a 404
/// `TEMPLATE::NOT_FOUND`, or the 400 `SANDBOX::UNKNOWN_TEMPLATE` that nodes
/// before 2026-12-03 answered (as they still do to a create naming one).
fn absent<T>(r: Result<T, ClientError>) -> Result<Option<T>, ClientError> {
    match found(r) {
        Err(ClientError::Api { code, .. }) if code == "SANDBOX::UNKNOWN_TEMPLATE" => Ok(None),
        other => other,
    }
}

/// The SandboxPools of `ns` building from the SandboxTemplate `name`.
async fn users(ctx: &Ctx, ns: &str, name: &str) -> Result<Vec<String>, Error> {
    let pools = Api::<SandboxPool>::namespaced(ctx.kube.clone(), ns).list(&Default::default()).await?;
    Ok(template::users(&pools.items, name))
}

/// How a SandboxPool's `template` reaches the node: through the
/// SandboxTemplate of that name in its namespace, if there is one.
pub(crate) async fn resolve(ctx: &Ctx, ns: &str, template: &str) -> Result<TemplateRef, Error> {
    let cr = Api::<SandboxTemplate>::namespaced(ctx.kube.clone(), ns).get_opt(template).await?;
    Ok(template::resolve(ns, template, cr.as_ref()))
}
