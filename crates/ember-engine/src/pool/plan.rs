//! The pool's capacity maths and the reconcile plan: pure functions, no IO.
//!
//! Model (see docs/warm-pools.md): claims arrive as a Poisson process of rate
//! λ (per second); a claimed sandbox is replaced after the refill time W
//! (seconds). With refills that never wait for each other, the replacements
//! in flight at a claim's arrival are N ~ Poisson(λ·W), and a pool of `s`
//! misses the claim only when all `s` are being refilled. The target is the
//! smallest `s` with P(N ≥ s) ≤ [`MISS_BUDGET`]: the exact Poisson quantile
//! (the normal approximation's ⌈λW + 3√(λW)⌉ under-covers a small mean, 1–6 %
//! misses in lab 3). P(N ≥ s) bounds Erlang's loss B(s, λW), the exact miss
//! rate of that model, from above; the slack covers refills that do queue.
//!
//! Refills queue when more are due than may run at once, and a saturated
//! queue misses whatever the target (lab 3: 29 % at λW = 2.8 with a fixed two
//! at a time), so the parallelism is planned too, from the same quantile:
//! `r` = the smallest count with P(N ≥ r) ≤ the budget, clamped to
//! [2, max]. With an auto target that is the target itself, so refills never
//! wait and the miss rate is exactly Erlang B, within the budget; a larger
//! fixed target keeps the load λW / r of its refills at ≤ 0.7 up to λW ≈ 50
//! (square-root staffing above). A bound on the load alone is not enough:
//! lab 3's simulation misses 0.14 % at λW/r = 0.57 and 0.15 % at 0.49.
//! With no traffic, two at a time: a pool's first fill does not storm the node.

/// The share of claims the target may miss under the model.
pub const MISS_BUDGET: f64 = 0.001;

/// Refills at once when the demand needs no more: two cores, one start each.
pub const MIN_REFILL_PARALLEL: u32 = 2;

/// How the idle target is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// From the observed arrival rate and refill time.
    Auto,
    /// A fixed idle count (still clamped to [min, max]).
    Fixed(u32),
}

/// The inputs and result of the sizing arithmetic, shown by `ember pool inspect`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sizing {
    pub arrival_per_sec: f64,
    pub refill_secs: f64,
    /// λ·W: claims expected while one refill runs.
    pub in_flight_demand: f64,
    /// The Poisson quantile's margin over λ·W (before the clamp): burst headroom.
    pub headroom: f64,
    pub target: u32,
    /// Starts the driver may run at once.
    pub refill_parallel: u32,
}

pub fn size(target: Target, min: u32, max: u32, arrival_per_sec: f64, refill_secs: f64) -> Sizing {
    let lw = (arrival_per_sec.max(0.0) * refill_secs.max(0.0)).min(1e6);
    let max = max.max(min);
    let quantile = poisson_quantile(lw, MISS_BUDGET, max);
    let raw = match target {
        Target::Fixed(n) => n,
        Target::Auto => quantile,
    };
    Sizing {
        arrival_per_sec,
        refill_secs,
        in_flight_demand: lw,
        headroom: (f64::from(quantile) - lw).max(0.0),
        target: raw.clamp(min, max),
        refill_parallel: quantile.clamp(MIN_REFILL_PARALLEL, max.max(MIN_REFILL_PARALLEL)),
    }
}

/// The smallest `s` with P(N ≥ s) ≤ `budget` for N ~ Poisson(`mean`), or
/// `cap` if that is smaller. The pmf is stepped in log space (e^-mean
/// underflows past a mean of ~745), so at most `cap` + 1 terms are summed.
/// No arrivals need no pool: a mean of 0 gives 0.
pub fn poisson_quantile(mean: f64, budget: f64, cap: u32) -> u32 {
    if mean <= 0.0 || !mean.is_finite() {
        return 0;
    }
    let (ln_mean, mut ln_pmf, mut below) = (mean.ln(), -mean, 0.0f64);
    // Invariant: `below` = P(N < s), `ln_pmf` = ln P(N = s).
    for s in 0..cap {
        if 1.0 - below <= budget {
            return s;
        }
        below += ln_pmf.exp();
        ln_pmf += ln_mean - f64::from(s + 1).ln();
    }
    cap
}

/// What the driver should do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Start this many sandboxes.
    Create(u32),
    /// Remove this many idle sandboxes.
    Destroy(u32),
}

/// Desired idle count vs what is idle and being started → actions. Creation
/// is bounded by `parallel` so refill never starves claims of the CPU.
pub fn plan(desired: u32, idle: u32, starting: u32, parallel: u32) -> Option<Action> {
    let have = idle + starting;
    if have < desired {
        let room = parallel.saturating_sub(starting);
        (room > 0).then(|| Action::Create((desired - have).min(room)))
    } else if idle > desired && starting == 0 {
        Some(Action::Destroy(idle - desired))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// P(N ≥ s) for N ~ Poisson(mean), by the plain recurrence (small means only).
    fn tail(mean: f64, s: u32) -> f64 {
        let (mut pmf, mut below) = ((-mean).exp(), 0.0);
        for k in 0..s {
            below += pmf;
            pmf *= mean / f64::from(k + 1);
        }
        1.0 - below
    }

    #[test]
    fn auto_sizing_is_the_poisson_quantile_within_bounds() {
        // 10 claims/s, 50 ms refill: λW = 0.5; P(N ≥ 4) = 0.18 %, P(N ≥ 5) = 0.017 %.
        let s = size(Target::Auto, 1, 100, 10.0, 0.05);
        assert_eq!(s.target, 5);
        assert!((s.in_flight_demand - 0.5).abs() < 1e-9);
        // Lab 3's rates at W = 57 ms: 1/s → 3 (the normal approximation said 1
        // and missed 5.35 %), 50/s → 10.
        assert_eq!(size(Target::Auto, 0, 100, 1.0, 0.057).target, 3);
        assert_eq!(size(Target::Auto, 0, 100, 50.0, 0.057).target, 10);
        // 1000 claims/s, 20 ms: λW = 20 → 36.
        assert_eq!(size(Target::Auto, 1, 100, 1000.0, 0.02).target, 36);
        // No traffic: the minimum. Heavy traffic: the maximum.
        assert_eq!(size(Target::Auto, 2, 50, 0.0, 0.01).target, 2);
        assert_eq!(size(Target::Auto, 2, 50, 1e5, 1.0).target, 50);
        assert_eq!(size(Target::Fixed(7), 2, 5, 0.0, 0.0).target, 5);
    }

    #[test]
    fn a_huge_mean_neither_underflows_nor_loops_past_the_cap() {
        // e^-1e6 is 0 in f64: a naive pmf would never leave 0 and answer 0.
        assert_eq!(poisson_quantile(1e6, MISS_BUDGET, 10_000), 10_000);
        // Past e^-745, still the quantile: ≈ 1000 + 3.09·√1000.
        let q = poisson_quantile(1000.0, MISS_BUDGET, 10_000);
        assert!((1090..=1105).contains(&q), "{q}");
    }

    #[test]
    fn refill_parallelism_covers_the_refills_in_flight() {
        // λW = 2.85 (lab 3's 50/s): 2 starts at a time is a load of 1.4; the
        // auto target's 10 never lets a refill wait.
        let z = size(Target::Auto, 0, 100, 50.0, 0.057);
        assert_eq!((z.target, z.refill_parallel), (10, 10));
        // A fixed target does not raise it: demand does.
        assert_eq!(size(Target::Fixed(100), 0, 100, 50.0, 0.057).refill_parallel, 10);
        assert_eq!(size(Target::Fixed(100), 0, 100, 0.0, 0.057).refill_parallel, 2);
        assert_eq!(size(Target::Auto, 0, 100, 1.0, 0.057).refill_parallel, 3);
        // The pool's max caps it; a max below 2 still allows 2.
        assert_eq!(size(Target::Auto, 0, 8, 1000.0, 0.1).refill_parallel, 8);
        assert_eq!(size(Target::Fixed(1), 0, 1, 1000.0, 0.1).refill_parallel, 2);
    }

    #[test]
    fn plan_fills_with_bounded_parallelism_and_trims_only_when_settled() {
        assert_eq!(plan(10, 0, 0, 2), Some(Action::Create(2)));
        assert_eq!(plan(10, 3, 2, 2), None, "already starting as many as allowed");
        assert_eq!(plan(10, 9, 0, 2), Some(Action::Create(1)));
        assert_eq!(plan(3, 3, 0, 2), None);
        assert_eq!(plan(3, 5, 0, 2), Some(Action::Destroy(2)));
        assert_eq!(plan(3, 5, 1, 2), None, "no trimming while starts are in flight");
    }

    proptest::proptest! {
        #[test]
        fn sizing_is_monotone_bounded_and_meets_the_budget(
            rate in 0.0f64..2000.0,
            more in 0.0f64..500.0,
            refill in 0.0f64..0.5,
            min in 0u32..20,
            extra in 0u32..200,
        ) {
            let max = min + extra;
            let a = size(Target::Auto, min, max, rate, refill);
            let b = size(Target::Auto, min, max, rate + more, refill);
            proptest::prop_assert!(a.target <= b.target, "target not monotone: {a:?} {b:?}");
            proptest::prop_assert!(a.refill_parallel <= b.refill_parallel, "parallelism not monotone: {a:?} {b:?}");
            proptest::prop_assert!(a.target >= min && a.target <= max);
            proptest::prop_assert!(a.refill_parallel >= MIN_REFILL_PARALLEL);
            proptest::prop_assert!(a.refill_parallel <= max.max(MIN_REFILL_PARALLEL));
            let lw = a.in_flight_demand;
            if a.target < max && lw > 0.0 && lw < 200.0 {
                // The budget is met, and one fewer would not meet it (unless the min holds it up).
                proptest::prop_assert!(tail(lw, a.target) <= MISS_BUDGET, "{a:?}");
                if a.target > min.max(1) {
                    proptest::prop_assert!(tail(lw, a.target - 1) > MISS_BUDGET, "{a:?}");
                }
            }
            // An auto target's refills never wait: at most target are due at once.
            proptest::prop_assert!(a.refill_parallel >= a.target.min(max.max(MIN_REFILL_PARALLEL)) || a.target == min, "{a:?}");
            if a.refill_parallel < max && lw <= 50.0 {
                proptest::prop_assert!(lw / f64::from(a.refill_parallel) <= 0.7, "{a:?}");
            }
        }
    }
}
