//! kubernetes-sigs/agent-sandbox's resources, as its clients write them: our
//! own Rust types for the wire shape of its storage version, `v1beta1`
//! (`agents.x-k8s.io` Sandbox; `extensions.agents.x-k8s.io` SandboxTemplate,
//! SandboxClaim, SandboxWarmPool), with its short names, subresources and
//! printer columns. The pod template and the other core types they embed are
//! kept whole but not modelled (`x-kubernetes-preserve-unknown-fields`): ember
//! runs no pods in node-agent mode and reads only the image, runtime class
//! and limits from them (`plan.rs`). The chart's
//! `crds/agents.x-k8s.io.yaml` is generated from these (`tests/crds.rs`).
#![allow(clippy::duplicated_attributes)]

use crate::crd::Condition;
use kube::CustomResource;
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const GROUP: &str = "agents.x-k8s.io";
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
pub const VERSION: &str = "v1beta1";

/// An embedded core type (a PodSpec, a PVC template, a NetworkPolicy rule),
/// kept as the user wrote it.
fn preserved(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true })
}

fn preserved_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "type": "object", "x-kubernetes-preserve-unknown-fields": true }
    })
}

/// Labels and annotations for the sandbox's pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PodMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A pod template: `spec` is a core PodSpec.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PodTemplate {
    #[schemars(schema_with = "preserved")]
    pub spec: serde_json::Value,
    #[serde(default)]
    pub metadata: PodMetadata,
}

/// What a Sandbox (and a SandboxTemplate) is made from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Blueprint {
    pub pod_template: PodTemplate,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "preserved_list")]
    pub volume_claim_templates: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
}

/// When and how a sandbox (or a claim) ends.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// RFC 3339; the sandbox ends then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
    /// `Delete`, `DeleteForeground` or `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<String>,
}

/// `agents.x-k8s.io` Sandbox: one sandbox. The operator makes one for each
/// claim it answers (named as the claim), as agent-sandbox's claim
/// controller does; made by hand, it is not reconciled (node-agent mode
/// serves claims).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "agents.x-k8s.io", version = "v1beta1", kind = "Sandbox", namespaced)]
#[kube(status = "SandboxStatus", shortname = "sandbox")]
#[kube(printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type=='Ready')].status"))]
#[kube(printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type=='Ready')].reason"))]
#[kube(printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    #[serde(flatten)]
    pub blueprint: Blueprint,
    #[serde(flatten)]
    pub lifecycle: Lifecycle,
    /// `Running` or `Suspended`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_mode: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    #[serde(default, rename = "serviceFQDN", skip_serializing_if = "Option::is_none")]
    pub service_fqdn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
    /// The node running it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

/// `extensions.agents.x-k8s.io` SandboxTemplate: what a warm pool's
/// sandboxes are. ember reads the first container's image (or the
/// `ember.run/template` annotation, an ember template's name), the pod's
/// `runtimeClassName` and the container's limits.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "extensions.agents.x-k8s.io", version = "v1beta1", kind = "SandboxTemplate", namespaced)]
#[kube(shortname = "sandboxtemplate")]
#[serde(rename_all = "camelCase")]
pub struct SandboxTemplateSpec {
    #[serde(flatten)]
    pub blueprint: Blueprint,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved")]
    pub network_policy: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy_management: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars_injection_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_templates_policy: Option<String>,
}

impl SandboxTemplateSpec {
    /// A template of `pod` (a PodSpec) alone.
    pub fn of_pod(pod: serde_json::Value) -> SandboxTemplateSpec {
        SandboxTemplateSpec {
            blueprint: Blueprint {
                pod_template: PodTemplate { spec: pod, ..Default::default() },
                ..Default::default()
            },
            network_policy: None,
            network_policy_management: None,
            env_vars_injection_policy: None,
            volume_claim_templates_policy: None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NameRef {
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct UpdateStrategy {
    /// `Recreate` or `OnReplenish`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

/// `extensions.agents.x-k8s.io` SandboxWarmPool: `replicas` sandboxes of a
/// SandboxTemplate kept warm, here as an ember pool on the node.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "extensions.agents.x-k8s.io", version = "v1beta1", kind = "SandboxWarmPool", namespaced)]
#[kube(status = "SandboxWarmPoolStatus", shortname = "swp")]
#[kube(scale(
    spec_replicas_path = ".spec.replicas",
    status_replicas_path = ".status.replicas",
    label_selector_path = ".status.selector"
))]
#[kube(printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"))]
#[kube(printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"))]
#[kube(printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default)]
    pub sandbox_template_ref: NameRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxWarmPoolStatus {
    /// Warm sandboxes (idle and starting).
    #[serde(default)]
    pub replicas: i32,
    /// Idle sandboxes a claim is answered from now.
    #[serde(default)]
    pub ready_replicas: i32,
    #[serde(default)]
    pub selector: String,
    #[serde(default)]
    pub observed_generation: i64,
    /// ember's own: why the pool is not served (no such template, the node
    /// refused); agent-sandbox's clients ignore it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    pub name: String,
    pub value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_name: Option<String>,
}

/// `extensions.agents.x-k8s.io` SandboxClaim: a sandbox taken from a warm
/// pool. Deleting it removes the sandbox.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(group = "extensions.agents.x-k8s.io", version = "v1beta1", kind = "SandboxClaim", namespaced)]
#[kube(status = "SandboxClaimStatus", shortname = "sandboxclaim")]
#[kube(printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type=='Ready')].status"))]
#[kube(printcolumn(name = "Sandbox", type_ = "string", json_path = ".status.sandbox.name"))]
#[kube(printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type=='Ready')].reason"))]
#[kube(printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"))]
#[serde(rename_all = "camelCase")]
pub struct SandboxClaimSpec {
    pub warm_pool_ref: NameRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_pod_metadata: Option<PodMetadata>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "preserved_list")]
    pub volume_claim_templates: Vec<serde_json::Value>,
}

/// The claim's sandbox: the Sandbox resource's name (its clients send it as
/// `X-Sandbox-ID` to the router).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClaimedSandbox {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, rename = "podIPs", skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxClaimStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default)]
    pub sandbox: ClaimedSandbox,
}

/// Every agent-sandbox CRD, in a fixed order.
pub fn all() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    vec![Sandbox::crd(), SandboxTemplate::crd(), SandboxClaim::crd(), SandboxWarmPool::crd()]
}

/// The agent-sandbox CRDs as the chart's `crds/agents.x-k8s.io.yaml`.
pub fn yaml() -> Result<String, serde_yaml::Error> {
    crate::crd::yaml_of(&all(), "crates/ember-operator/src/agents/crd.rs")
}
