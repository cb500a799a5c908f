//! Prometheus metrics of the engine. Encoded by the API's `/metrics` route.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaunchLabels {
    pub template: String,
    pub launch: String,
    pub runtime_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RuleLabels {
    pub rule: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub launch_seconds: Family<LaunchLabels, Histogram>,
    pub created: Family<LaunchLabels, Counter>,
    pub create_failures: Counter,
    pub terminated: Family<ReasonLabels, Counter>,
    pub sandboxes: Family<StateLabels, Gauge>,
    pub network_denied: Family<RuleLabels, Counter>,
}

fn launch_histogram() -> Histogram {
    // 100 µs .. ~26 s: a warm claim and a gVisor cold start on one scale.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.0001, 2.0, 19))
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("ember");
        let launch_seconds =
            Family::<LaunchLabels, Histogram>::new_with_constructor(launch_histogram as fn() -> Histogram);
        let created = Family::<LaunchLabels, Counter>::default();
        let create_failures = Counter::default();
        let terminated = Family::<ReasonLabels, Counter>::default();
        let sandboxes = Family::<StateLabels, Gauge>::default();
        registry.register("sandbox_launch_seconds", "Server-side create-to-ready time", launch_seconds.clone());
        registry.register("sandboxes_created", "Sandboxes created", created.clone());
        registry.register("sandbox_create_failures", "Sandbox creates that failed", create_failures.clone());
        registry.register("sandboxes_terminated", "Sandboxes that ended, by reason", terminated.clone());
        registry.register("sandboxes", "Sandboxes by state", sandboxes.clone());
        let network_denied = Family::<RuleLabels, Counter>::default();
        registry.register(
            "network_denied_flows",
            "Connection attempts and DNS queries denied by sandbox egress policy, by rule",
            network_denied.clone(),
        );
        Metrics { registry, launch_seconds, created, create_failures, terminated, sandboxes, network_denied }
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
