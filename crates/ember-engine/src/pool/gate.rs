//! Refills leave a core to the claims.
//!
//! A launch is mostly kernel work (the clone and its new namespaces, the
//! mounts, the cgroup, the agent's exec), and a kernel built without
//! preemption (`PREEMPT(none)`, as on this project's machines) runs each of
//! those sections to its end once begun: a claim's thread that wakes meanwhile
//! waits for it whatever its nice value or CPU weight. With several refills
//! at once on a 2-core node every core was in such a section most of the time,
//! and a warm claim's p99 was 5-8 times its median. So while claims arrive,
//! the refills of all the node's pools run at most `cores − 1` at once and a
//! core is always free of them; once no claim came for [`QUIET`], they run as
//! many at once as each pool plans (a first fill, a density run), as before.
use std::time::Duration;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// How long after the last claim the refills stay capped.
pub const QUIET: Duration = Duration::from_secs(1);

/// The node's gate, shared by its pools.
#[derive(Debug)]
pub(crate) struct RefillGate {
    permits: Semaphore,
    /// When a claim last came (`None`: never).
    last_claim: std::sync::Mutex<Option<Instant>>,
}

/// Refills at once while claims arrive: all cores but one, at least one.
pub fn cap(cores: usize) -> usize {
    cores.saturating_sub(1).max(1)
}

/// How much longer the refills stay capped, `since` the last claim: `None`
/// when they are not.
pub fn capped_for(since: Option<Duration>) -> Option<Duration> {
    since.and_then(|s| QUIET.checked_sub(s)).filter(|d| !d.is_zero())
}

impl RefillGate {
    pub fn new(cores: usize) -> RefillGate {
        RefillGate { permits: Semaphore::new(cap(cores)), last_claim: std::sync::Mutex::new(None) }
    }

    /// The node's cores as the process may use them.
    pub fn for_this_node() -> RefillGate {
        RefillGate::new(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// A claim came (hit or miss).
    pub fn claimed(&self) {
        *self.last_claim.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// Waits until a refill may start: a permit while claims arrive (held by
    /// the refill until it ends), nothing to hold once they went quiet, even
    /// while it waited.
    pub async fn enter(&self) -> Option<SemaphorePermit<'_>> {
        loop {
            let since = self.last_claim.lock().unwrap_or_else(|p| p.into_inner()).map(|t| t.elapsed());
            let left = capped_for(since)?;
            tokio::select! {
                p = self.permits.acquire() => return p.ok(),
                _ = tokio::time::sleep(left) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_core_is_left_to_the_claims() {
        assert_eq!([cap(0), cap(1), cap(2), cap(8)], [1, 1, 1, 7]);
    }

    #[test]
    fn capped_only_within_the_quiet_time_after_a_claim() {
        assert_eq!(capped_for(None), None);
        assert_eq!(capped_for(Some(Duration::ZERO)), Some(QUIET));
        assert_eq!(capped_for(Some(Duration::from_millis(400))), Some(QUIET - Duration::from_millis(400)));
        assert_eq!(capped_for(Some(QUIET)), None);
        assert_eq!(capped_for(Some(QUIET * 3)), None);
    }

    /// Without claims, refills never wait for each other.
    #[tokio::test(start_paused = true)]
    async fn with_no_claim_refills_start_at_once() {
        let gate = RefillGate::new(2);
        let a = gate.enter().await;
        let b = gate.enter().await;
        assert!(a.is_none() && b.is_none());
    }

    /// While claims arrive, a second refill on a 2-core node waits for the
    /// first; when the claims go quiet, it starts without one.
    #[tokio::test(start_paused = true)]
    async fn while_claims_arrive_refills_take_turns_until_quiet() {
        let gate = Arc::new(RefillGate::new(2));
        gate.claimed();
        let first = gate.enter().await;
        assert!(first.is_some(), "a refill during claims holds a permit");
        let g = gate.clone();
        let second = tokio::spawn(async move { g.enter().await.is_some() });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!second.is_finished(), "a second refill started beside the first during claims");
        drop(first);
        assert!(second.await.expect("the second refill"), "it got the permit the first let go");

        let first = gate.enter().await;
        assert!(first.is_some(), "claims 500 ms ago still cap");
        let g = gate.clone();
        let third = tokio::spawn(async move { g.enter().await.is_some() });
        tokio::time::sleep(QUIET).await;
        assert!(third.is_finished(), "still waiting after the claims went quiet");
        assert!(!third.await.expect("the third refill"), "started without a permit once quiet");
    }
}
