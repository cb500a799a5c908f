//! Wire types of sandbox snapshots (OpenSandbox 1.1.1 `Snapshot`,
//! `/v1/sandboxes/{id}/snapshots` and `/v1/snapshots`), plus ember's own
//! optional fields. Re-exported from [`crate::api`]. Optional keys are omitted,
//! never `null`.
use serde::{Deserialize, Serialize};

/// `POST /v1/sandboxes/{id}/snapshots` (the body is optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreateSnapshotRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// `Creating`, `Ready`, `Failed` or `Deleting`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_at: Option<String>,
}

/// A workspace captured with the sandbox (ember's field).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotWorkspaceInfo {
    pub name: String,
    pub mount_path: String,
    #[serde(default)]
    pub read_only: bool,
    /// The workspace snapshot restored into a new workspace (read-write mounts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
}

/// A sandbox snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSnapshotInfo {
    pub id: String,
    pub sandbox_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub status: SnapshotStatus,
    pub created_at: String,
    // ember's own fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,
    /// Bytes of file content in the writable layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspaces: Vec<SnapshotWorkspaceInfo>,
}

/// `GET /v1/snapshots`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SandboxSnapshotList {
    pub items: Vec<SandboxSnapshotInfo>,
    pub pagination: crate::api::Pagination,
}

/// `POST /v1/snapshot-store/gc` (the body is optional): one mark-and-sweep of
/// the snapshot store, for sandbox and workspace snapshots alike.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotGcRequest {
    /// Keep unreferenced chunks younger than this (default 600: a second
    /// guard, beside the markers, for stores without read-after-write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_age_seconds: Option<u64>,
}

/// What a sweep found and removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotGcReport {
    pub manifests: u64,
    pub chunks_seen: u64,
    pub chunks_referenced: u64,
    pub chunks_deleted: u64,
    /// Stored (compressed) bytes freed.
    pub bytes_deleted: u64,
    /// Unreferenced, but younger than the minimum age.
    pub chunks_spared_young: u64,
    /// Referenced by a manifest but absent from the store.
    pub missing_chunks: Vec<String>,
}
