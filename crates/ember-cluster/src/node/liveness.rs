//! Before a node's sandboxes are rebound, the node itself is asked.
//!
//! The registry's verdict (`registry.rs`: silent for [`DEAD_AFTER`] of this
//! node's own beats) is fast and needs no answer from the silent node, which
//! is what detection wants (MTTD). A rebind is costlier to get wrong: it
//! re-creates every rebind sandbox of the node from its last checkpoint, and
//! on the 300-session drill live nodes were taken for dead after the stream
//! leader's election (their beats landed seconds after the first node's
//! did): 320 sessions of 7 live nodes rebound, each restore starving the
//! next node's heartbeat. So the rebinding node asks first
//! (`NodeCall::Liveness`): a node that answers that its heartbeat got through
//! within [`FREEZE_AFTER`] is renewing, has frozen nothing, and keeps its
//! sandboxes; this node's view of it lags. No answer within [`PROBE_WAIT`]
//! (down: a SIGKILLed node refuses at once; cut off: the wait runs out), an
//! error, or a renewal older than that (it froze its copies) is dead.
//!
//! [`DEAD_AFTER`]: super::registry::DEAD_AFTER
use super::plane::ClusterPlane;
use super::rebind::FREEZE_AFTER;
use ember_engine::{EngineError, Liveness};
use std::collections::HashSet;
use std::time::Duration;

/// How long the question waits for an answer.
pub const PROBE_WAIT: Duration = Duration::from_secs(1);

impl ClusterPlane {
    /// Of `silent` (nodes the registry takes for dead), those confirmed dead
    /// by asking them, all at once.
    pub(super) async fn confirmed_dead(&self, silent: HashSet<String>) -> HashSet<String> {
        let asked = silent.into_iter().map(|name| async move {
            let answer = match self.nodes.last_seen(&name) {
                Some(info) => self.fwd.liveness(&name, &info.advertise, PROBE_WAIT).await,
                None => Err(EngineError::Internal(format!("node {name}: never heard of"))),
            };
            if !is_dead(&answer) {
                tracing::info!(node = %name, ?answer, "silent in the node registry, but its heartbeats get through: its sandboxes stay");
            }
            is_dead(&answer).then_some(name)
        });
        futures_util::future::join_all(asked).await.into_iter().flatten().collect()
    }
}

/// The verdict on a silent node's answer: dead unless it said its heartbeat
/// got through within [`FREEZE_AFTER`] (so it has not frozen its sandboxes).
pub(super) fn is_dead(answer: &Result<Liveness, EngineError>) -> bool {
    !matches!(answer, Ok(Liveness { renewed_ms_ago: Some(ms) }) if Duration::from_millis(*ms) < FREEZE_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn renewed(ms: Option<u64>) -> Result<Liveness, EngineError> {
        Ok(Liveness { renewed_ms_ago: ms })
    }

    #[test]
    fn a_silent_node_that_renews_is_not_dead_and_every_other_answer_is() {
        assert!(!is_dead(&renewed(Some(300))), "renewing: its sandboxes stay");
        assert!(is_dead(&renewed(Some(FREEZE_AFTER.as_millis() as u64))), "it froze its copies");
        assert!(is_dead(&renewed(None)), "never renewed");
        let down = EngineError::NodeUnavailable { node: "a".into(), reason: "connection refused".into() };
        assert!(is_dead(&Err(down)), "no answer");
    }
}
