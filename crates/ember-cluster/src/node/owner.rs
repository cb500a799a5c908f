//! Which node holds a sandbox, and where a new one goes: this node's engine
//! first, then the sandbox registry (a rebind sandbox being re-created
//! elsewhere is a 503, not a 404), the node registry's liveness, and
//! best-of-two placement on free memory.
use super::plane::{registry_error, ClusterPlane};
use super::rebind::RebindEntry;
use super::registry::{NodeInfo, SandboxEntry};
use crate::retry::{again, retry, RETRY_BUDGET};
use ember_engine::EngineError;

/// Where a sandbox call runs.
pub(super) enum Owner {
    Here,
    Node(NodeInfo),
}

impl ClusterPlane {
    /// Which node holds sandbox `id` now (see the module docs); a call
    /// asks [`Self::owner`], which waits out a rebind.
    pub(super) async fn owner_now(&self, id: &str) -> Result<Owner, EngineError> {
        // Being re-created here: the engine lists it once it starts, before
        // its workspaces are mounted into it, and an exec that reached it
        // then found `/workspace` empty (the drill's first append after a
        // rebind, `Permission denied`; `cluster/rebind_many.rs`).
        if self.fence.is_rebinding(id) {
            return Err(EngineError::NodeUnavailable {
                node: self.cfg.name.clone(),
                reason: format!("sandbox {id} is being re-created on it"),
            });
        }
        if !self.cfg.api_only {
            match self.local.get(id).await {
                Ok(_) => return Ok(Owner::Here),
                Err(EngineError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        // Ids are UUIDs; anything else is no key of the registry.
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(EngineError::NotFound(id.to_string()));
        }
        // Through an election of the bucket's stream: latency, not an error
        // (the queue's retry policy, `retry.rs`).
        let entry = retry(RETRY_BUDGET, "read the sandbox registry", id, || async {
            self.sandboxes.get(id).await.map_err(again)
        })
        .await
        .map_err(|e| registry_error("read", id, &e))?;
        let Some(entry) = entry.and_then(|b| serde_json::from_slice::<SandboxEntry>(&b).ok()) else {
            return Err(self.not_here(id));
        };
        if entry.node == self.cfg.name {
            // The registry lags a removal here, or a rebind elsewhere.
            return Err(self.not_here(id));
        }
        self.live_node(&entry.node, &format!("sandbox {id} is on it")).map(Owner::Node)
    }

    /// Sandbox `id` is not on this node and the sandbox registry names no
    /// other: gone (404), unless it is a rebind sandbox that another node
    /// is re-creating (its copy here was just removed, or this node is its
    /// old one): then a 503, which clients retry, until the new copy is
    /// published (the drill's clients read 404 there and gave up).
    fn not_here(&self, id: &str) -> EngineError {
        let entry =
            self.rebind_seen.get(id).and_then(|v| serde_json::from_slice::<super::rebind::RebindEntry>(&v).ok());
        match recreating(&self.cfg.name, entry.as_ref()) {
            Some(node) => EngineError::NodeUnavailable {
                node: node.to_string(),
                reason: format!("sandbox {id} is being re-created on it"),
            },
            None => EngineError::NotFound(id.to_string()),
        }
    }

    /// Node `name` if it is live, else `NodeUnavailable` saying `what`.
    pub(super) fn live_node(&self, name: &str, what: &str) -> Result<NodeInfo, EngineError> {
        self.nodes.get(name).map_err(|silent| EngineError::NodeUnavailable {
            node: name.to_string(),
            reason: format!(
                "{what}, and it is dead (no heartbeat for {})",
                silent.map_or("ever".to_string(), |d| format!("{d:?}"))
            ),
        })
    }

    /// Best of two on free memory among the live nodes that run sandboxes.
    pub(super) fn place(&self) -> Result<NodeInfo, EngineError> {
        let candidates: Vec<NodeInfo> = self.nodes.live().into_iter().filter(|n| !n.api_only).collect();
        let pick = || candidates.get(fastrand::usize(..candidates.len().max(1))).cloned();
        match (pick(), pick()) {
            (Some(a), Some(b)) => Ok(if b.free_memory_bytes > a.free_memory_bytes { b } else { a }),
            _ => Err(EngineError::Internal("no live node of the cluster runs sandboxes".into())),
        }
    }
}

/// The node re-creating a rebind sandbox that node `me` has no copy of
/// and the sandbox registry names no other node for: the entry's, when it
/// is another node's or still pending; `None` when the sandbox is gone
/// (no entry, or this node's and done: it was removed here).
pub(super) fn recreating<'a>(me: &str, entry: Option<&'a RebindEntry>) -> Option<&'a str> {
    entry.filter(|e| e.node != me || e.pending).map(|e| e.node.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_engine::CreateSandbox;

    fn entry(node: &str, pending: bool) -> RebindEntry {
        RebindEntry { node: node.into(), pending, req: CreateSandbox::default() }
    }

    #[test]
    fn a_sandbox_moving_to_another_node_is_unavailable_not_gone() {
        // Rebound elsewhere while this node's copy was removed: 503 there.
        assert_eq!(recreating("a", Some(&entry("b", false))), Some("b"));
        assert_eq!(recreating("a", Some(&entry("b", true))), Some("b"));
        // Claimed here, not created yet.
        assert_eq!(recreating("a", Some(&entry("a", true))), Some("a"));
        // This node's and done, yet not here: removed. No entry: gone.
        assert_eq!(recreating("a", Some(&entry("a", false))), None);
        assert_eq!(recreating("a", None), None);
    }
}
