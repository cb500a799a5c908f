//! The retry policy of every call the queue makes to the cluster.
//!
//! A JetStream stream or bucket whose leader died answers nothing until its
//! Raft group elects another (4–9 s of election timeout on nats-server, 4–6 s
//! measured after a SIGKILL; docs/cluster.md). So every request that fails
//! for a reason that can pass — a timeout, no responders, no leader, a lost
//! connection — is tried again after 50 ms, doubling up to 1 s between
//! tries, for up to [`RETRY_BUDGET`] in all; only then does the caller see
//! `QueueError::Unavailable`. An election is therefore latency on the
//! caller's call, never an error. Retrying is safe because no request
//! applies twice: publishes repeat their `Nats-Msg-Id` (the stream drops the
//! duplicate inside its dedup window), key-value writes are compare-and-set
//! on a revision, and a write whose reply was lost is recognised on the next
//! try by reading the value back (`kv.rs`). And no try outlives the budget:
//! one still waiting when it is spent ends the call as unavailable.
use ember_queue::QueueError;
use std::future::Future;
use std::time::Duration;

/// How long one call keeps retrying: well past a leader election (≤ 9 s of
/// election timeout plus the client's own request timeout).
pub const RETRY_BUDGET: Duration = Duration::from_secs(30);
const FIRST_WAIT: Duration = Duration::from_millis(50);
const MAX_WAIT: Duration = Duration::from_secs(1);

/// Why one try did not give an answer.
pub(crate) enum Step {
    /// A failure that can pass: try again.
    Again(String),
    /// The answer is an error: stop.
    Fail(QueueError),
}

impl From<QueueError> for Step {
    fn from(e: QueueError) -> Self {
        Step::Fail(e)
    }
}

/// A transient failure, kept as text for the final error.
pub(crate) fn again(e: impl std::fmt::Display) -> Step {
    Step::Again(e.to_string())
}

/// Runs `f` until it answers, retrying [`Step::Again`] as documented above.
pub(crate) async fn retry<T, Fut>(
    budget: Duration,
    op: &'static str,
    id: &str,
    mut f: impl FnMut() -> Fut,
) -> Result<T, QueueError>
where
    Fut: Future<Output = Result<T, Step>>,
{
    let start = tokio::time::Instant::now();
    let mut wait = FIRST_WAIT;
    loop {
        // No try outlives the budget, whatever it waits on: a library
        // future without a deadline of its own (a pull request's answer
        // once was one) ends the call as unavailable instead of hanging it.
        let left = budget.saturating_sub(start.elapsed());
        let answer = tokio::time::timeout(left, f()).await;
        match answer.unwrap_or_else(|_| Err(Step::Again(format!("no answer within {budget:?}")))) {
            Ok(v) => return Ok(v),
            Err(Step::Fail(e)) => return Err(e),
            Err(Step::Again(reason)) => {
                if start.elapsed() + wait > budget {
                    return Err(QueueError::Unavailable { op, id: id.to_string(), reason });
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_WAIT);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A try that never answers (a library future with no deadline of its
    /// own, as `fetch`'s pull request was) must still end the call once its
    /// budget is spent. The outer bound only turns a hang into a failure.
    #[tokio::test]
    async fn a_try_that_never_answers_ends_the_call_at_its_budget() {
        let call = retry(Duration::from_millis(100), "fetch", "t0", std::future::pending::<Result<(), Step>>);
        let res = tokio::time::timeout(Duration::from_secs(60), call).await.expect("the call outlived its budget");
        assert!(matches!(res, Err(QueueError::Unavailable { op: "fetch", .. })), "{res:?}");
    }
}
