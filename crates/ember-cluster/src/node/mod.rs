//! A cluster node: the node registry and its heartbeat, the sandbox
//! registry, and [`ClusterPlane`], the [`ControlPlane`] that routes each call
//! to the node holding the sandbox (docs/cluster.md, "Nodes and routing").
//!
//! `registry.rs` the two buckets and liveness, `beat.rs` the heartbeat and
//! the sandbox registry's reconciler, `plane.rs` the routing,
//! `workspaces.rs` the workspace registry (holder, epoch, checkpoint),
//! `rebind.rs` sessions re-created on a live node when theirs dies, and the
//! freeze of a node that cannot renew,
//! `pools.rs` templates and pools as desired state (each node's share
//! planned by `share.rs`), `claims.rs` warm claims asked of nodes over NATS,
//! `elsewhere.rs` sandbox snapshot records and workspaces across nodes, `forward.rs` the
//! calls to another node's API, `liveness.rs` the question a node silent in
//! the registry is asked before its sandboxes are rebound, `takeover.rs`
//! which survivor re-creates each, `quota.rs` tenants' quotas held across
//! nodes, `tenants.rs` tenants, their keys, owner entries and tokens as the
//! cluster's state.
use async_nats::jetstream;
use ember_engine::ControlPlane;
use std::sync::Arc;
use std::time::Duration;

mod beat;
mod claims;
mod elsewhere;
mod fence;
mod forward;
mod hold;
mod liveness;
mod metrics;
mod mirror;
mod owner;
mod plane;
mod pools;
pub mod quota;
mod rebind;
mod recovery;
mod registry;
pub mod share;
mod standby;
mod takeover;
mod tasks;
mod tenant_use;
pub mod tenants;
mod workspaces;

pub use fence::REBINDS_AT_ONCE;
pub use hold::REBIND_HOLD;
pub use plane::ClusterPlane;
pub use rebind::{RebindEntry, FREEZE_AFTER};
pub use recovery::RecoveryWeight;
pub use registry::{NodeInfo, PoolLoad, SandboxEntry, DEAD_AFTER, HEARTBEAT};
pub use standby::REBIND_STANDBYS;
pub use workspaces::WorkspaceEntry;

/// The key-value buckets of a node's plane: registries and desired state.
/// The node registry is not among them: the heartbeat writes it through a
/// connection of its own (`beat.rs`), the watcher reads it.
pub(crate) struct Buckets {
    pub sandboxes: jetstream::kv::Store,
    pub workspaces: jetstream::kv::Store,
    pub rebind: jetstream::kv::Store,
    pub pools: jetstream::kv::Store,
    pub templates: jetstream::kv::Store,
}

/// How a node joins the cluster.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// `nats://host:port` of the cluster's servers.
    pub servers: Vec<String>,
    /// This node's name, unique in the cluster: `[A-Za-z0-9_-]+`.
    pub name: String,
    /// `http://host:port` other nodes reach this node's API at.
    pub advertise: String,
    /// Routes only: places no sandbox here.
    pub api_only: bool,
    /// The API key every node of the cluster shares (forwarded calls carry it).
    pub api_key: Option<String>,
    /// Prefix of the buckets (`<prefix>_nodes`, `<prefix>_sandboxes`,
    /// `<prefix>_workspaces`, `<prefix>_rebind`).
    pub prefix: String,
    /// How often the workspaces of this node's rebind sandboxes are
    /// checkpointed (`ember serve --checkpoint-every`); zero: never.
    pub checkpoint_every: Duration,
    /// How many dead nodes' sandboxes this node re-creates at once
    /// (default [`REBINDS_AT_ONCE`]).
    pub rebinds_at_once: usize,
    /// How long a call for a rebind sandbox that is being re-created (or
    /// whose dead node's copy is not claimed yet) waits for it before it
    /// answers 503 (default [`REBIND_HOLD`]; zero: at once).
    pub rebind_hold: Duration,
    /// Lowers this node's sandboxes' CPU weight while it re-creates a dead
    /// node's sandboxes, and sets it back after (`recovery.rs`).
    pub recovery: Option<RecoveryWeight>,
    /// How many standbys this node keeps at most for the rebind sandboxes
    /// of other nodes it would re-create first (default
    /// [`REBIND_STANDBYS`]; zero: none, every rebind starts cold).
    pub rebind_standbys: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("node name {0:?}: use letters, digits, '-' and '_'")]
    BadName(String),
    #[error("connect to NATS {servers:?}: {reason}")]
    Connect { servers: Vec<String>, reason: String },
    #[error("key-value bucket {name}: {reason}")]
    Bucket { name: String, reason: String },
    #[error("start the heartbeat's thread: {0}")]
    Heartbeat(std::io::Error),
}

/// Joins the cluster: connects, opens the buckets (R3 when the cluster has
/// at least 3 servers), starts the heartbeat, the node watcher and the
/// sandbox reconciler, and returns the plane the API is to be given.
pub async fn join(cfg: NodeConfig, local: Arc<dyn ControlPlane>) -> Result<Arc<ClusterPlane>, ClusterError> {
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if cfg.name.is_empty() || !cfg.name.chars().all(valid) {
        return Err(ClusterError::BadName(cfg.name));
    }
    let client = crate::connect::options(Duration::from_secs(2))
        .retry_on_initial_connect()
        .connect(cfg.servers.as_slice())
        .await
        .map_err(|e| ClusterError::Connect { servers: cfg.servers.clone(), reason: e.to_string() })?;
    let js = jetstream::new(client.clone());
    // R3 on a cluster of three servers or more (one may be lost), else R1.
    let replicas = crate::replicas::for_cluster(&client, cfg.servers.len()).await;
    let nodes = registry::open_nodes(&js, &cfg.prefix, replicas).await?;
    let bucket = |what: &str| registry::bucket(&js, format!("{}_{what}", cfg.prefix), replicas, Duration::ZERO);
    let buckets = Buckets {
        sandboxes: registry::open_sandboxes(&js, &cfg.prefix, replicas).await?,
        workspaces: bucket("workspaces").await?,
        rebind: bucket("rebind").await?,
        pools: bucket("pools").await?,
        templates: bucket("templates").await?,
    };
    tokio::spawn(crate::replicas::keep(js.clone(), cfg.prefix.clone(), replicas));
    let plane = Arc::new(ClusterPlane::new(cfg, local, buckets, client));
    registry::load_nodes(&nodes, &plane.nodes()).await?;
    tokio::spawn(registry::watch_nodes(nodes, plane.nodes()));
    plane.clone().spawn_beat().map_err(ClusterError::Heartbeat)?;
    tokio::spawn(plane.clone().upkeep());
    tokio::spawn(plane.clone().fence_watch());
    tokio::spawn(plane.clone().pulse());
    tokio::spawn(plane.clone().converge_loop());
    if !plane.api_only() {
        tokio::spawn(plane.clone().serve_claims());
    }
    if !plane.checkpoint_every().is_zero() {
        tokio::spawn(plane.clone().checkpoint_loop(plane.checkpoint_every()));
    }
    Ok(plane)
}
