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
pub struct ClassStateLabels {
    pub state: String,
    pub runtime_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool: String,
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
    /// Set at scrape time from the records (`Sandboxes::refresh_gauges`).
    pub sandboxes_by_class: Family<ClassStateLabels, Gauge>,
    /// Time from an execd `POST /command` reaching the API to the end of its
    /// streamed reply (the command's run included), observed by the proxy.
    pub exec_seconds: Histogram,
    pub pools: PoolGauges,
    /// Spare workspace volumes ready, and creates that took one (copied from
    /// the store by the refill loop, `workspaces::spare_loop`).
    pub workspace_spares_ready: Gauge,
    pub workspace_spares_taken: Counter,
    /// The mounts a native launch copies (set at scrape time): flat, or
    /// every launch slows with the sandboxes on the host.
    pub launch_table_mounts: Gauge,
}

/// Per-pool figures, copied from the pools at scrape time, so the claim path
/// takes no lock for them.
#[derive(Default)]
pub struct PoolGauges {
    pub idle: Family<PoolLabels, Gauge>,
    pub starting: Family<PoolLabels, Gauge>,
    pub target: Family<PoolLabels, Gauge>,
    pub claimed: Family<PoolLabels, Gauge>,
    pub claims: Family<PoolLabels, Counter>,
    pub misses: Family<PoolLabels, Counter>,
}

impl PoolGauges {
    fn register(&self, r: &mut Registry) {
        r.register("pool_idle", "Idle members, per pool", self.idle.clone());
        r.register("pool_starting", "Members starting, per pool", self.starting.clone());
        r.register("pool_target", "The idle target the sizing arithmetic chose, per pool", self.target.clone());
        r.register("pool_claimed", "Live sandboxes claimed from the pool", self.claimed.clone());
        r.register("pool_claims", "Claims served from idle members, per pool", self.claims.clone());
        r.register("pool_misses", "Claims that found no idle member, per pool", self.misses.clone());
    }
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
        // The catch-all rule's series exists from the start (at 0), so a
        // dashboard's denied-flows panel has a series before the first denial.
        let _ = network_denied.get_or_create(&RuleLabels { rule: "default".into() });
        let sandboxes_by_class = Family::<ClassStateLabels, Gauge>::default();
        registry.register(
            "sandboxes_by_class",
            "Sandboxes by state and runtime class (only the non-zero pairs)",
            sandboxes_by_class.clone(),
        );
        let exec_seconds = launch_histogram();
        registry.register(
            "exec_seconds",
            "execd command time through the API, request to end of stream",
            exec_seconds.clone(),
        );
        let pools = PoolGauges::default();
        pools.register(&mut registry);
        let workspace_spares_ready = Gauge::default();
        registry.register(
            "workspace_spares_ready",
            "Workspace volumes made ahead and ready to be taken by a create",
            workspace_spares_ready.clone(),
        );
        let workspace_spares_taken = Counter::default();
        registry.register(
            "workspace_spares_taken",
            "Workspace creates (restores included) that took a spare volume",
            workspace_spares_taken.clone(),
        );
        let launch_table_mounts = Gauge::default();
        registry.register(
            "launch_table_mounts",
            "Mounts in the table a native launch copies (its clone copies each)",
            launch_table_mounts.clone(),
        );
        Metrics {
            registry,
            launch_seconds,
            created,
            create_failures,
            terminated,
            sandboxes,
            network_denied,
            sandboxes_by_class,
            exec_seconds,
            pools,
            workspace_spares_ready,
            workspace_spares_taken,
            launch_table_mounts,
        }
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
