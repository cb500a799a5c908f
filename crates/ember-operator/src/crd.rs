//! ember's custom resources, group `ember.run`, version `v1alpha1`. The CRDs
//! are derived from these types (`all`, `yaml`); the chart's
//! `deploy/helm/ember/crds/` is generated from them and a test fails when it
//! drifts (`tests/crds.rs`).
// kube-derive takes one `printcolumn(...)` per column: same keys, other
// columns, which clippy reads as a repeated attribute.
#![allow(clippy::duplicated_attributes)]

use kube::CustomResource;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const GROUP: &str = "ember.run";
pub const VERSION: &str = "v1alpha1";

/// Resources of a sandbox, as ember's API takes them (`"512Mi"`, `"1"`...).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
}

/// A condition as Kubernetes' own types carry them (`metav1.Condition`'s
/// fields; a type of our own so the schema is derived with the rest).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `"True"`, `"False"` or `"Unknown"`.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339; changes only when `status` does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// An ember template as a resource: the operator makes it on the node as
/// the template `k8s-<namespace>-<name>` (`template.rs`); a SandboxPool of
/// the namespace naming it in `template` builds its sandboxes from it.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "ember.run", version = "v1alpha1", kind = "SandboxTemplate", namespaced)]
#[kube(status = "SandboxTemplateStatus", shortname = "sbt")]
#[kube(printcolumn(name = "Image", type_ = "string", json_path = ".spec.image"))]
#[kube(printcolumn(name = "Template", type_ = "string", json_path = ".status.template"))]
#[kube(printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    /// An image reference, or `host` for the host's root filesystem (as
    /// ember's built-in `host` template).
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,
    /// Environment of every process started in the sandbox.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Overrides the image's Entrypoint/Cmd; `[]` runs none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    /// `name`, `uid`, `name:group` or `uid:gid`, resolved in the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// An absolute path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateStatus {
    /// The ember template made from this resource on the node.
    // Written as null when absent: a merge patch then clears it.
    #[serde(default)]
    pub template: Option<String>,
    /// The image's digest, as ember pulled it.
    // Written as null when absent: a merge patch then clears it.
    #[serde(default)]
    pub image_digest: Option<String>,
    /// The generation last sent to ember (accepted or not: `Ready` says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (ember accepted the template, or refused it and why);
    /// `DeletionBlocked` (deleting waits for the SandboxPools using it).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A warm pool on an ember node: `replicas` idle sandboxes of `template`
/// kept started ahead of claims. `kubectl scale` moves `spec.replicas`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "ember.run", version = "v1alpha1", kind = "SandboxPool", namespaced)]
#[kube(status = "SandboxPoolStatus", shortname = "sbp")]
#[kube(scale(
    spec_replicas_path = ".spec.replicas",
    status_replicas_path = ".status.replicas",
    label_selector_path = ".status.selector"
))]
#[kube(printcolumn(name = "Template", type_ = "string", json_path = ".spec.template"))]
#[kube(printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"))]
#[kube(printcolumn(name = "Idle", type_ = "integer", json_path = ".status.idle"))]
#[kube(printcolumn(name = "Claimed", type_ = "integer", json_path = ".status.claimed"))]
#[kube(printcolumn(name = "Target", type_ = "integer", json_path = ".status.target"))]
#[kube(printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxPoolSpec {
    /// The ember template the node builds the pool's sandboxes from.
    pub template: String,
    /// Idle sandboxes to keep warm.
    #[schemars(range(min = 0, max = 10000))]
    pub replicas: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,
    /// Where the sandboxes run: `node` (ember nodes, the DaemonSet; the
    /// default) or `pod` (each sandbox a Pod of the image `template` names,
    /// `runtimeClass` its runtimeClassName, warm Pods the pool).
    #[serde(default, skip_serializing_if = "PoolMode::is_node")]
    pub mode: PoolMode,
    /// Pod mode only: the Pods' command and workspace volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodPoolSpec>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    #[default]
    Node,
    Pod,
}

impl PoolMode {
    pub fn is_node(&self) -> bool {
        *self == PoolMode::Node
    }
}

/// A pod-mode pool's Pods beyond the image and runtime class.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodPoolSpec {
    /// The container's command; empty: the image's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// A PersistentVolumeClaim per Pod, mounted at `/workspace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<PodWorkspace>,
    /// The port the image serves on, declared on the container; a claim's
    /// `endpoint` is `http://<pod IP>:<port>`. Default 8888, the port of
    /// agent-sandbox's runtime (`/execute`, `/upload`...), so its client's
    /// `SandboxDirectConnectionConfig(api_url=endpoint)` reaches the Pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodWorkspace {
    /// The claim's storage request (`"1Gi"`).
    pub size: String,
    /// Absent: the cluster's default StorageClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

/// The capacity arithmetic behind the node's idle target (ember's pool
/// sizing: the 99.9 % quantile of a Poisson(λ·W) count, clamped to the pool's bounds; docs/warm-pools.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolCapacity {
    /// Claims per second over the node's window (λ).
    pub arrival_per_sec: f64,
    /// Moving average of a replacement's start time, seconds (W).
    pub refill_secs: f64,
    /// λ·W: claims expected while one refill runs.
    pub in_flight_demand: f64,
    /// The target's margin over λ·W (the quantile minus λ·W).
    pub headroom: f64,
    /// The pool's bounds the target is clamped to.
    pub min: u32,
    pub max: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxPoolStatus {
    /// The scale subresource's replicas: the idle sandboxes now.
    #[serde(default)]
    pub replicas: i32,
    /// The scale subresource's selector (the pool's sandboxes are no pods:
    /// it names the pool for tools that read it).
    #[serde(default)]
    pub selector: String,
    /// The ember pool this resource drives on the node.
    #[serde(default)]
    pub node_pool: String,
    #[serde(default)]
    pub idle: u32,
    #[serde(default)]
    pub starting: u32,
    /// Sandboxes claimed from the pool (by SandboxClaims) and still alive.
    #[serde(default)]
    pub claimed: u32,
    /// The idle count the node converges to.
    #[serde(default)]
    pub target: u32,
    #[serde(default)]
    pub capacity: PoolCapacity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A sandbox started cold from a template, one per resource (no pool: the
/// on-demand path). Deleting the resource removes the sandbox (`sandbox.rs`).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "ember.run", version = "v1alpha1", kind = "Sandbox", namespaced)]
#[kube(status = "SandboxStatus", shortname = "sb")]
#[kube(printcolumn(name = "Template", type_ = "string", json_path = ".spec.template"))]
#[kube(printcolumn(name = "Sandbox", type_ = "string", json_path = ".status.sandboxId"))]
#[kube(printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    pub template: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Seconds until ember stops it; absent: until the resource is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// The node sandbox's state (`Running`, `Terminated`, ...), `Failed` when
    /// the node refused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// When the operator asked the node for the sandbox (RFC 3339); the
    /// `Ready` condition's `lastTransitionTime` is when it found it running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A sandbox claimed from a SandboxPool of the same namespace: answered by
/// an idle one when the pool has one. Deleting the claim removes the sandbox.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "ember.run", version = "v1alpha1", kind = "SandboxClaim", namespaced)]
#[kube(status = "SandboxClaimStatus", shortname = "sbc")]
#[kube(printcolumn(name = "Pool", type_ = "string", json_path = ".spec.poolRef"))]
#[kube(printcolumn(name = "Sandbox", type_ = "string", json_path = ".status.sandboxId"))]
#[kube(printcolumn(name = "Launch", type_ = "string", json_path = ".status.launch"))]
#[kube(printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimSpec {
    /// A SandboxPool's name in the claim's namespace.
    pub pool_ref: String,
    /// Seconds until ember stops the sandbox; absent: until the claim is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// Where to reach the sandbox: node mode, its resource in ember's API
    /// (`<ember-url>/v1/sandboxes/<id>`); pod mode, the Pod's server
    /// (`http://<pod IP>:<port>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `warm` (an idle sandbox of the pool) or `cold` (the pool was empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A durable workspace: the operator makes it on the node as the ember
/// workspace `k8s-<namespace>-<name>` (`workspace.rs`); sandboxes mount it
/// by that name. Deleting the resource deletes it (and its data).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "ember.run", version = "v1alpha1", kind = "Workspace", namespaced)]
#[kube(status = "WorkspaceStatus", shortname = "ews")]
#[kube(printcolumn(name = "Size", type_ = "string", json_path = ".spec.size"))]
#[kube(printcolumn(name = "Workspace", type_ = "string", json_path = ".status.workspace"))]
#[kube(printcolumn(name = "Holder", type_ = "string", json_path = ".status.holder"))]
#[kube(printcolumn(name = "Epoch", type_ = "integer", json_path = ".status.epoch"))]
#[kube(printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"))]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSpec {
    /// Quota, as ember takes it (`"1Gi"`); fixed once made (ember's
    /// workspaces are not resized: the API server refuses a change).
    #[schemars(schema_with = "immutable_string")]
    pub size: String,
}

/// A string the API server refuses to change after creation (a CEL rule).
fn immutable_string(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        // Bounded, so the API server's CEL cost estimate stays small.
        "maxLength": 32,
        "x-kubernetes-validations": [{ "rule": "self == oldSelf", "message": "is fixed once the workspace is made" }]
    })
}

/// A workspace's newest checkpoint (or snapshot) in the snapshot store.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceCheckpoint {
    pub snapshot_id: String,
    /// RFC 3339.
    pub at: String,
    /// The writer's epoch it was taken under, if it was fenced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceStatus {
    /// `Available` (no writer), `Held` (a sandbox holds its writer lease),
    /// `Failed` (ember refused it: see `Ready`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The ember workspace made from this resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    #[serde(default)]
    pub size_bytes: u64,
    #[serde(default)]
    pub used_bytes: u64,
    /// The sandbox holding the writer lease, if one does.
    // Written as null when absent: a merge patch then clears it.
    #[serde(default)]
    pub holder: Option<String>,
    /// The fencing epoch: the holder's, else the last one granted (0: never held).
    #[serde(default)]
    pub epoch: u64,
    // Written as null when absent: a merge patch then clears it.
    #[serde(default)]
    pub last_checkpoint: Option<WorkspaceCheckpoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`; `DeletionBlocked` while ember refuses the delete (a live
    /// sandbox writes it).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Every CRD, in a fixed order.
pub fn all() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    vec![SandboxTemplate::crd(), SandboxPool::crd(), Sandbox::crd(), SandboxClaim::crd(), Workspace::crd()]
}

/// The CRDs as one multi-document YAML stream (`ember operator crds`, the
/// chart's `crds/ember.run.yaml`).
pub fn yaml() -> Result<String, serde_yaml::Error> {
    yaml_of(&all(), "crates/ember-operator/src/crd.rs")
}

/// `crds` as one multi-document YAML stream, headed by where they come from.
pub fn yaml_of(
    crds: &[k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition],
    source: &str,
) -> Result<String, serde_yaml::Error> {
    let mut out = format!("# Generated by `ember operator crds` from {source}: do not edit.\n");
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(crd)?);
    }
    Ok(out)
}
