//! The pool's capacity maths and the reconcile plan: pure functions, no IO.
//!
//! Model (see docs/warm-pools.md): claims arrive at rate λ (per second); a
//! claimed sandbox is replaced after the refill time W (seconds). By Little's
//! law the claims that arrive while replacements are being built average λ·W;
//! arrivals are roughly Poisson, so the count over W has standard deviation
//! √(λ·W). An idle pool of ⌈λ·W + 3·√(λ·W)⌉ covers a window's arrivals about
//! 99.9% of the time. The result is clamped to [min, max].

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
    /// 3·√(λ·W): burst headroom.
    pub headroom: f64,
    pub target: u32,
}

pub fn size(target: Target, min: u32, max: u32, arrival_per_sec: f64, refill_secs: f64) -> Sizing {
    let lw = (arrival_per_sec.max(0.0) * refill_secs.max(0.0)).min(1e6);
    let headroom = 3.0 * lw.sqrt();
    let raw = match target {
        Target::Fixed(n) => n,
        Target::Auto => (lw + headroom).ceil() as u32,
    };
    Sizing { arrival_per_sec, refill_secs, in_flight_demand: lw, headroom, target: raw.clamp(min, max.max(min)) }
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

    #[test]
    fn auto_sizing_is_littles_law_plus_headroom_within_bounds() {
        // 10 claims/s, 50 ms refill: λW = 0.5, headroom 3·√0.5 ≈ 2.12 → 3.
        let s = size(Target::Auto, 1, 100, 10.0, 0.05);
        assert_eq!(s.target, 3);
        assert!((s.in_flight_demand - 0.5).abs() < 1e-9);
        // 1000 claims/s, 20 ms: λW = 20, 3·√20 ≈ 13.4 → 34.
        assert_eq!(size(Target::Auto, 1, 100, 1000.0, 0.02).target, 34);
        // No traffic: the minimum. Heavy traffic: the maximum.
        assert_eq!(size(Target::Auto, 2, 50, 0.0, 0.01).target, 2);
        assert_eq!(size(Target::Auto, 2, 50, 1e5, 1.0).target, 50);
        assert_eq!(size(Target::Fixed(7), 2, 5, 0.0, 0.0).target, 5);
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
}
