//! ember's Kubernetes operator, first step: ember's own CRDs (`crd.rs`,
//! group `ember.run`) and the reconcilers that drive single ember nodes
//! through their HTTP API (`ember-client`): SandboxPool → the node's warm
//! pool (`pool.rs`), SandboxClaim → a sandbox claimed from it (`claim.rs`),
//! Sandbox → a sandbox started cold per resource (`sandbox.rs`),
//! SandboxTemplate → an ember template (`template.rs`), Workspace → an
//! ember workspace (`workspace.rs`).
//! Each reconciler is a pure plan (observed + desired → one action) with the
//! IO around it in `controller.rs`; `run` starts them. See docs/kubernetes.md.
pub mod agents;
pub mod claim;
mod claim_controller;
pub mod conditions;
pub mod controller;
pub mod crd;
pub mod lease;
pub mod pods;
pub mod pool;
pub mod sandbox;
pub mod template;
mod template_controller;
#[cfg(feature = "testing")]
pub mod testing;
pub mod workspace;
mod workspace_controller;

pub use controller::{run, Config, Leader};
// The versions the CRDs and clients are built with, for callers and tests.
pub use k8s_openapi;
pub use kube;

use sha2::{Digest, Sha256};

/// A failure of one reconcile pass; the controller retries it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("ember node {url}: {source}")]
    Ember { url: String, source: ember_client::ClientError },
    #[error("{kind} {namespace}/{name}: {message}")]
    Invalid { kind: &'static str, namespace: String, name: String, message: String },
    #[error("lease {0} lost: {1}")]
    LeaseLost(String, String),
    #[error("finalizer of {0}: {1}")]
    Finalizer(String, String),
}

/// Picks ring as rustls' process-wide provider. The workspace links rustls
/// with both ring and aws-lc-rs (other crates ask for aws-lc), and rustls
/// then refuses to guess: the first TLS connection panics. Call before
/// building a kube client; a second call is harmless.
pub fn tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The ember pool a SandboxPool drives: `k8s-<namespace>-<name>` when that
/// fits ember's pool names (1-63 of `[a-z0-9-]`), else shortened with a hash
/// of the whole so two resources never share a pool. Kubernetes names are
/// already lowercase; dots (allowed there) become dashes.
pub fn node_pool_name(namespace: &str, name: &str) -> String {
    node_pool_name_prefixed("k8s", namespace, name)
}

/// `<prefix>-<namespace>-<name>`, fitted to ember's pool names as
/// [`node_pool_name`] is (each kind of resource its own prefix).
pub fn node_pool_name_prefixed(prefix: &str, namespace: &str, name: &str) -> String {
    let plain = format!("{prefix}-{namespace}-{name}").replace('.', "-");
    if plain.len() <= 63 {
        return plain;
    }
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let hash: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    format!("{}-{hash}", plain[..52].trim_end_matches('-'))
}

/// A CRD's resources as ember's API takes them.
pub fn resources(r: &crd::Resources) -> ember_types::api::ResourcesSpec {
    ember_types::api::ResourcesSpec { memory: r.memory.clone(), cpu: r.cpu.clone(), pids: r.pids, disk: r.disk.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_pool_names_fit_ember_and_stay_apart() {
        assert_eq!(node_pool_name("default", "py"), "k8s-default-py");
        assert_eq!(node_pool_name("a.b", "c.d"), "k8s-a-b-c-d");
        let long = "x".repeat(63);
        let (a, b) = (node_pool_name(&long, "one"), node_pool_name(&long, "two"));
        assert_ne!(a, b);
        for n in [a, b] {
            assert!(
                n.len() <= 63 && n.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'),
                "{n}"
            );
        }
    }
}
