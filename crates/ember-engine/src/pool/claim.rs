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
        let (image_uri, workspaces) = (&req.image_uri, &req.workspaces[..]);
        self.gate.claimed();
        while let Some(id) = pop_traced(pool) {
            let Ok(entry) = self.sandboxes.entry(id.as_str()) else {
                tracing::info!(sandbox = %id, "idle member gone before its claim; trying the next");
                continue;
            };
            let r = entry.snapshot();
            if r.lifecycle != Lifecycle::Pooled {
                tracing::info!(sandbox = %id, lifecycle = ?r.lifecycle, "idle member no longer pooled; trying the next");
                continue;
            }
            // Workspaces first: the entrypoint may need them. A refused lease
            // is the caller's error; the sandbox goes back, unclaimed.
            let bound = self.workspaces.attach_workspaces(&r, workspaces);
            let mounted = match bound.instrument(info_span!("workspace_bind", sandbox = %id)).await {
                Ok(m) => m,
                Err(e) => {
                    if matches!(e, EngineError::Workspace(_)) {
                        pool.idle.lock().unwrap_or_else(|p| p.into_inner()).push_front(id);
                    } else {
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
                image_uri: image_uri.clone(),
                workspaces: mounted.clone(),
                created_at_ms: now,
                expires_at_ms: spec.ttl_secs.map(|t| ember_types::limits::expiry_ms(now, t)),
                launch: LaunchRecord { kind: "warm".into(), micros: 0, phases: Default::default() },
                t0,
                agent_claim,
                span: tracing::Span::current(),
            };
            let saved = entry.ask(Command::Claim(Box::new(patch))).instrument(info_span!("claim_record")).await;
            let rec = match saved {
                Ok(rec) => rec,
                Err(e) => {
                    self.workspaces.release_leases(id.as_str(), &mounted);
                    if lost_race(&entry.snapshot().lifecycle, &e) {
                        // It ended after its pop (died, or its monitor ended
                        // it): nobody was told of it, so the next one will do.
                        tracing::info!(sandbox = %id, error = %e, "pooled sandbox ended before its claim; trying the next");
                        continue;
                    }
                    let reason = TerminationReason::RuntimeError(format!("claim not recorded: {e}"));
                    entry.tell(Command::Stop(reason));
                    return Err(e);
                }
            };
            pool.record_claim();
            let micros = rec.launch.as_ref().map_or(0, |l| l.micros);
            tracing::info!(sandbox = %id, micros, "claimed from the pool");
            self.sandboxes.observe_launch(&rec.spec, "warm", micros);
            return Ok(Some(rec));
        }
        tracing::info!(pool = %pool.spec().name, "pool miss: no idle member");
        pool.record_miss();
        Ok(None)
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
