//! Pod mode (a SandboxPool with `mode: pod`): each sandbox a Pod with the
//! pool's `runtimeClassName` (gVisor, Kata), warm Pods the pool, a workspace
//! PVC per Pod; a claim answered from the operator's informer cache with the
//! ownership patch after the answer. The pure planner is `plan.rs`, the IO
//! around it `controller.rs`; the SandboxPool and SandboxClaim controllers
//! (`crate::controller`) hand pod-mode resources to them.
pub mod controller;
pub mod plan;
