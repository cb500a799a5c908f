//! Tasks on a cluster node. The queue is the cluster's (`JetStreamQueue`,
//! wired by `ember serve --cluster`), so submit, list, inspect and cancel
//! run on this node's engine as they are; an attempt's log stays on the
//! node whose worker ran it (named in the attempt's worker), so a read of
//! another node's attempt is forwarded there.
use super::plane::ClusterPlane;
use ember_engine::{EngineError, NodeCall, TaskLogWire};

impl ClusterPlane {
    /// `task_log` where the attempt ran: here, or on its node if that node
    /// is live (else `NodeUnavailable`: its log is on its disk).
    pub(super) async fn routed_task_log(
        &self,
        id: &str,
        attempt: Option<u32>,
        offset: u64,
    ) -> Result<(Vec<u8>, bool, u32), EngineError> {
        let rec = self.local().task(id).await?;
        let n = attempt.unwrap_or(rec.attempt());
        let ran_on = n.checked_sub(1).and_then(|i| rec.attempts.get(i as usize)).map(|a| a.node().to_string());
        let Some(node) = ran_on.filter(|node| node != self.name()) else {
            return self.local().task_log(id, attempt, offset).await;
        };
        let info = self.live_node(&node, &format!("the log of task {id}'s attempt {n} is there"))?;
        let call = NodeCall::TaskLog { id: id.into(), attempt: Some(n), offset };
        let wire: TaskLogWire = self.forward(&info, &call).await?;
        wire.into_parts().ok_or_else(|| EngineError::Internal(format!("node {node}: task log answer is not base64")))
    }
}
