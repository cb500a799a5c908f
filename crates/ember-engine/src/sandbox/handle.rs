//! One command in the monitor: the lifecycle step checked first (a refused
//! step changes nothing), its effect done, the record written. The order of
//! effect and write is chosen so a crash in between is converged on restart
//! (`recover.rs` sets the freezer to what the record says): a freeze is
//! written before it is done, a thaw after.
use super::monitor::{Live, Monitor};
use super::{ClaimPatch, Edit};
use crate::{EngineError, SandboxRecord};
use ember_types::lifecycle::{Action, Effect, Lifecycle, LifecycleError};
use tracing::Instrument;

impl Monitor {
    pub(super) async fn pause(&mut self) -> Result<SandboxRecord, EngineError> {
        self.hold(Action::Pause).await
    }

    /// Thaws a user-paused sandbox (unless a snapshot holds a freeze), or
    /// restores a checkpointed one from its image.
    pub(super) async fn resume(&mut self) -> Result<SandboxRecord, EngineError> {
        if self.entry.snapshot().lifecycle == Lifecycle::Checkpointed {
            return self.restore().await;
        }
        self.hold(Action::Resume).await
    }

    pub(super) async fn snapshot_freeze(&mut self) -> Result<SandboxRecord, EngineError> {
        self.hold(Action::SnapshotFreeze).await
    }

    pub(super) async fn snapshot_thaw(&mut self) -> Result<SandboxRecord, EngineError> {
        self.hold(Action::SnapshotThaw).await
    }

    /// A change of the freezer's holds; the cgroup follows the first hold
    /// and the last. The user's holds are fsynced; a snapshot's dies with
    /// the daemon, so its record need not be.
    async fn hold(&mut self, action: Action) -> Result<SandboxRecord, EngineError> {
        let cur = self.entry.snapshot();
        let mut next = cur.clone();
        let effect = next.apply(action, None).map_err(|e| refusal(&cur, e))?;
        let durable = matches!(action, Action::Pause | Action::Resume);
        if effect == Some(Effect::Freeze) {
            self.save(&next, durable)?;
        }
        if let Some(effect) = effect {
            if let Err(e) = self.freeze(&cur, effect == Effect::Freeze).await {
                if effect == Effect::Freeze {
                    let _ = self.save(&cur, durable);
                }
                return Err(e);
            }
        }
        if effect != Some(Effect::Freeze) {
            if let Err(e) = self.save(&next, durable) {
                if effect == Some(Effect::Thaw) {
                    // Not recorded: the thaw must not count either.
                    let _ = self.freeze(&cur, true).await;
                }
                return Err(e);
            }
        }
        self.entry.write(next.clone());
        Ok(next)
    }

    async fn freeze(&self, rec: &SandboxRecord, frozen: bool) -> Result<(), EngineError> {
        let rt = self.engine.rt(&rec.spec.runtime_class);
        let id = rec.id.clone();
        tokio::task::spawn_blocking(move || rt.freeze(&id, frozen))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|source| EngineError::Runtime { id: rec.id.clone(), source })
    }

    fn save(&self, rec: &SandboxRecord, durable: bool) -> Result<(), EngineError> {
        match durable {
            true => self.engine.store.save(rec.id.as_str(), rec),
            false => self.engine.store.save_volatile(rec.id.as_str(), rec),
        }
    }

    /// Saves a Running gVisor sandbox to disk and stops its processes.
    pub(super) async fn checkpoint(&mut self) -> Result<SandboxRecord, EngineError> {
        let cur = self.entry.snapshot();
        let mut next = cur.clone();
        next.apply(Action::Checkpointed, None).map_err(|e| refusal(&cur, e))?;
        if self.live.is_none() {
            return Err(EngineError::NotRunning { id: cur.id, state: cur.state });
        }
        super::checkpoint::checkpoint(&self.engine, &cur).await?;
        // The Sentry has exited: its end is not the sandbox's.
        self.live = None;
        next.pid = None;
        next.start_time = None;
        next.event("checkpointed to disk".to_string());
        self.engine.persist(&next);
        self.entry.write(next.clone());
        Ok(next)
    }

    /// The restore, the record (new init), then the image goes: a crash in
    /// between loses nothing (the next restore deletes a half-restored
    /// container first).
    async fn restore(&mut self) -> Result<SandboxRecord, EngineError> {
        let cur = self.entry.snapshot();
        let mut next = cur.clone();
        next.apply(Action::Restored, None).map_err(|e| refusal(&cur, e))?;
        let launched = super::checkpoint::restore(&self.engine, &cur).await?;
        next.pid = Some(launched.pid);
        next.start_time = Some(launched.start_time);
        next.restores += 1;
        next.event(format!("restored from checkpoint in {} ms", launched.timing.total_us / 1000));
        self.live =
            Some(Live::new(launched, &self.engine, &self.entry).map_err(|e| EngineError::Internal(e.to_string()))?);
        self.engine.persist(&next);
        self.entry.write(next.clone());
        super::checkpoint::drop_image(&self.engine, &next).await;
        Ok(next)
    }

    /// A pooled sandbox becomes the caller's: its record is in place before
    /// the claim is answered, so a restart (a `kill -9` included) can never
    /// return it to the pool; it is fsynced just after, off the answer path
    /// (`Store::save_deferred`). Written on a blocking thread: the monitor
    /// runs on the runtime's workers, which the claims need.
    ///
    /// The agent is told here, by the monitor, not by the claim path: an
    /// entrypoint that exits at once ends the sandbox only after the claim
    /// is recorded, so its end is the caller's (`Exited(n)`). Told from the
    /// claim path, its exit could reach the monitor first, which then ended
    /// an idle member: gone, the claim tried the next, whose entrypoint did
    /// the same, until the pool was empty and the caller got a cold create.
    /// An agent that refuses ends its sandbox as an idle member: the claim
    /// path finds it gone and tries the next.
    pub(super) async fn claim(&mut self, p: ClaimPatch) -> Result<SandboxRecord, EngineError> {
        let cur = self.entry.snapshot();
        let mut next = cur.clone();
        next.apply(Action::Claimed, None).map_err(|e| refusal(&cur, e))?;
        // Under the claim's span, entered here too: a span's close line
        // lists the spans current where it closes.
        let told = bind(&self.entry.agent_socket, &p.agent_claim)
            .instrument(tracing::info_span!(parent: &p.span, "agent_claim"))
            .instrument(p.span.clone())
            .await;
        if let Err(e) = told {
            tracing::warn!(sandbox = %cur.id, error = %e, "pooled sandbox refused its claim; discarding it");
            self.end(ember_types::TerminationReason::RuntimeError(e)).await;
            return Err(EngineError::NotFound(cur.id.to_string()));
        }
        // Ended while it was told, with no entrypoint of the claim's to
        // explain it: still an idle member's end, and the claim tries the next.
        let ended = || self.live.as_ref().is_none_or(|l| ember_runtime::has_exited(l.pidfd.get_ref()));
        if p.spec.entrypoint.is_empty() && ended() {
            let reason = self.exit_reason().await;
            self.end(reason).await;
            return Err(EngineError::NotFound(cur.id.to_string()));
        }
        // A golden member's own workspace copies become the caller's, beside
        // those the claim mounted.
        next.workspaces.iter_mut().for_each(|w| w.pool_copy = false);
        next.workspaces.extend(p.workspaces);
        next.spec.secret_names = p.spec.secret_names;
        next.spec.env = p.spec.env;
        next.spec.metadata = p.spec.metadata;
        next.spec.entrypoint = p.spec.entrypoint;
        next.spec.user = p.spec.user;
        next.spec.ttl_secs = p.spec.ttl_secs;
        // The claim's (or its pool's) idle auto-pause: the monitor reads it
        // from the record once the claim is written.
        next.spec.auto_pause_secs = p.spec.auto_pause_secs;
        next.spec.auto_pause_checkpoint = p.spec.auto_pause_checkpoint;
        next.image_uri = p.image_uri;
        next.created_at_ms = p.created_at_ms;
        next.expires_at_ms = p.expires_at_ms;
        // The claim's time, as a cold start's: request to a ready agent, its
        // bind included (the record's write is not, in either).
        next.launch = Some(crate::record::LaunchRecord { micros: p.t0.elapsed().as_micros() as u64, ..p.launch });
        let (engine, rec) = (self.engine.clone(), next.clone());
        tokio::task::spawn_blocking(move || engine.store.save_deferred(rec.id.as_str(), &rec))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))??;
        self.entry.write(next.clone());
        Ok(next)
    }

    /// A change outside the lifecycle; it counts once written.
    pub(super) fn edit(&mut self, edit: Edit) -> Result<SandboxRecord, EngineError> {
        let cur = self.entry.snapshot();
        // An idle golden member's workspaces are recorded after its launch.
        let member_mounts = cur.lifecycle == Lifecycle::Pooled && matches!(edit, Edit::Workspaces { .. });
        if cur.lifecycle.is_hidden() && !member_mounts {
            return Err(EngineError::NotFound(cur.id.to_string()));
        }
        let not_running = || EngineError::NotRunning { id: cur.id.clone(), state: cur.state };
        let mut next = cur.clone();
        match edit {
            Edit::Workspaces { mounted, launch_micros } => {
                next.workspaces = mounted;
                if let (Some(l), Some(m)) = (next.launch.as_mut(), launch_micros) {
                    // The launch ended at `l.micros`: what follows is the mount.
                    l.phases.insert("workspaces".to_string(), m.saturating_sub(l.micros));
                    l.micros = m;
                }
            }
            Edit::NetworkPolicy(p) => {
                next.network_policy = Some(p);
                next.event("egress policy changed".to_string());
            }
            Edit::Egress(p) => next.spec.egress = p,
            Edit::Expiry(ms) if !cur.lifecycle.is_ended() => {
                next.expires_at_ms = Some(ms);
                next.event(format!("expiry renewed to {ms} ms"));
            }
            Edit::Metadata(patch) => {
                for (k, v) in patch {
                    match v {
                        Some(v) => next.spec.metadata.insert(k, v),
                        None => next.spec.metadata.remove(&k),
                    };
                }
            }
            Edit::TakeOver { labels, expires_at_ms } if matches!(cur.lifecycle, Lifecycle::Live { .. }) => {
                next.spec.metadata.extend(labels);
                next.expires_at_ms = Some(expires_at_ms);
            }
            Edit::Expiry(_) | Edit::TakeOver { .. } => return Err(not_running()),
        }
        self.engine.store.save(next.id.as_str(), &next)?;
        self.entry.write(next.clone());
        Ok(next)
    }
}

/// A refused step, as the caller's error.
fn refusal(rec: &SandboxRecord, e: LifecycleError) -> EngineError {
    let (id, state) = (rec.id.clone(), rec.state);
    if rec.lifecycle.is_hidden() {
        return EngineError::NotFound(id.to_string());
    }
    match (e.action, rec.lifecycle) {
        (Action::Resume | Action::Restored, _) => EngineError::NotPaused { id, state },
        (Action::SnapshotFreeze, _) => EngineError::SnapshotSourceState { id, state },
        (Action::Checkpointed, Lifecycle::Live { holds }) if holds.snapshots > 0 && !holds.user => {
            EngineError::Busy { id, message: "a snapshot is reading it; retry when it is done".into() }
        }
        _ => EngineError::NotRunning { id, state },
    }
}

/// How long a pooled sandbox's agent has to accept its claim.
const CLAIM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `POST /ember/v1/claim` to the agent, through the one agent client (capped
/// reply, a deadline).
async fn bind(socket: &std::path::Path, body: &serde_json::Value) -> Result<(), String> {
    let client = ember_agent_client::AgentClient::new(socket).with_timeout(CLAIM_TIMEOUT);
    let reply = client.post_json("/ember/v1/claim", body).await.map_err(|e| e.report())?;
    client.expect_success(reply).map(drop).map_err(|e| e.report())
}
