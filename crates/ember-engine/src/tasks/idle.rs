//! An idle worker's wait for work: only one idle worker of a node polls
//! the queue; the others wait to be woken.
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// How often the node's poller asks the queue while nothing woke it: what
/// another node submitted, and what a lapsed lease gave back, wait this
/// long at most for an idle worker here.
const POLL: Duration = Duration::from_millis(250);
/// How long the other idle workers wait without a wake-up (a safety net:
/// a lease passes the wake on, and a submit here wakes one).
const IDLE_FALLBACK: Duration = Duration::from_secs(5);

/// An idle worker's wait for work. Only one idle worker of the node polls
/// (every [`POLL`]); the others wait to be woken. On a cluster every poll
/// is three pull requests to JetStream (one per tier): every idle worker
/// polling made an idle 10-node cluster send ~480 pulls a second, the
/// nats-servers' main load at rest. A worker that leases passes the wake on
/// (`worker.rs`), so the next idle one takes the poll over at once.
pub(super) async fn wait(wake: &Notify, poller: &AtomicBool) {
    wait_for(wake, poller, POLL, IDLE_FALLBACK).await
}

async fn wait_for(wake: &Notify, poller: &AtomicBool, poll: Duration, fallback: Duration) {
    let polls = poller.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).is_ok();
    tokio::select! {
        _ = wake.notified() => {}
        _ = tokio::time::sleep(if polls { poll } else { fallback }) => {}
    }
    if polls {
        poller.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    const POLL: Duration = Duration::from_millis(20);
    const FALLBACK: Duration = Duration::from_secs(60);

    /// `workers` idle workers polling every `poll`, each counting its
    /// rounds, for `span`.
    async fn rounds(workers: u32, poll: Duration, span: Duration) -> (Arc<Notify>, Arc<AtomicU32>) {
        let (wake, poller, n) =
            (Arc::new(Notify::new()), Arc::new(AtomicBool::new(false)), Arc::new(AtomicU32::new(0)));
        for _ in 0..workers {
            let (wake, poller, n) = (wake.clone(), poller.clone(), n.clone());
            tokio::spawn(async move {
                loop {
                    n.fetch_add(1, Ordering::Relaxed);
                    wait_for(&wake, &poller, poll, FALLBACK).await;
                }
            });
        }
        tokio::time::sleep(span).await;
        (wake, n)
    }

    #[tokio::test]
    async fn one_idle_worker_polls_the_others_wait() {
        let span = Duration::from_secs(1);
        let (_, n) = rounds(4, POLL, span).await;
        // A sleep never ends early, so a slow machine only makes fewer
        // rounds: one poller makes 50 at most, plus each worker's first;
        // four pollers would make 200.
        let most = (span.as_millis() / POLL.as_millis()) as u32 + 4;
        let got = n.load(Ordering::Relaxed);
        assert!(got <= most, "{got} rounds of 4 idle workers in {span:?}: more than one polls");
        assert!(got > 4, "{got} rounds: nobody polled");
    }

    #[tokio::test]
    async fn a_wake_up_starts_one_waiting_worker() {
        // No sleep ends within the test: only the wake-up starts a round.
        let (wake, n) = rounds(4, FALLBACK, Duration::from_millis(50)).await;
        assert_eq!(n.load(Ordering::Relaxed), 4);
        wake.notify_one();
        let t = std::time::Instant::now();
        while n.load(Ordering::Relaxed) == 4 && t.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(n.load(Ordering::Relaxed), 5, "one wake-up, one more round");
    }
}
