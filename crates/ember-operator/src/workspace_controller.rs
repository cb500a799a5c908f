//! The Workspace controller's IO around `workspace.rs`: each pass reads the
//! node's workspace and its snapshots (ember's API), takes the planned step
//! and writes the status; the holder and epoch change without a Kubernetes
//! event, so a pass comes back at the resync. A deletion ember refuses (a
//! live sandbox writes the workspace) writes `DeletionBlocked` and is tried
//! again at the resync, not retried hot as an error.
use crate::controller::{ember_err, found, now, patch_status, refused, under_finalizer, Ctx};
use crate::crd::Workspace;
use crate::workspace::{self, Action};
use crate::Error;
use ember_types::api::WorkspaceInfo;
use kube::runtime::controller::Action as Requeue;
use kube::{Api, Resource, ResourceExt};
use std::sync::Arc;

/// Deletes the ember workspace of a deleted Workspace.
pub const WORKSPACE_FINALIZER: &str = "ember.run/workspace";

pub(crate) async fn reconcile(obj: Arc<Workspace>, ctx: Arc<Ctx>) -> Result<Requeue, Error> {
    let c = &*ctx;
    let ns = obj.namespace().unwrap_or_default();
    let node = workspace::ember_name(&ns, &obj.name_any());
    if obj.meta().deletion_timestamp.is_some() && obj.finalizers().iter().any(|f| f == WORKSPACE_FINALIZER) {
        if let Some(why) = delete(c, &node).await? {
            let status = workspace::held(obj.status.as_ref(), &why, &now());
            if obj.status.as_ref() != Some(&status) {
                patch_status(&Api::<Workspace>::namespaced(c.kube.clone(), &ns), &obj.name_any(), &status).await?;
            }
            return Ok(Requeue::requeue(c.resync));
        }
    }
    under_finalizer(
        "Workspace",
        WORKSPACE_FINALIZER,
        obj,
        c,
        |w, _, api| async move { apply(&w, &node, &api, c).await },
        // Deleted above (a refusal returned before this).
        |_, _| async move { Ok(Requeue::await_change()) },
    )
    .await
}

/// The workspace deleted if still there; `Some(why)` when ember refuses.
async fn delete(ctx: &Ctx, node: &str) -> Result<Option<String>, Error> {
    let Action::Delete(name) = workspace::plan(None, get(ctx, node).await?.as_ref()) else { return Ok(None) };
    match found(ctx.ember.delete_workspace(&name).await) {
        Ok(_) => Ok(None),
        Err(e) => refused(&e).map(Some).ok_or_else(|| ember_err(ctx)(e)),
    }
}

async fn apply(w: &Workspace, node: &str, api: &Api<Workspace>, ctx: &Ctx) -> Result<Requeue, Error> {
    let mut error = None;
    if let Action::Create { name, size } = workspace::plan(Some((node, &w.spec.size)), get(ctx, node).await?.as_ref()) {
        if let Err(e) = ctx.ember.create_workspace(&name, &size).await {
            error = Some(refused(&e).ok_or_else(|| ember_err(ctx)(e))?);
        }
    }
    let observed = get(ctx, node).await?;
    let checkpoint = match &observed {
        Some(_) => workspace::last_checkpoint(&ctx.ember.list_snapshots(Some(node)).await.map_err(ember_err(ctx))?),
        None => None,
    };
    let generation = w.metadata.generation;
    let status =
        workspace::status(w.status.as_ref(), observed.as_ref(), checkpoint, error.as_deref(), generation, &now());
    if w.status.as_ref() != Some(&status) {
        patch_status(api, &w.name_any(), &status).await?;
    }
    Ok(Requeue::requeue(ctx.resync))
}

async fn get(ctx: &Ctx, node: &str) -> Result<Option<WorkspaceInfo>, Error> {
    found(ctx.ember.get_workspace(node).await).map_err(ember_err(ctx))
}
