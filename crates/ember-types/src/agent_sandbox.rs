//! kubernetes-sigs/agent-sandbox's contract as ember serves it: the
//! sandbox-router's request headers (`ember serve` answers them,
//! `ember-api/src/agent_sandbox.rs`) and the sandbox metadata the operator
//! writes so the router finds a claimed sandbox without the Kubernetes API
//! (`ember-operator/src/agents`).

/// The Sandbox resource's name (the claim's `status.sandbox.name`).
pub const ID_HEADER: &str = "x-sandbox-id";
/// Its namespace; `default` when absent, as the router takes it.
pub const NAMESPACE_HEADER: &str = "x-sandbox-namespace";
/// The port in the sandbox; 8888 (the runtime's) when absent.
pub const PORT_HEADER: &str = "x-sandbox-port";
/// The port agent-sandbox's runtime (`/execute`) listens on; the router
/// answers its API itself through ember's agent.
pub const RUNTIME_PORT: u16 = 8888;

/// Sandbox metadata: the namespace of the Sandbox resource it backs.
pub const NAMESPACE_KEY: &str = "agents.x-k8s.io.namespace";
/// Sandbox metadata: the Sandbox resource's name.
pub const SANDBOX_KEY: &str = "agents.x-k8s.io.sandbox";

/// `POST /execute`'s body, as agent-sandbox's runtime and Python client
/// (`k8s-agent-sandbox`) speak it.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExecuteRequest {
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
}

/// `POST /execute`'s answer.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExecuteResponse {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: i32,
    #[serde(default)]
    pub timed_out: bool,
}
