//! The cluster's own figures, appended to the node's `/metrics`.
use super::registry::NodeInfo;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `body` (an OpenMetrics exposition) with `ember_cluster_nodes_alive`: the
/// nodes whose heartbeats this node hears, itself included;
/// `ember_cluster_rebinds_total`: the rebinds this node ran (`rebinds`); and
/// `ember_cluster_heartbeat_age_seconds`: how long ago this node's last
/// heartbeat that got through was sent (`beat_age`; absent before the
/// first); `ember_cluster_rebind_standbys`: the idle standbys this node keeps
/// for other nodes' rebind sandboxes (`standbys`). Past a second the node freezes its rebind sandboxes, and the
/// others soon take it for dead: a node cut off from NATS shows here.
pub(super) fn with_nodes(
    body: String,
    live: &[NodeInfo],
    rebinds: u64,
    beat_age: Option<std::time::Duration>,
    standbys: u64,
) -> String {
    let mut registry = Registry::with_prefix("ember_cluster");
    let alive = Gauge::<i64>::default();
    alive.set(live.len() as i64);
    registry.register("nodes_alive", "Nodes whose heartbeat this node hears, itself included", alive);
    let ran = Counter::<u64>::default();
    ran.inc_by(rebinds);
    registry.register(
        "rebinds",
        "Rebinds this node ran (a dead node's sandbox re-created here, or its steps resumed)",
        ran,
    );
    let held = Gauge::<i64>::default();
    held.set(standbys as i64);
    registry.register(
        "rebind_standbys",
        "Standbys this node keeps for other nodes' rebind sandboxes, idle (standby.rs)",
        held,
    );
    if let Some(age) = beat_age {
        let gauge = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        gauge.set(age.as_secs_f64());
        registry.register(
            "heartbeat_age_seconds",
            "How long ago this node's last heartbeat that got through was sent",
            gauge,
        );
    }
    let mut ours = String::new();
    if prometheus_client::encoding::text::encode(&mut ours, &registry).is_err() {
        return body;
    }
    ember_engine::splice_metrics(body, &ours)
}
