//! Which nodes answer, as the drill's client sees them: what a load
//! balancer's health checks give it. A try that has waited [`PROBE_AFTER`]
//! for its answer has its node probed (`GET /health` on a connection of its
//! own, bounded by [`PROBE_WAIT`]); [`PROBE_FAILS`] failed probes in a row
//! give the try up as an unreachable node's. A node that failed a try is
//! passed over for [`DOWN_FOR`] when a session picks its next node.
//!
//! Before, a try waited up to 20 s whatever its node did, and the next node
//! was the next URL in order: in the partition drill (three neighbouring
//! nodes cut off) a session entering by the first tried the other two next,
//! each try hanging, past the 30 s retry budget (60 user-visible errors).
use ember_client::{Client, ClientError};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long a try waits before its node is probed: a JetStream election
/// holds a submit for 5-7 s on a node that answers its probes.
pub const PROBE_AFTER: Duration = Duration::from_secs(2);
/// One probe's bound (its connect included); on a 2-core host at a load
/// of 17, `/health` answered within milliseconds.
pub const PROBE_WAIT: Duration = Duration::from_secs(2);
/// Failed probes in a row that give a try up.
pub const PROBE_FAILS: u32 = 2;
/// How long a node that failed a try is passed over.
pub const DOWN_FOR: Duration = Duration::from_secs(10);

/// The nodes seen failing, by URL, and when.
#[derive(Default)]
pub struct Health {
    down: Mutex<HashMap<String, Instant>>,
}

impl Health {
    pub fn mark_down(&self, url: &str) {
        self.down.lock().insert(url.to_string(), Instant::now());
    }

    pub fn mark_up(&self, url: &str) {
        self.down.lock().remove(url);
    }

    fn is_down(&self, url: &str) -> bool {
        self.down.lock().get(url).is_some_and(|at| at.elapsed() < DOWN_FOR)
    }

    /// The index of the node to try after `cur` among `urls`, for the
    /// client `spread` (see [`next_up`]).
    pub fn next(&self, urls: &[&str], cur: usize, spread: usize) -> usize {
        next_up(urls.len(), cur, spread, |i| self.is_down(urls[i]))
    }
}

/// Of the nodes after `cur` (in order, wrapping) not `down`, the one
/// `spread` picks (its remainder by their count); the one right after
/// `cur` when every other is down. The clients of one node give different
/// `spread`s, so they part over the nodes left as a load balancer would
/// part them: before, every session of the drill's three lost nodes moved
/// to the next one in order, which routed 120 sessions' calls.
fn next_up(n: usize, cur: usize, spread: usize, down: impl Fn(usize) -> bool) -> usize {
    if n == 0 {
        return 0;
    }
    let up: Vec<usize> = (1..n).map(|k| (cur + k) % n).filter(|&i| !down(i)).collect();
    if up.is_empty() {
        return (cur + 1) % n;
    }
    up[spread % up.len()]
}

/// Whether `url` answers `GET /health` within [`PROBE_WAIT`].
async fn answers(url: &str) -> bool {
    let Ok(c) = Client::new(url, None) else { return false };
    let c = c.with_connect_timeout(PROBE_WAIT);
    matches!(tokio::time::timeout(PROBE_WAIT, c.get_raw("/health")).await, Ok(Ok((s, _))) if s.is_success())
}

/// `call` through node `url`, given up as an unreachable node's when the
/// node fails [`PROBE_FAILS`] probes in a row, or after `bound` in all.
pub async fn watched<T>(
    url: &str,
    bound: Duration,
    call: impl Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    let unreachable = |message: String| ClientError::Connect { url: url.to_string(), message };
    let watch = async {
        tokio::time::sleep(PROBE_AFTER).await;
        let mut fails = 0;
        loop {
            let t = Instant::now();
            fails = if answers(url).await { 0 } else { fails + 1 };
            if fails >= PROBE_FAILS {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1).saturating_sub(t.elapsed())).await;
        }
    };
    tokio::select! {
        res = call => res,
        () = watch => Err(unreachable(format!("no answer, and {PROBE_FAILS} health probes failed"))),
        () = tokio::time::sleep(bound) => Err(unreachable(format!("no answer within {bound:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_node_is_one_after_the_current_one_that_is_not_down() {
        let down = [false, false, true, true, false];
        assert_eq!(next_up(5, 1, 0, |i| down[i]), 4);
        assert_eq!(next_up(5, 4, 0, |i| down[i]), 0);
        // Every other node down: the one right after.
        assert_eq!(next_up(3, 0, 0, |i| i != 0), 1);
        assert_eq!(next_up(3, 0, 5, |i| i != 0), 1);
        assert_eq!(next_up(1, 0, 0, |_| false), 0);
        assert_eq!(next_up(0, 0, 0, |_| false), 0);
    }

    #[test]
    fn the_clients_of_a_lost_node_part_over_the_nodes_left() {
        // Ten nodes, three down: the clients of node 6 (spreads 0..30) go
        // to each of the seven left, none to a node down or to node 6.
        let down = |i: usize| matches!(i, 6..=8);
        let mut seen = [0u32; 10];
        for spread in 0..28 {
            seen[next_up(10, 6, spread, down)] += 1;
        }
        assert_eq!(seen, [4, 4, 4, 4, 4, 4, 0, 0, 0, 4]);
    }

    #[test]
    fn a_node_marked_down_is_passed_over_until_it_answers() {
        let h = Health::default();
        let urls = ["http://a", "http://b", "http://c"];
        h.mark_down("http://b");
        assert_eq!(h.next(&urls, 0, 0), 2);
        assert_eq!(h.next(&urls, 0, 1), 2);
        h.mark_up("http://b");
        assert_eq!(h.next(&urls, 0, 0), 1);
        assert_eq!(h.next(&urls, 0, 1), 2);
    }

    #[tokio::test]
    async fn a_try_to_a_node_that_fails_its_probes_is_given_up() {
        // Nothing listens on port 9 of loopback: every probe is refused,
        // while the call itself never answers.
        let res: Result<(), ClientError> =
            watched("http://127.0.0.1:9", Duration::from_secs(600), std::future::pending()).await;
        match res {
            Err(ClientError::Connect { message, .. }) => assert!(message.contains("health probes"), "{message}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_try_to_a_node_that_answers_its_probes_waits_for_its_answer() {
        // A server whose /health answers, and a call answering after the
        // probes have started: the call's own answer is what comes back.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else { return };
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0u8; 1024];
                    let _ = s.read(&mut buf).await;
                    let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").await;
                });
            }
        });
        let call = async {
            tokio::time::sleep(PROBE_AFTER + PROBE_WAIT + Duration::from_secs(2)).await;
            Ok::<_, ClientError>(7)
        };
        assert_eq!(watched(&url, Duration::from_secs(600), call).await.expect("answered"), 7);
    }
}
