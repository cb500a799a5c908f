//! The cluster's own figures, appended to the node's `/metrics`.
use super::registry::NodeInfo;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `body` (an OpenMetrics exposition) with `ember_cluster_nodes_alive`: the
/// nodes whose heartbeats this node hears, itself included; and
/// `ember_cluster_rebinds_total`: the rebinds this node ran (`rebinds`).
pub(super) fn with_nodes(body: String, live: &[NodeInfo], rebinds: u64) -> String {
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
    let mut ours = String::new();
    if prometheus_client::encoding::text::encode(&mut ours, &registry).is_err() {
        return body;
    }
    ember_engine::splice_metrics(body, &ours)
}
