//! The seam's calls as data, for a cluster: a node that does not hold a
//! sandbox sends its owner a [`NodeCall`] (ember-api's `POST /v1/cluster/call`),
//! which the owner runs on its own [`ControlPlane`](super::ControlPlane) and
//! answers with the call's result as JSON, or the `{code, message}` of its
//! error. Only the calls a cluster forwards are here; the types the engine
//! keeps transport-free ([`CreateSandbox`], [`NetworkStatus`],
//! [`WorkspaceStatus`]) cross as the mirrors below.
use crate::{
    CreateSandbox, HostVolumeRequest, ListFilter, NetworkStatus, SandboxSnapshotState, SnapshotFilter,
    WorkspaceRequest, WorkspaceStatus,
};
use ember_types::api::{NetworkPolicy, NetworkRule};
use ember_types::image::RegistryAuth;
use ember_types::{EgressPolicy, NetworkMode, SandboxState, UserSpec};
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
        req: Box<CreateWire>,
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
    /// A task attempt's log, read on the node that ran the attempt.
    TaskLog {
        id: String,
        attempt: Option<u32>,
        offset: u64,
    },
}

impl NodeCall {
    pub fn list(f: &ListFilter) -> NodeCall {
        NodeCall::List { states: f.states.clone(), metadata: f.metadata.clone() }
    }

    pub fn list_snapshots(f: &SnapshotFilter) -> NodeCall {
        let SnapshotFilter { sandbox_id, name, states } = f.clone();
        NodeCall::ListSandboxSnapshots { sandbox_id, name, states }
    }
}

/// [`CreateSandbox`] on the wire (field for field).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CreateWire {
    pub template: Option<String>,
    pub image_uri: Option<String>,
    pub memory: Option<String>,
    pub cpu: Option<String>,
    pub pids: Option<u64>,
    pub disk: Option<String>,
    pub ttl_secs: Option<u64>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub entrypoint: Vec<String>,
    pub user: Option<UserSpec>,
    pub runtime_class: Option<String>,
    pub image_auth: Option<RegistryAuth>,
    pub network_policy: Option<NetworkPolicy>,
    pub volumes: Vec<VolumeWire>,
    pub pool: Option<String>,
    pub workspaces: Vec<WorkspaceWire>,
    pub network: Option<NetworkMode>,
    pub egress: Option<EgressPolicy>,
    pub snapshot_id: Option<String>,
}

/// [`NetworkStatus`] on the wire.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NetworkWire {
    pub mode: NetworkMode,
    pub policy: EgressPolicy,
    pub address: Option<std::net::Ipv4Addr>,
}

impl From<NetworkStatus> for NetworkWire {
    fn from(n: NetworkStatus) -> Self {
        let NetworkStatus { mode, policy, address } = n;
        NetworkWire { mode, policy, address }
    }
}

impl From<NetworkWire> for NetworkStatus {
    fn from(n: NetworkWire) -> Self {
        let NetworkWire { mode, policy, address } = n;
        NetworkStatus { mode, policy, address }
    }
}

/// [`WorkspaceStatus`] on the wire.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkspaceStatusWire {
    pub meta: ember_workspace::WorkspaceMeta,
    pub used_bytes: u64,
    pub mounted: bool,
}

impl From<WorkspaceStatus> for WorkspaceStatusWire {
    fn from(w: WorkspaceStatus) -> Self {
        let WorkspaceStatus { meta, used_bytes, mounted } = w;
        WorkspaceStatusWire { meta, used_bytes, mounted }
    }
}

impl From<WorkspaceStatusWire> for WorkspaceStatus {
    fn from(w: WorkspaceStatusWire) -> Self {
        let WorkspaceStatusWire { meta, used_bytes, mounted } = w;
        WorkspaceStatus { meta, used_bytes, mounted }
    }
}

/// [`HostVolumeRequest`] on the wire.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VolumeWire {
    pub name: String,
    pub host_path: String,
    pub sub_path: Option<String>,
    pub mount_path: String,
    pub read_only: bool,
}

/// [`WorkspaceRequest`] on the wire.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkspaceWire {
    pub name: String,
    pub path: String,
    pub read_only: bool,
    pub steal: bool,
    pub create_size: Option<u64>,
    pub layered: bool,
}

impl From<CreateSandbox> for CreateWire {
    fn from(c: CreateSandbox) -> Self {
        CreateWire {
            template: c.template,
            image_uri: c.image_uri,
            memory: c.memory,
            cpu: c.cpu,
            pids: c.pids,
            disk: c.disk,
            ttl_secs: c.ttl_secs,
            env: c.env,
            metadata: c.metadata,
            entrypoint: c.entrypoint,
            user: c.user,
            runtime_class: c.runtime_class,
            image_auth: c.image_auth,
            network_policy: c.network_policy,
            volumes: c.volumes.into_iter().map(VolumeWire::from).collect(),
            pool: c.pool,
            workspaces: c.workspaces.into_iter().map(WorkspaceWire::from).collect(),
            network: c.network,
            egress: c.egress,
            snapshot_id: c.snapshot_id,
        }
    }
}

impl From<CreateWire> for CreateSandbox {
    fn from(c: CreateWire) -> Self {
        CreateSandbox {
            template: c.template,
            image_uri: c.image_uri,
            memory: c.memory,
            cpu: c.cpu,
            pids: c.pids,
            disk: c.disk,
            ttl_secs: c.ttl_secs,
            env: c.env,
            metadata: c.metadata,
            entrypoint: c.entrypoint,
            user: c.user,
            runtime_class: c.runtime_class,
            image_auth: c.image_auth,
            network_policy: c.network_policy,
            volumes: c.volumes.into_iter().map(HostVolumeRequest::from).collect(),
            pool: c.pool,
            workspaces: c.workspaces.into_iter().map(WorkspaceRequest::from).collect(),
            network: c.network,
            egress: c.egress,
            snapshot_id: c.snapshot_id,
        }
    }
}

impl From<HostVolumeRequest> for VolumeWire {
    fn from(v: HostVolumeRequest) -> Self {
        let HostVolumeRequest { name, host_path, sub_path, mount_path, read_only } = v;
        VolumeWire { name, host_path, sub_path, mount_path, read_only }
    }
}

impl From<VolumeWire> for HostVolumeRequest {
    fn from(v: VolumeWire) -> Self {
        let VolumeWire { name, host_path, sub_path, mount_path, read_only } = v;
        HostVolumeRequest { name, host_path, sub_path, mount_path, read_only }
    }
}

impl From<WorkspaceRequest> for WorkspaceWire {
    fn from(w: WorkspaceRequest) -> Self {
        let WorkspaceRequest { name, path, read_only, steal, create_size, layered } = w;
        WorkspaceWire { name, path, read_only, steal, create_size, layered }
    }
}

impl From<WorkspaceWire> for WorkspaceRequest {
    fn from(w: WorkspaceWire) -> Self {
        let WorkspaceWire { name, path, read_only, steal, create_size, layered } = w;
        WorkspaceRequest { name, path, read_only, steal, create_size, layered }
    }
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
