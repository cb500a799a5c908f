//! The seam's calls as data, for a cluster: a node that does not hold a
//! sandbox sends its owner a [`NodeCall`] (ember-api's `POST /v1/cluster/call`),
//! which the owner runs on its own [`ControlPlane`](super::ControlPlane) and
//! answers with the call's result as JSON, or the `{code, message}` of its
//! error. Only the calls a cluster forwards are here; the engine's own
//! request and status types (`CreateSandbox`, `NetworkStatus`,
//! `WorkspaceStatus`) cross as they are (serde, no HTTP types); a task log's
//! bytes cross as base64 ([`TaskLogWire`]).
use crate::{CreateSandbox, ListFilter, SandboxSnapshotState, SnapshotFilter};
use ember_types::api::NetworkRule;
use ember_types::{EgressPolicy, SandboxState};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One forwarded call. The receiving node runs it on its own plane
/// (`ControlPlane::node_local`; a create through the cluster's, which records
/// the sandbox), so a call is forwarded once at most and `List` is that
/// node's own sandboxes.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum NodeCall {
    Create {
        req: Box<CreateSandbox>,
    },
    Get {
        id: String,
    },
    List {
        states: Vec<SandboxState>,
        metadata: Vec<(String, String)>,
    },
    Remove {
        id: String,
    },
    Pause {
        id: String,
    },
    Resume {
        id: String,
    },
    Checkpoint {
        id: String,
    },
    Renew {
        id: String,
        expires_at_ms: i64,
    },
    PatchMetadata {
        id: String,
        patch: BTreeMap<String, Option<String>>,
    },
    Boundary {
        id: String,
    },
    Stats {
        id: String,
    },
    AgentLog {
        id: String,
        max: u64,
    },
    EgressPolicy {
        id: String,
    },
    PatchEgress {
        id: String,
        rules: Vec<NetworkRule>,
    },
    DeleteEgress {
        id: String,
        targets: Vec<String>,
    },
    EgressEnforced {
        id: String,
    },
    NetworkEvents {
        id: String,
    },
    NetworkStatus {
        id: String,
    },
    SetNetworkPolicy {
        id: String,
        policy: EgressPolicy,
    },
    SnapshotSandbox {
        id: String,
        name: Option<String>,
    },
    SandboxSnapshot {
        id: String,
    },
    DeleteSandboxSnapshot {
        id: String,
    },
    ListSandboxSnapshots {
        sandbox_id: Option<String>,
        name: Option<String>,
        states: Vec<SandboxSnapshotState>,
    },
    CreateWorkspace {
        name: String,
        size_bytes: u64,
    },
    Workspace {
        name: String,
    },
    ListWorkspaces,
    RemoveWorkspace {
        name: String,
    },
    /// Runs on the receiving node's cluster plane (which commits the
    /// checkpoint in the workspace registry).
    CheckpointWorkspace {
        name: String,
    },
    /// Whether the receiving node's heartbeats get through: asked by a node
    /// about to rebind its sandboxes ([`Liveness`]).
    Liveness,
    /// A task attempt's log, read on the node that ran the attempt.
    TaskLog {
        id: String,
        attempt: Option<u32>,
        offset: u64,
    },
    /// The receiving node's own audit records (its log, on its disk).
    Audit {
        tenant: Option<String>,
        since_ms: i64,
    },
}

impl NodeCall {
    /// The call's name on the wire (its `op`); the audit log's action is
    /// `cluster.<op>`.
    pub fn op(&self) -> &'static str {
        use NodeCall as C;
        match self {
            C::Create { .. } => "create",
            C::Get { .. } => "get",
            C::List { .. } => "list",
            C::Remove { .. } => "remove",
            C::Pause { .. } => "pause",
            C::Resume { .. } => "resume",
            C::Checkpoint { .. } => "checkpoint",
            C::Renew { .. } => "renew",
            C::PatchMetadata { .. } => "patchMetadata",
            C::Boundary { .. } => "boundary",
            C::Stats { .. } => "stats",
            C::AgentLog { .. } => "agentLog",
            C::EgressPolicy { .. } => "egressPolicy",
            C::PatchEgress { .. } => "patchEgress",
            C::DeleteEgress { .. } => "deleteEgress",
            C::EgressEnforced { .. } => "egressEnforced",
            C::NetworkEvents { .. } => "networkEvents",
            C::NetworkStatus { .. } => "networkStatus",
            C::SetNetworkPolicy { .. } => "setNetworkPolicy",
            C::SnapshotSandbox { .. } => "snapshotSandbox",
            C::SandboxSnapshot { .. } => "sandboxSnapshot",
            C::DeleteSandboxSnapshot { .. } => "deleteSandboxSnapshot",
            C::ListSandboxSnapshots { .. } => "listSandboxSnapshots",
            C::CreateWorkspace { .. } => "createWorkspace",
            C::Workspace { .. } => "workspace",
            C::ListWorkspaces => "listWorkspaces",
            C::RemoveWorkspace { .. } => "removeWorkspace",
            C::CheckpointWorkspace { .. } => "checkpointWorkspace",
            C::Liveness => "liveness",
            C::TaskLog { .. } => "taskLog",
            C::Audit { .. } => "audit",
        }
    }

    /// Whether it changes anything on the receiving node. A read (a list
    /// merged across the nodes, a liveness probe, the audit log's own
    /// query) is not written to the audit log: the node the client called
    /// logged the client's call, and a dashboard's polling of a cluster's
    /// list logged one record per other node each time.
    pub fn changes(&self) -> bool {
        use NodeCall as C;
        match self {
            C::Get { .. }
            | C::List { .. }
            | C::Boundary { .. }
            | C::Stats { .. }
            | C::AgentLog { .. }
            | C::EgressPolicy { .. }
            | C::EgressEnforced { .. }
            | C::NetworkEvents { .. }
            | C::NetworkStatus { .. }
            | C::SandboxSnapshot { .. }
            | C::ListSandboxSnapshots { .. }
            | C::Workspace { .. }
            | C::ListWorkspaces
            | C::Liveness
            | C::TaskLog { .. }
            | C::Audit { .. } => false,
            C::Create { .. }
            | C::Remove { .. }
            | C::Pause { .. }
            | C::Resume { .. }
            | C::Checkpoint { .. }
            | C::Renew { .. }
            | C::PatchMetadata { .. }
            | C::PatchEgress { .. }
            | C::DeleteEgress { .. }
            | C::SetNetworkPolicy { .. }
            | C::SnapshotSandbox { .. }
            | C::DeleteSandboxSnapshot { .. }
            | C::CreateWorkspace { .. }
            | C::RemoveWorkspace { .. }
            | C::CheckpointWorkspace { .. } => true,
        }
    }

    pub fn list(f: &ListFilter) -> NodeCall {
        NodeCall::List { states: f.states.clone(), metadata: f.metadata.clone() }
    }

    pub fn list_snapshots(f: &SnapshotFilter) -> NodeCall {
        let SnapshotFilter { sandbox_id, name, states } = f.clone();
        NodeCall::ListSandboxSnapshots { sandbox_id, name, states }
    }
}

/// `NodeCall::Liveness`'s answer: how long ago the node's heartbeat last got
/// through (`ControlPlane::renewed_ms_ago`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Liveness {
    pub renewed_ms_ago: Option<u64>,
}

/// `ControlPlane::task_log`'s answer on the wire: the bytes as base64.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskLogWire {
    pub data: String,
    pub ended: bool,
    pub attempt: u32,
}

impl From<(Vec<u8>, bool, u32)> for TaskLogWire {
    fn from((data, ended, attempt): (Vec<u8>, bool, u32)) -> Self {
        use base64::Engine as _;
        TaskLogWire { data: base64::engine::general_purpose::STANDARD.encode(data), ended, attempt }
    }
}

impl TaskLogWire {
    /// Back into `task_log`'s answer; `None` when `data` is not base64.
    pub fn into_parts(self) -> Option<(Vec<u8>, bool, u32)> {
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.decode(self.data).ok()?;
        Some((data, self.ended, self.attempt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_op_is_the_wire_tag_and_reads_change_nothing() {
        let calls = [
            (NodeCall::List { states: vec![], metadata: vec![] }, false),
            (NodeCall::Liveness, false),
            (NodeCall::Audit { tenant: None, since_ms: 0 }, false),
            (NodeCall::Remove { id: "x".into() }, true),
            (NodeCall::PatchMetadata { id: "x".into(), patch: BTreeMap::new() }, true),
            (NodeCall::CreateWorkspace { name: "w".into(), size_bytes: 1 }, true),
        ];
        for (call, changes) in calls {
            let wire = serde_json::to_value(&call).expect("json");
            assert_eq!(wire["op"], call.op(), "{wire}");
            assert_eq!(call.changes(), changes, "{}", call.op());
        }
    }
}
