//! The claim path: pop an idle sandbox, bind the caller's request to it through
//! its agent, persist, answer. No namespace, mount, cgroup or network is
//! created here; the only disk write is the sandbox's small record, which
//! must be in place before the answer so a restart can never return a claimed
//! sandbox to the pool (its fsync follows the answer: `Store::save_deferred`). A record that cannot be written ends the sandbox: it
//! was bound to this caller, who is told the claim failed. A sandbox that
//! ended between its pop and its claim costs nothing: the next one is tried.
use super::Pool;
use super::Pools;
use crate::record::{now_ms, LaunchRecord, SandboxRecord};
use crate::sandbox::{ClaimPatch, Command};
use crate::EngineError;
use ember_types::lifecycle::Lifecycle;
use ember_types::{SandboxSpec, TerminationReason};
use std::sync::Arc;
use std::time::Instant;
use tracing::{info_span, Instrument};

impl Pools {
    /// Claims an idle sandbox of `pool` for `spec`; `Ok(None)` on a miss.
    pub(crate) async fn claim(
        self: &Arc<Self>,
        pool: &Arc<Pool>,
        spec: &SandboxSpec,
        req: &crate::CreateSandbox,
        t0: Instant,
    ) -> Result<Option<SandboxRecord>, EngineError> {
        self.gate.claimed();
        while let Some(id) = pop_traced(pool) {
            let Ok(entry) = self.sandboxes.entry(id.as_str()) else {
                tracing::info!(sandbox = %id, "idle member gone before its claim; trying the next");
                continue;
            };
            match self.claim_member(&entry, spec, req, t0, "warm").await {
                Ok(Some(rec)) => {
                    pool.record_claim();
                    return Ok(Some(rec));
                }
                Ok(None) => continue,
                Err(e) => {
                    // A refused lease is the caller's error; the sandbox goes
                    // back, unclaimed.
                    if matches!(e, EngineError::Workspace(_)) {
                        pool.idle.lock().unwrap_or_else(|p| p.into_inner()).push_front(id);
                    }
                    return Err(e);
                }
            }
        }
        tracing::info!(pool = %pool.spec().name, "pool miss: no idle member");
        pool.record_miss();
        Ok(None)
    }

    /// Binds `req` to the idle member `entry` (a pool's, or a rebind's
    /// standby: `kind` says which, as its launch record will). `Ok(None)`:
    /// it ended before it was bound, and nobody was told of it. On a refused
    /// workspace lease it stays idle; on any other error it is ended.
    pub(crate) async fn claim_member(
        &self,
        entry: &Arc<crate::sandbox::Entry>,
        spec: &SandboxSpec,
        req: &crate::CreateSandbox,
        t0: Instant,
        kind: &str,
    ) -> Result<Option<SandboxRecord>, EngineError> {
        let r = entry.snapshot();
        let id = r.id.clone();
        if r.lifecycle != Lifecycle::Pooled {
            tracing::info!(sandbox = %id, lifecycle = ?r.lifecycle, "idle member no longer pooled; trying the next");
            return Ok(None);
        }
        // Workspaces first: the entrypoint may need them.
        let bound = self.workspaces.attach_workspaces(&r, &req.workspaces);
        let mounted = match bound.instrument(info_span!("workspace_bind", sandbox = %id)).await {
            Ok(m) => m,
            Err(e) => {
                if !matches!(e, EngineError::Workspace(_)) {
                    // A mount that failed half-way: this sandbox is not clean.
                    entry.tell(Command::Stop(TerminationReason::RuntimeError(e.to_string())));
                }
                return Err(e);
            }
        };
        let agent_claim = serde_json::json!({
            "env": spec.env,
            "uid": spec.user.uid,
            "gid": spec.user.gid,
            "entrypoint": spec.entrypoint,
            // Written before the entrypoint starts; never stored.
            "secrets": req.secrets,
        });
        let now = now_ms();
        let patch = ClaimPatch {
            spec: spec.clone(),
            image_uri: req.image_uri.clone(),
            workspaces: mounted.clone(),
            created_at_ms: now,
            expires_at_ms: spec.ttl_secs.map(|t| ember_types::limits::expiry_ms(now, t)),
            launch: LaunchRecord { kind: kind.into(), micros: 0, phases: Default::default() },
            t0,
            agent_claim,
            span: tracing::Span::current(),
        };
        // Someone waits on it now: while the node recovers, ahead of the
        // node's busy sandboxes, as a launch is (`native/weight.rs`).
        if let Err(e) = self.sandboxes.rt(&r.spec.runtime_class).claimed(&id, &r.spec) {
            tracing::warn!(sandbox = %id, error = %e, "a claimed sandbox's CPU weight; left as it was");
        }
        let saved = entry.ask(Command::Claim(Box::new(patch))).instrument(info_span!("claim_record")).await;
        let rec = match saved {
            Ok(rec) => rec,
            Err(e) => {
                self.workspaces.release_leases(id.as_str(), &mounted);
                if lost_race(&entry.snapshot().lifecycle, &e) {
                    // It ended after its pop (died, or its monitor ended
                    // it): nobody was told of it, so the next one will do.
                    tracing::info!(sandbox = %id, error = %e, "pooled sandbox ended before its claim; trying the next");
                    return Ok(None);
                }
                let reason = TerminationReason::RuntimeError(format!("claim not recorded: {e}"));
                entry.tell(Command::Stop(reason));
                return Err(e);
            }
        };
        let micros = rec.launch.as_ref().map_or(0, |l| l.micros);
        tracing::info!(sandbox = %id, micros, kind, "claimed an idle member");
        self.sandboxes.observe_launch(&rec.spec, kind, micros);
        Ok(Some(rec))
    }
}

/// Pops an idle member in a span of its own, closed on return (a span in
/// the `while let` would live through the whole claim).
fn pop_traced(pool: &Pool) -> Option<ember_types::SandboxId> {
    info_span!("pool_pop").in_scope(|| pool.pop_idle())
}

/// Whether a refused `Claim` means the pooled sandbox ended between its pop
/// and the command (its monitor is gone, or its lifecycle left `Pooled`),
/// rather than a claim that could not be recorded (which stays `Pooled`).
fn lost_race(now: &Lifecycle, e: &EngineError) -> bool {
    matches!(e, EngineError::NotFound(_)) || *now != Lifecycle::Pooled
}
