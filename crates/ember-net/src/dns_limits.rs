//! What one sandbox may cost the node's resolver: a bounded number of queries
//! in flight (each holds a task, an upstream socket and up to
//! `UPSTREAM_TIMEOUT`), and a rate of `nft` runs (each pin forks `nft`), so a
//! sandbox flooding its resolver slows down itself, not the node.
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// Queries one slot may have in flight; past it, new ones are dropped
/// unanswered (the client retries, as after a lost packet).
pub(crate) const MAX_INFLIGHT_PER_SLOT: usize = 32;
/// `nft` pin updates one slot may make in a burst...
pub(crate) const PIN_BURST: u32 = 20;
/// ...and per second after it. Answers whose addresses are all pinned already
/// need no update and go out regardless; the others get SERVFAIL.
pub(crate) const PIN_PER_SEC: u32 = 5;

struct Slot {
    inflight: usize,
    /// Pin tokens, refilled at `PIN_PER_SEC` up to `PIN_BURST`.
    tokens: f64,
    refilled: Instant,
}

/// Per-slot counters. A std Mutex: held only to read or bump a counter,
/// never across an await.
pub(crate) struct SlotLimits {
    slots: Mutex<HashMap<u32, Slot>>,
}

/// One query in flight for a slot; ends when dropped.
pub(crate) struct InFlight {
    limits: Arc<SlotLimits>,
    slot: u32,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(s) = self.limits.lock().get_mut(&self.slot) {
            s.inflight = s.inflight.saturating_sub(1);
        }
    }
}

impl SlotLimits {
    pub fn new() -> Arc<SlotLimits> {
        Arc::new(SlotLimits { slots: Mutex::new(HashMap::new()) })
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<u32, Slot>> {
        self.slots.lock()
    }

    /// `f` on `slot`'s counters; a slot first seen at `now` starts with a full burst.
    fn with_slot<T>(&self, slot: u32, now: Instant, f: impl FnOnce(&mut Slot) -> T) -> T {
        let mut m = self.lock();
        let s = m.entry(slot).or_insert_with(|| Slot { inflight: 0, tokens: f64::from(PIN_BURST), refilled: now });
        f(s)
    }

    /// A place for one more query of `slot`, or `None` if it has
    /// [`MAX_INFLIGHT_PER_SLOT`] in flight.
    pub fn begin(self: &Arc<Self>, slot: u32) -> Option<InFlight> {
        let ok = self.with_slot(slot, Instant::now(), |s| {
            let ok = s.inflight < MAX_INFLIGHT_PER_SLOT;
            s.inflight += usize::from(ok);
            ok
        });
        ok.then(|| InFlight { limits: self.clone(), slot })
    }

    /// Takes one `nft` update for `slot` if its rate allows.
    pub fn take_pin(&self, slot: u32) -> bool {
        self.take_pin_at(slot, Instant::now())
    }

    /// [`Self::take_pin`] at time `now` (tests pass their own clock).
    fn take_pin_at(&self, slot: u32, now: Instant) -> bool {
        self.with_slot(slot, now, |s| {
            let refill = now.duration_since(s.refilled).as_secs_f64() * f64::from(PIN_PER_SEC);
            s.tokens = (s.tokens + refill).min(f64::from(PIN_BURST));
            s.refilled = s.refilled.max(now);
            let ok = s.tokens >= 1.0;
            if ok {
                s.tokens -= 1.0;
            }
            ok
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn in_flight_queries_are_bounded_per_slot() {
        let l = SlotLimits::new();
        let held: Vec<_> = (0..MAX_INFLIGHT_PER_SLOT).map(|_| l.begin(7).expect("under the bound")).collect();
        assert!(l.begin(7).is_none(), "one past the bound is refused");
        assert!(l.begin(8).is_some(), "another slot has its own bound");
        drop(held.into_iter().next());
        assert!(l.begin(7).is_some(), "a finished query frees its place");
    }

    #[test]
    fn pin_updates_are_rate_limited_per_slot() {
        let l = SlotLimits::new();
        let t0 = Instant::now();
        let burst = (0..1000).take_while(|_| l.take_pin_at(3, t0)).count();
        assert_eq!(burst, PIN_BURST as usize);
        assert!(!l.take_pin_at(3, t0));
        assert!(l.take_pin_at(4, t0), "another slot has its own budget");
        let t2 = t0 + Duration::from_secs(2);
        let refilled = (0..1000).take_while(|_| l.take_pin_at(3, t2)).count();
        assert_eq!(refilled, 2 * PIN_PER_SEC as usize);
    }
}
