//! Live resource figures of one sandbox (`GET /v1/sandboxes/{id}/stats`,
//! `ember stats`): read from its cgroup at each call, nothing kept.
use super::Sandboxes;
use crate::EngineError;
use ember_types::SandboxStats;

impl Sandboxes {
    /// The sandbox's cpu time, memory, pids and io with its limits. Only while
    /// it has a cgroup: running or paused, not before launch or after its end.
    pub async fn stats(&self, id: &str) -> Result<SandboxStats, EngineError> {
        let r = self.entry(id)?.snapshot();
        if r.pid.is_none() || r.state.is_terminal() {
            return Err(EngineError::NotRunning { id: r.id, state: r.state });
        }
        let rt = self.rt(&r.spec.runtime_class);
        let rid = r.id.clone();
        tokio::task::spawn_blocking(move || rt.stats(&rid))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|source| EngineError::Runtime { id: r.id, source })
    }
}
