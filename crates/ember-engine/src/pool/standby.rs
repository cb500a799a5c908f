//! Rebind standbys, the engine's side. A cluster node keeps, for each rebind
//! sandbox of another node that it would re-create first if that node died,
//! the sandbox's launch done ahead under the sandbox's id: an idle member
//! that no caller sees and no pool holds. The rebind's create claims it as a
//! warm claim would (its workspaces mounted, env, user and entrypoint told
//! to its agent) instead of starting cold, which was most of a rebind on a
//! loaded host (the 300-session drill: a cold start 399 ms of 540).
use super::Pools;
use crate::record::SandboxRecord;
use crate::EngineError;
use ember_types::lifecycle::Lifecycle;
use ember_types::{SandboxId, SandboxSpec};
use std::sync::Arc;
use std::time::Instant;

/// The pool a standby's record names. No pool can be so named (a pool's
/// name is `[a-z0-9-]`), so a restart, which finds no such pool to give it
/// back to, removes it, and the node starts it again if it is still wanted.
pub const STANDBY: &str = "rebind.standby";

impl SandboxRecord {
    /// An idle standby (claimed, it is its rebind's sandbox).
    pub fn is_standby(&self) -> bool {
        self.pool.as_deref() == Some(STANDBY) && self.lifecycle == Lifecycle::Pooled
    }
}

impl Pools {
    /// Launches standby `id` from `spec`, behind the claims as a refill is.
    pub(crate) async fn launch_standby(
        &self,
        id: SandboxId,
        spec: SandboxSpec,
        image_uri: Option<String>,
    ) -> Result<(), EngineError> {
        let _turn = self.gate.enter().await;
        self.sandboxes.launch_standby(id, spec, image_uri, Instant::now()).await.map(drop)
    }

    /// Claims standby `id` for a create resolved to `spec`, if this node has
    /// one (`Ok(None)`: none). One launched from another spec is removed and
    /// the create starts cold.
    pub(crate) async fn claim_standby(
        &self,
        id: &str,
        spec: &SandboxSpec,
        req: &crate::CreateSandbox,
        t0: Instant,
    ) -> Result<Option<SandboxRecord>, EngineError> {
        let Ok(entry) = self.sandboxes.entry(id) else { return Ok(None) };
        let r = entry.snapshot();
        if !r.is_standby() {
            return Ok(None);
        }
        if !same_launch(&r.spec, spec) || r.image_uri != req.image_uri {
            tracing::info!(sandbox = %id, "a standby of another spec: removed, the create starts cold");
            self.sandboxes.remove_any(id).await?;
            return Ok(None);
        }
        self.gate.claimed();
        let claimed = self.claim_member(&entry, spec, req, t0, "standby").await?;
        if claimed.is_none() {
            // It ended before its claim: gone for good before the create
            // starts one cold under its id, which its teardown would share.
            let _ = self.sandboxes.remove_any(id).await;
        }
        Ok(claimed)
    }

    /// The ids of this node's idle standbys.
    pub(crate) fn standbys(&self) -> Vec<String> {
        let all = crate::ListFilter { pool_members: true, ..Default::default() };
        self.sandboxes.list(&all).into_iter().filter(SandboxRecord::is_standby).map(|r| r.id.to_string()).collect()
    }

    /// Removes idle standby `id` (`NotFound`: no such standby here).
    pub(crate) async fn remove_standby(self: &Arc<Self>, id: &str) -> Result<(), EngineError> {
        match self.sandboxes.entry(id) {
            Ok(e) if e.snapshot().is_standby() => self.sandboxes.remove_any(id).await,
            _ => Err(EngineError::NotFound(id.to_string())),
        }
    }
}

/// Whether a standby launched from `have` serves a create resolved to
/// `want`: the same in all a launch fixes, whatever the claim binds.
pub(crate) fn same_launch(have: &SandboxSpec, want: &SandboxSpec) -> bool {
    let mut bound = have.clone();
    bound.env = want.env.clone();
    bound.metadata = want.metadata.clone();
    bound.entrypoint = want.entrypoint.clone();
    bound.user = want.user;
    bound.ttl_secs = want.ttl_secs;
    bound.secret_names = want.secret_names.clone();
    bound.auto_pause_secs = want.auto_pause_secs;
    bound.auto_pause_checkpoint = want.auto_pause_checkpoint;
    bound == *want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_serves_a_spec_that_differs_only_in_what_a_claim_binds() {
        let have = SandboxSpec::host("native");
        let mut want = have.clone();
        want.env.insert("K".into(), "v".into());
        want.metadata.insert("m".into(), "1".into());
        want.entrypoint = vec!["sleep".into(), "9".into()];
        want.ttl_secs = Some(60);
        assert!(same_launch(&have, &want));
        let mut other = want.clone();
        other.resources.cpu_millis = have.resources.cpu_millis + 500;
        assert!(!same_launch(&have, &other), "resources are fixed at launch");
        let mut other = want.clone();
        other.template = "python".into();
        assert!(!same_launch(&have, &other), "so is the template");
        let mut other = want;
        other.network = ember_types::NetworkMode::Egress;
        assert!(!same_launch(&have, &other), "and the network");
    }
}
