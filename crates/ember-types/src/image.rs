//! Wire types of ember's own image and template routes (`/v1/images`,
//! `/v1/templates`).
use crate::{NetworkMode, Resources, ResourcesSpec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Registry credentials: `username` + `password` (basic) or `token` (bearer).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryAuth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// `POST /v1/images/pull`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequest {
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<RegistryAuth>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerInfo {
    pub digest: String,
    pub diff_id: String,
    pub size: u64,
}

/// The parts of the image config ember honours.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageConfigInfo {
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageInfo {
    pub name: String,
    pub digest: String,
    /// Bottom first.
    pub layers: Vec<LayerInfo>,
    /// Compressed bytes of all layers.
    pub size: u64,
    pub config: ImageConfigInfo,
    pub created_at: String,
    /// Device nodes left out of the image's layers (a rootfs made by
    /// `debootstrap` or `docker export` has `/dev` nodes; a sandbox gets its
    /// own `/dev`). Absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_device_nodes: u64,
    /// What the caller should know about the image (e.g. what was skipped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// One unpacked layer on the node and how many images list it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerStat {
    pub digest: String,
    pub size: u64,
    pub unpacked_bytes: u64,
    pub images: u64,
}

/// `GET /v1/images`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageList {
    pub items: Vec<ImageInfo>,
    pub layers: Vec<LayerStat>,
}

/// `POST /v1/images/prune`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneResult {
    pub removed_layers: Vec<String>,
    pub freed_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerPull {
    pub digest: String,
    pub size: u64,
    pub downloaded: u64,
    /// waiting, downloading, unpacking, done or cached.
    pub state: String,
}

/// `GET /v1/images/pulls`: one pull in flight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullStatus {
    pub reference: String,
    pub layers: Vec<LayerPull>,
}

/// `POST /v1/templates`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRequest {
    pub name: String,
    /// An image reference; absent means the host rootfs, as the `host` template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<RegistryAuth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourcesSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// `name`, `uid`, `name:group` or `uid:gid`, resolved in the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Overrides the image's Entrypoint/Cmd; `[]` runs none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
}

/// A template, validated, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateInfo {
    pub name: String,
    pub builtin: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    pub runtime_class: String,
    pub resources: Resources,
    pub network: NetworkMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
