//! Domain types shared by every ember crate: ids, quantities, sandbox specs and
//! states, and the execd wire types the agent and the clients both speak.
//!
//! This crate does no IO and depends on nothing but serde, thiserror, http (header
//! maps, for the proxies' shared header rules) and base64 (the
//! exact output bytes of an execd event), so the
//! agent, the engine and the clients can all use it.
#![forbid(unsafe_code)]

pub mod agent_sandbox;
pub mod api;
pub mod execd;
pub mod id;
pub mod image;
pub mod lifecycle;
pub mod limits;
pub mod network;
pub mod proxy;
pub mod quantity;
pub mod sandbox;
pub mod sandbox_snapshot;
pub mod secrets;
pub mod stats;
pub mod task;
pub mod tenant;

pub use api::ResourcesSpec;
pub use id::{IdError, SandboxId};
pub use network::{
    DeniedFlow, DeniedFlowList, EgressAction, EgressPolicy, EgressRule, EgressTarget, NetworkInfo, NetworkNodeInfo,
};
pub use quantity::{parse_cpu_millis, parse_memory_bytes, QuantityError};
pub use sandbox::{
    BoundaryReport, NetworkMode, Resources, SandboxSpec, SandboxState, TerminationReason, TransitionError, UserSpec,
    VolumeMount,
};
pub use stats::SandboxStats;
