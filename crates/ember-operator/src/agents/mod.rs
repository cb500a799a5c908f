//! kubernetes-sigs/agent-sandbox's API served from ember's warm pools: its
//! CRDs (`crd.rs`, our own types for its `v1beta1` wire shape), the pure
//! mapping to ember (`plan.rs`) and the controllers (`controller.rs`). The
//! data plane is ember's API itself: the sandbox-router's headers are
//! answered by `ember serve` (`ember-api/src/agent_sandbox.rs`).
pub mod controller;
pub mod crd;
pub mod plan;
