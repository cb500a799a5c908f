//! Operations on existing sandboxes: get, list, remove, pause/resume, renew,
//! metadata, agent access, and the retention sweep.
use super::{Command, Edit, Entry, Sandboxes};
use crate::record::{now_ms, SandboxRecord};
use crate::EngineError;
use ember_types::api::{NetworkPolicy, NetworkRule};
use ember_types::lifecycle::Lifecycle;
use ember_types::limits;
use ember_types::{BoundaryReport, SandboxState};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// `state` values are OR-ed, `metadata` pairs AND-ed (OpenSandbox semantics).
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub states: Vec<SandboxState>,
    pub metadata: Vec<(String, String)>,
    /// Also the idle members of pools, which users never see: the cluster
    /// names their node in its sandbox registry before they are claimed, so
    /// a claim has no registry write on its answer's path.
    pub pool_members: bool,
}

impl Sandboxes {
    pub fn get(&self, id: &str) -> Result<SandboxRecord, EngineError> {
        // Idle pool members are the pool's, not any caller's.
        Ok(self.visible(id)?.snapshot())
    }

    /// Matching sandboxes, oldest first.
    pub fn list(&self, f: &ListFilter) -> Vec<SandboxRecord> {
        let entries = self.registry.all();
        let mut out: Vec<SandboxRecord> = entries
            .iter()
            .map(|e| e.snapshot())
            .filter(|r| !r.lifecycle.is_hidden() || (f.pool_members && r.lifecycle == Lifecycle::Pooled))
            .filter(|r| f.states.is_empty() || f.states.contains(&r.state))
            .filter(|r| f.metadata.iter().all(|(k, v)| r.spec.metadata.get(k) == Some(v)))
            .collect();
        out.sort_by(|a, b| (a.created_at_ms, a.id.as_str()).cmp(&(b.created_at_ms, b.id.as_str())));
        out
    }

    pub fn network_status(&self, id: &str) -> Result<crate::NetworkStatus, EngineError> {
        let r = self.get(id)?;
        let address = r.net_slot.filter(|_| !r.state.is_terminal()).and_then(|s| self.network.address(s));
        Ok(crate::NetworkStatus { mode: r.spec.network, policy: r.spec.egress, address })
    }

    /// Replaces the egress policy of a running sandbox with egress networking.
    pub async fn set_network_policy(
        &self,
        id: &str,
        policy: ember_types::EgressPolicy,
    ) -> Result<crate::NetworkStatus, EngineError> {
        let e = self.visible(id)?;
        let r = e.snapshot();
        if r.state.is_terminal() {
            return Err(EngineError::NotRunning { id: r.id, state: r.state });
        }
        let Some(slot) = r.net_slot.filter(|_| r.spec.network == ember_types::NetworkMode::Egress) else {
            return Err(EngineError::invalid(
                "network",
                "this sandbox was created with network \"none\"; create it with egress to give it a policy",
            ));
        };
        self.network.update(id, slot, &policy).await?;
        e.ask(Command::Edit(Edit::Egress(policy))).await?;
        self.network_status(id)
    }

    /// Blocked connection attempts and DNS queries of a sandbox, oldest first.
    pub fn network_events(&self, id: &str) -> Result<Vec<ember_types::DeniedFlow>, EngineError> {
        let r = self.get(id)?;
        Ok(self.network.events(r.id.as_str()))
    }

    /// Kills the sandbox, removes every host resource and forgets it.
    pub async fn remove(&self, id: &str) -> Result<(), EngineError> {
        self.discard(self.visible(id)?).await
    }

    /// [`Sandboxes::remove`] of any sandbox, idle pool members included.
    pub(crate) async fn remove_any(&self, id: &str) -> Result<(), EngineError> {
        self.discard(self.entry(id)?).await
    }

    async fn discard(&self, entry: Arc<Entry>) -> Result<(), EngineError> {
        match entry.ask(Command::Remove).await {
            Ok(_) => Ok(()),
            Err(EngineError::NotFound(_)) if self.entry(entry.snapshot().id.as_str()).is_ok() => {
                // Its monitor is gone (it never started, or it died): reap directly.
                let rec = entry.snapshot();
                let rt = self.rt(&rec.spec.runtime_class);
                let rid = rec.id.clone();
                tokio::task::spawn_blocking(move || rt.reap_leftover(rid.as_str()))
                    .await
                    .map_err(|e| EngineError::Internal(e.to_string()))?
                    .map_err(|source| EngineError::Runtime { id: rec.id.clone(), source })?;
                self.network.release(&rec).await;
                self.registry.remove(&rec.id);
                self.store.remove(rec.id.as_str())
            }
            Err(e) => Err(e),
        }
    }

    /// The agent's socket, for exec and file traffic; only while Running.
    /// A proxy call to the sandbox: it counts as traffic, and thaws the
    /// sandbox first if auto-pause froze it (`crate::autopause`).
    pub async fn touch(&self, id: &str) -> Result<(), EngineError> {
        let e = self.visible(id)?;
        if e.idle.touch() {
            match e.ask(Command::Resume).await {
                Ok(_) | Err(EngineError::NotPaused { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    pub fn agent_socket(&self, id: &str) -> Result<PathBuf, EngineError> {
        let e = self.visible(id)?;
        let r = e.snapshot();
        if r.state != SandboxState::Running {
            return Err(EngineError::NotRunning { id: r.id, state: r.state });
        }
        Ok(e.agent_socket.clone())
    }
}

impl Sandboxes {
    /// Freezes the sandbox for the user (a hold of its own: a snapshot's
    /// thaw does not undo it).
    pub async fn pause(&self, id: &str) -> Result<(), EngineError> {
        self.visible(id)?.ask(Command::Pause).await.map(drop)
    }

    /// Thaws a paused sandbox (it stays frozen while a snapshot reads it),
    /// or restores a checkpointed one from disk.
    pub async fn resume(&self, id: &str) -> Result<(), EngineError> {
        self.visible(id)?.ask(Command::Resume).await.map(drop)
    }

    /// Sets an absolute expiry (it may shorten the life, as in OpenSandbox).
    pub async fn renew(&self, id: &str, expires_at_ms: i64) -> Result<SandboxRecord, EngineError> {
        let e = self.visible(id)?;
        let r = e.snapshot();
        if r.state.is_terminal() {
            return Err(EngineError::NotRunning { id: r.id, state: r.state });
        }
        if r.expires_at_ms.is_none() {
            return Err(EngineError::NoExpiration(r.id));
        }
        if expires_at_ms <= now_ms() {
            return Err(EngineError::invalid("expiresAt", "must be in the future"));
        }
        // An RFC 3339 time ends in year 9999: no overflow without a maximum.
        if let Some(max) = self.max_ttl.map(|m| m.as_secs()) {
            if expires_at_ms > limits::expiry_ms(now_ms(), max) {
                return Err(EngineError::invalid("expiresAt", format!("at most {max} seconds from now")));
            }
        }
        e.ask(Command::Edit(Edit::Expiry(expires_at_ms))).await
    }

    /// JSON merge-patch of the metadata: `None` deletes a key.
    pub async fn patch_metadata(
        &self,
        id: &str,
        patch: BTreeMap<String, Option<String>>,
    ) -> Result<SandboxRecord, EngineError> {
        if let Some(k) = patch.keys().find(|k| k.starts_with("opensandbox.io/") || k.is_empty()) {
            return Err(EngineError::invalid("metadata", format!("key {k:?} is reserved or empty")));
        }
        self.visible(id)?.ask(Command::Edit(Edit::Metadata(patch))).await
    }

    /// The recorded egress policy; none recorded reads as deny-all, which is
    /// what a sandbox without network has.
    pub fn egress_policy(&self, id: &str) -> Result<NetworkPolicy, EngineError> {
        let r = self.visible(id)?.snapshot();
        if r.spec.network == ember_types::NetworkMode::Egress {
            return Ok(crate::network::egress_to_wire(&r.spec.egress));
        }
        Ok(r.network_policy.unwrap_or_else(|| NetworkPolicy { default_action: Some("deny".into()), egress: vec![] }))
    }

    /// Merges rules into the recorded policy by target (a new rule replaces
    /// the one with its target; within `rules` the first per target wins).
    pub async fn patch_egress(&self, id: &str, rules: Vec<NetworkRule>) -> Result<NetworkPolicy, EngineError> {
        for r in &rules {
            if !["allow", "deny"].contains(&r.action.as_str()) || r.target.trim().is_empty() {
                return Err(EngineError::invalid("rules", format!("{r:?}: action allow|deny and a target are needed")));
            }
        }
        self.update_policy(id, |p| {
            let mut seen = std::collections::HashSet::new();
            for rule in rules.into_iter().filter(|r| seen.insert(r.target.clone())) {
                match p.egress.iter_mut().find(|x| x.target == rule.target) {
                    Some(x) => *x = rule,
                    None => p.egress.push(rule),
                }
            }
        })
        .await
    }

    /// Removes the rules of these targets (absent targets are fine).
    pub async fn delete_egress(&self, id: &str, targets: Vec<String>) -> Result<NetworkPolicy, EngineError> {
        self.update_policy(id, |p| p.egress.retain(|r| !targets.contains(&r.target))).await
    }

    /// Whether the sandbox's egress policy is enforced (it has egress networking).
    pub fn egress_enforced(&self, id: &str) -> Result<bool, EngineError> {
        Ok(self.visible(id)?.snapshot().spec.network == ember_types::NetworkMode::Egress)
    }

    /// Changes the policy; on a sandbox with egress networking the change is
    /// enforced (one nftables transaction) before it is recorded.
    async fn update_policy(&self, id: &str, f: impl FnOnce(&mut NetworkPolicy)) -> Result<NetworkPolicy, EngineError> {
        let mut policy = self.egress_policy(id)?;
        f(&mut policy);
        if self.egress_enforced(id)? {
            let typed = crate::network::egress_from_wire(&policy)?;
            self.set_network_policy(id, typed).await?;
        }
        self.visible(id)?.ask(Command::Edit(Edit::NetworkPolicy(policy.clone()))).await?;
        Ok(policy)
    }

    /// The tail (at most `max` bytes) of the sandbox's agent log, and whether
    /// it was cut.
    pub async fn agent_log(&self, id: &str, max: u64) -> Result<(String, bool), EngineError> {
        let r = self.visible(id)?.snapshot();
        let Some(path) = self.rt(&r.spec.runtime_class).log_path(&r.id) else {
            return Ok((String::new(), false));
        };
        tokio::task::spawn_blocking(move || {
            use std::io::{Read, Seek, SeekFrom};
            let mut f = match std::fs::File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((String::new(), false)),
                Err(source) => return Err(EngineError::Store { path, source }),
            };
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let cut = len > max;
            let mut buf = Vec::new();
            f.seek(SeekFrom::Start(len.saturating_sub(max)))
                .and_then(|_| f.take(max).read_to_end(&mut buf))
                .map_err(|source| EngineError::Store { path: path.clone(), source })?;
            Ok((String::from_utf8_lossy(&buf).into_owned(), cut))
        })
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?
    }

    /// What is enforced on a running sandbox, read back from the kernel.
    pub async fn boundary(&self, id: &str) -> Result<BoundaryReport, EngineError> {
        let r = self.visible(id)?.snapshot();
        let Some(pid) = r.pid.filter(|_| !r.state.is_terminal()) else {
            return Err(EngineError::NotRunning { id: r.id, state: r.state });
        };
        let rt = self.rt(&r.spec.runtime_class);
        let rid = r.id.clone();
        tokio::task::spawn_blocking(move || rt.boundary(&rid, pid))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|source| EngineError::Runtime { id: r.id, source })
    }

    /// Refreshes the per-state gauges (called before metrics are encoded)
    /// and returns the records it counted, for the pools' gauges.
    pub fn refresh_gauges(&self) -> Vec<SandboxRecord> {
        let recs = self.list(&ListFilter::default());
        let mut by_class: std::collections::HashMap<crate::metrics::ClassStateLabels, i64> = Default::default();
        for r in &recs {
            let l = crate::metrics::ClassStateLabels {
                state: r.state.as_str().into(),
                runtime_class: r.spec.runtime_class.clone(),
            };
            *by_class.entry(l).or_default() += 1;
        }
        // Cleared, so a pair whose last sandbox went leaves no stale series.
        self.metrics.sandboxes_by_class.clear();
        for (l, n) in by_class {
            self.metrics.sandboxes_by_class.get_or_create(&l).set(n);
        }
        for s in [
            SandboxState::Pending,
            SandboxState::Running,
            SandboxState::Paused,
            SandboxState::Stopping,
            SandboxState::Terminated,
            SandboxState::Failed,
        ] {
            let n = recs.iter().filter(|r| r.state == s).count() as i64;
            self.metrics.sandboxes.get_or_create(&crate::metrics::StateLabels { state: s.as_str().into() }).set(n);
        }
        recs
    }

    fn sweep(&self) {
        let cutoff = now_ms() - self.retention.as_millis() as i64;
        let old: Vec<_> = self
            .list(&ListFilter::default())
            .into_iter()
            .filter(|r| r.state.is_terminal() && r.last_transition_ms < cutoff)
            .collect();
        for r in old {
            if let Ok(e) = self.entry(r.id.as_str()) {
                e.tell(Command::Remove);
            }
        }
    }
}

/// Drops records of sandboxes that ended longer ago than the retention.
pub(crate) async fn gc_loop(engine: Weak<Sandboxes>) {
    loop {
        tokio::time::sleep(Duration::from_secs(10)).await;
        match engine.upgrade() {
            Some(e) => e.sweep(),
            None => return,
        }
    }
}

impl Sandboxes {
    /// Readies a kept sandbox for attempt `attempt` of `task`: every process
    /// but the agent killed, then the task label and TTL moved to it.
    pub(crate) async fn take_over(&self, id: &str, task: &str, attempt: u32, ttl_secs: u64) -> Result<(), EngineError> {
        let entry = self.entry(id)?;
        let r = entry.snapshot();
        if r.state != SandboxState::Running || r.lifecycle.is_hidden() {
            return Err(EngineError::NotRunning { id: r.id, state: r.state });
        }
        let pid = r.pid.ok_or_else(|| EngineError::Internal(format!("sandbox {id} has no init pid")))?;
        let rt = self.rt(&r.spec.runtime_class);
        let rid = r.id.clone();
        tokio::task::spawn_blocking(move || rt.reset(&rid, pid))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|source| EngineError::Runtime { id: r.id.clone(), source })?;
        let labels = std::collections::BTreeMap::from([
            (crate::tasks::TASK_LABEL.to_string(), task.to_string()),
            ("ember.task.attempt".to_string(), attempt.to_string()),
        ]);
        let expires_at_ms = limits::expiry_ms(now_ms(), ttl_secs);
        let edit = Edit::TakeOver { labels, expires_at_ms };
        entry.ask(Command::Edit(edit)).await.map(drop)
    }
}
