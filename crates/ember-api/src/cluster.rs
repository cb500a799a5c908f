//! `POST /v1/cluster/call`: the one route a cluster's nodes call on each
//! other. The body is a [`NodeCall`] (one seam call as data), run on this
//! node's control plane; the answer is the call's result as JSON, or the
//! `{code, message}` of its error, rendered as every other error is
//! (`error.rs`), so the calling node can give its client the same error. It
//! sits behind the API key like every route: the nodes of a cluster share it.
use crate::error::ApiError;
use crate::{ApiJson, ApiState};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ember_engine::{ListFilter, Liveness, NodeCall, SnapshotFilter, TaskLogWire};
use serde::Serialize;

fn json<T: Serialize>(v: T) -> Response {
    Json(v).into_response()
}

/// Runs the call; its answer carries how the audit log records it
/// ([`AuditAs`]): a read not at all, a change as `cluster.<op>`.
pub async fn call(State(st): State<ApiState>, ApiJson(call): ApiJson<NodeCall>) -> Response {
    let audit = AuditAs(call.changes().then(|| format!("cluster.{}", call.op())));
    let mut resp = run(&st, call).await.into_response();
    resp.extensions_mut().insert(audit);
    resp
}

/// How the audit log records a call: under this action, or (`None`) not.
#[derive(Clone, Debug)]
pub(crate) struct AuditAs(pub(crate) Option<String>);

async fn run(st: &ApiState, call: NodeCall) -> Result<Response, ApiError> {
    // A create goes through the cluster's plane, which records where the
    // sandbox is before answering, and so does a workspace checkpoint (its
    // commit in the workspace registry); every other call runs on this node alone,
    // so a forwarded call is never forwarded again.
    let e = &st.engine.node_local().unwrap_or_else(|| st.engine.clone());
    Ok(match call {
        NodeCall::Create { req } => json(st.engine.create(*req).await?),
        NodeCall::Get { id } => json(e.get(&id).await?),
        NodeCall::List { states, metadata } => {
            json(e.list(&ListFilter { states, metadata, ..Default::default() }).await?)
        }
        NodeCall::Remove { id } => json(e.remove(&id).await?),
        NodeCall::Pause { id } => json(e.pause(&id).await?),
        NodeCall::Resume { id } => json(e.resume(&id).await?),
        NodeCall::Checkpoint { id } => json(e.checkpoint(&id).await?),
        NodeCall::Renew { id, expires_at_ms } => json(e.renew(&id, expires_at_ms).await?),
        NodeCall::PatchMetadata { id, patch } => json(e.patch_metadata(&id, patch).await?),
        NodeCall::Boundary { id } => json(e.boundary(&id).await?),
        NodeCall::Stats { id } => json(e.stats(&id).await?),
        NodeCall::AgentLog { id, max } => json(e.agent_log(&id, max).await?),
        NodeCall::EgressPolicy { id } => json(e.egress_policy(&id).await?),
        NodeCall::PatchEgress { id, rules } => json(e.patch_egress(&id, rules).await?),
        NodeCall::DeleteEgress { id, targets } => json(e.delete_egress(&id, targets).await?),
        NodeCall::EgressEnforced { id } => json(e.egress_enforced(&id).await?),
        NodeCall::NetworkEvents { id } => json(e.network_events(&id).await?),
        NodeCall::NetworkStatus { id } => json(e.network_status(&id).await?),
        NodeCall::SetNetworkPolicy { id, policy } => json(e.set_network_policy(&id, policy).await?),
        NodeCall::SnapshotSandbox { id, name } => json(e.snapshot_sandbox(&id, name).await?),
        NodeCall::SandboxSnapshot { id } => json(e.sandbox_snapshot(&id).await?),
        NodeCall::DeleteSandboxSnapshot { id } => json(e.delete_sandbox_snapshot(&id).await?),
        NodeCall::ListSandboxSnapshots { sandbox_id, name, states } => {
            json(e.list_sandbox_snapshots(&SnapshotFilter { sandbox_id, name, states }).await?)
        }
        NodeCall::CreateWorkspace { name, size_bytes } => json(e.create_workspace(name, size_bytes).await?),
        NodeCall::Workspace { name } => json(e.workspace(&name).await?),
        NodeCall::ListWorkspaces => json(e.list_workspaces().await?),
        NodeCall::Liveness => json(Liveness { renewed_ms_ago: st.engine.renewed_ms_ago() }),
        NodeCall::RemoveWorkspace { name } => json(e.remove_workspace(&name).await?),
        NodeCall::CheckpointWorkspace { name } => json(st.engine.checkpoint_workspace(&name).await?),
        NodeCall::TaskLog { id, attempt, offset } => json(TaskLogWire::from(e.task_log(&id, attempt, offset).await?)),
        NodeCall::Audit { tenant, since_ms } => json(crate::tenants::audit_here(st, tenant, since_ms).await?),
    })
}
