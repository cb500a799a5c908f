//! Task metrics, in a registry of their own, appended to `/metrics`.
use ember_queue::QueueStats;
use ember_types::task::Tier;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabels {
    pub tier: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

pub struct TaskMetrics {
    registry: Registry,
    /// Where a worker's time goes, per step of an attempt (see `worker.rs`).
    pub phase_seconds: Family<PhaseLabels, Histogram>,
    pub depth: Family<TierLabels, Gauge>,
    pub active: Family<TierLabels, Gauge>,
    pub lease_expiries: Counter,
    pub attempts: Family<OutcomeLabels, Counter>,
    pub queued_seconds: Family<TierLabels, Histogram>,
    pub mttd_seconds: Histogram,
}

fn seconds() -> Histogram {
    // 1 ms .. ~4.6 h.
    Histogram::new(exponential_buckets(0.001, 2.0, 24))
}

fn fine_seconds() -> Histogram {
    // 10 µs .. ~84 s: the steps of a trivial task take micro- to milliseconds.
    Histogram::new(exponential_buckets(0.000_01, 2.0, 24))
}

impl TaskMetrics {
    pub fn new() -> TaskMetrics {
        let mut registry = Registry::with_prefix("ember_task");
        let depth = Family::<TierLabels, Gauge>::default();
        let active = Family::<TierLabels, Gauge>::default();
        let lease_expiries = Counter::default();
        let attempts = Family::<OutcomeLabels, Counter>::default();
        let queued_seconds = Family::<TierLabels, Histogram>::new_with_constructor(seconds as fn() -> Histogram);
        let mttd_seconds = seconds();
        let phase_seconds = Family::<PhaseLabels, Histogram>::new_with_constructor(fine_seconds as fn() -> Histogram);
        registry.register("queue_depth", "Tasks waiting, per tier", depth.clone());
        registry.register("active", "Tasks leased or running, per tier", active.clone());
        registry.register("lease_expiries", "Leases that expired without a heartbeat", lease_expiries.clone());
        registry.register("attempts", "Attempts ended, by outcome", attempts.clone());
        registry.register("queued_seconds", "Time from (re)queue to lease, per tier", queued_seconds.clone());
        registry.register("mttd_seconds", "Last heartbeat to lease-expiry detection", mttd_seconds.clone());
        registry.register("phase_seconds", "Time a worker spends in each step of an attempt", phase_seconds.clone());
        TaskMetrics { registry, phase_seconds, depth, active, lease_expiries, attempts, queued_seconds, mttd_seconds }
    }

    pub fn outcome(&self, outcome: &str) {
        self.attempts.get_or_create(&OutcomeLabels { outcome: outcome.into() }).inc();
    }

    /// Records that a worker spent `since.elapsed()` in `phase`.
    pub fn phase(&self, phase: &str, since: std::time::Instant) {
        let l = PhaseLabels { phase: phase.into() };
        self.phase_seconds.get_or_create(&l).observe(since.elapsed().as_secs_f64());
    }

    /// The text exposition, gauges refreshed from `stats`.
    pub fn encode(&self, stats: &QueueStats) -> String {
        for t in Tier::ALL {
            let l = TierLabels { tier: t.as_str().into() };
            self.depth.get_or_create(&l).set(stats.queued[t.rank()] as i64);
            self.active.get_or_create(&l).set(stats.active[t.rank()] as i64);
        }
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }
}
