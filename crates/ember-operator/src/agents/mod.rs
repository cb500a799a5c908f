//! kubernetes-sigs/agent-sandbox's API served from ember's warm pools: its
//! CRDs (`crd.rs`, our own types for its `v1beta1` wire shape), the pure
//! mapping to ember (`plan.rs`, `extras.rs`: a claim's env and volumes) and the controllers (`controller.rs`). The
//! data plane is ember's API itself: the sandbox-router's headers are
//! answered by `ember serve` (`ember-api/src/agent_sandbox.rs`).
pub mod controller;
pub mod crd;
pub mod extras;
pub mod plan;
