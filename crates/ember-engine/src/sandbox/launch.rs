//! A cold start: the record written ahead (Pending), a network slot, the
//! launch (its writable layer first filled from a snapshot for a restore),
//! the record written Running, and the sandbox published to its monitor.
use super::{Command, Edit, Sandboxes};
use crate::create::{random16, Seed};
use crate::record::{now_ms, LaunchRecord, SandboxRecord};
use crate::EngineError;
use ember_snapshot::{ObjectStore, RestoreOptions};
use ember_types::lifecycle::{Action, Lifecycle};
use ember_types::limits::expiry_ms;
use ember_types::{SandboxId, SandboxSpec, SandboxState};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

impl Sandboxes {
    /// Starts a sandbox cold. The record is persisted as Pending before anything
    /// is started, so a crash mid-create is found and reaped on restart.
    /// `pool`: started by that pool's refill, idle until claimed; `seed`: a
    /// golden pool's snapshot, restored into its writable layer first (and
    /// for one from a checkpoint, its image restored instead of a launch).
    pub(crate) async fn launch(
        self: &Arc<Self>,
        spec: SandboxSpec,
        image_uri: Option<String>,
        pool: Option<String>,
        t0: Instant,
        seed: Option<Seed>,
    ) -> Result<SandboxRecord, EngineError> {
        self.launch_from(None, spec, image_uri, pool, t0, seed).await
    }

    /// A cold start under `id` if given (a cluster's rebind keeps the id of
    /// the sandbox it re-creates), else under a new one.
    pub(crate) async fn launch_as(
        self: &Arc<Self>,
        id: Option<SandboxId>,
        spec: SandboxSpec,
        image_uri: Option<String>,
        t0: Instant,
    ) -> Result<SandboxRecord, EngineError> {
        self.launch_from(id, spec, image_uri, None, t0, None).await
    }

    /// A rebind's standby (`pool/standby.rs`): a cold start under `id`, idle
    /// as a pool member is, in the pool that no pool is.
    pub(crate) async fn launch_standby(
        self: &Arc<Self>,
        id: SandboxId,
        spec: SandboxSpec,
        image_uri: Option<String>,
        t0: Instant,
    ) -> Result<SandboxRecord, EngineError> {
        self.launch_from(Some(id), spec, image_uri, Some(crate::pool::STANDBY.to_string()), t0, None).await
    }

    /// A cold start whose writable layer is first filled from a sandbox
    /// snapshot's layer snapshot (a restore).
    pub(crate) async fn launch_seeded(
        self: &Arc<Self>,
        spec: SandboxSpec,
        image_uri: Option<String>,
        t0: Instant,
        seed: Seed,
    ) -> Result<SandboxRecord, EngineError> {
        self.launch_from(None, spec, image_uri, None, t0, Some(seed)).await
    }

    async fn launch_from(
        self: &Arc<Self>,
        id: Option<SandboxId>,
        spec: SandboxSpec,
        image_uri: Option<String>,
        pool: Option<String>,
        t0: Instant,
        seed: Option<Seed>,
    ) -> Result<SandboxRecord, EngineError> {
        let id = id.unwrap_or_else(|| SandboxId::from_random(random16()));
        let now = now_ms();
        let rec = SandboxRecord {
            id: id.clone(),
            spec: spec.clone(),
            state: SandboxState::Pending,
            reason: None,
            message: None,
            image_uri,
            created_at_ms: now,
            expires_at_ms: spec.ttl_secs.map(|t| expiry_ms(now, t)),
            last_transition_ms: now,
            pid: None,
            start_time: None,
            launch: None,
            lifecycle: Lifecycle::Pending,
            legacy: Default::default(),
            network_policy: None,
            events: Vec::new(),
            pool,
            workspaces: Vec::new(),
            snapshot_id: seed.as_ref().map(|s| s.snapshot_id.clone()),
            restores: 0,
            net_slot: None,
        };
        let net = self.network.attach(&id, &spec).await?;
        let mut rec = rec;
        rec.net_slot = net.as_ref().map(|a| a.slot);
        rec.event("Pending: create requested".to_string());
        if let Err(e) = self.store.save_volatile(rec.id.as_str(), &rec) {
            self.network.release(&rec).await;
            return Err(e);
        }
        let rt = self.rt(&spec.runtime_class);
        let (lid, lspec) = (id.clone(), spec.clone());
        let join = net.map(|a| ember_runtime::NetJoin { netns: a.netns, resolver: a.resolver });
        let store = self.snapshots.clone();
        let (layer, golden) = seed.map_or((None, None), |s| (Some(s.layer), s.golden_image));
        // A native refill runs behind the claims it is for (an OCI runtime's
        // processes would keep the value: they are not the launch's own).
        let background = rec.pool.is_some() && rt.class() == "native";
        let launched = tokio::task::spawn_blocking(move || {
            // From the create's start to here: its checks, the network slot,
            // the record ahead and a blocking thread (a loaded host's queue).
            let start_us = t0.elapsed().as_micros() as u64;
            let launch = || {
                if let Some(l) = &layer {
                    seed_layer(rt.as_ref(), &lid, &lspec, store.as_ref(), l)?;
                }
                match (join, golden) {
                    (_, Some(key)) => rt.launch_from_golden(&lid, &lspec, &key),
                    (Some(j), None) => rt.launch_in_network(&lid, &lspec, &j),
                    (None, None) => rt.launch(&lid, &lspec),
                }
                .map_err(|source| EngineError::Runtime { id: lid.clone(), source })
            };
            let launched = match background {
                true => ember_runtime::in_background(launch),
                false => launch(),
            };
            launched.map(|l| (l, start_us))
        })
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?;
        let (launched, start_us) = match launched {
            Ok(l) => l,
            Err(e) => {
                self.discard_launch(&rec, None).await;
                return Err(e);
            }
        };
        let micros = t0.elapsed().as_micros() as u64;
        let t = launched.timing;
        let phases = BTreeMap::from([
            ("cgroup".to_string(), t.cgroup_us),
            ("spawn".to_string(), t.spawn_us),
            ("agentReady".to_string(), t.ready_us),
            ("start".to_string(), start_us),
        ]);
        rec.pid = Some(launched.pid);
        rec.start_time = Some(launched.start_time);
        rec.launch = Some(LaunchRecord { kind: "cold".into(), micros, phases });
        // Not published yet: this create still owns the record.
        if let Err(e) = rec.apply(Action::Launched { idle: rec.pool.is_some() }, None) {
            self.discard_launch(&rec, Some(launched.pidfd)).await;
            return Err(EngineError::Internal(e.to_string()));
        }
        if let Err(e) = self.save_launched(&rec).await {
            // Running but not recorded: the caller is told the create failed,
            // so the sandbox must not outlive this call.
            self.discard_launch(&rec, Some(launched.pidfd)).await;
            return Err(e);
        }
        let socket = launched.agent_socket.clone();
        self.publish(rec.clone(), socket, Some(launched));
        Ok(rec)
    }

    /// The record of a started sandbox, on a blocking thread (an fsync pair
    /// costs milliseconds on a loaded disk, and a refill's would hold a
    /// runtime worker that claims need). An idle pool member's is not
    /// fsynced: a power loss ends its processes too and no caller knows it
    /// (its claim's record is fsynced, `Store::save_deferred`).
    async fn save_launched(self: &Arc<Self>, rec: &SandboxRecord) -> Result<(), EngineError> {
        let (engine, rec) = (self.clone(), rec.clone());
        let saved = tokio::task::spawn_blocking(move || match rec.pool {
            Some(_) => engine.store.save_volatile(rec.id.as_str(), &rec),
            None => engine.store.save(rec.id.as_str(), &rec),
        });
        saved.await.map_err(|e| EngineError::Internal(e.to_string()))?
    }

    /// Undoes a cold start that will not be handed out: the sandbox
    /// destroyed if it runs (`init`), whatever the launch left on the host
    /// reaped, its network slot released and its record removed.
    async fn discard_launch(&self, rec: &SandboxRecord, init: Option<std::os::fd::OwnedFd>) {
        self.metrics.create_failures.inc();
        let rt = self.rt(&rec.spec.runtime_class);
        let id = rec.id.clone();
        let reaped = tokio::task::spawn_blocking(move || {
            if init.is_some() {
                let _ = super::destroy_and_reap(rt.as_ref(), &id, init);
            }
            rt.reap_leftover(id.as_str())
        })
        .await;
        if let Ok(Err(e)) = reaped {
            tracing::error!(sandbox = %rec.id, error = %e, "reaping a failed create");
        }
        self.network.release(rec).await;
        if let Err(e) = self.store.remove(rec.id.as_str()) {
            tracing::error!(sandbox = %rec.id, error = %e, "removing a failed create's record");
        }
    }

    pub(crate) fn observe_launch(&self, spec: &SandboxSpec, kind: &str, micros: u64) {
        let labels = crate::metrics::LaunchLabels {
            template: spec.template.clone(),
            launch: kind.into(),
            runtime_class: spec.runtime_class.clone(),
        };
        self.metrics.launch_seconds.get_or_create(&labels).observe(micros as f64 / 1e6);
        self.metrics.created.get_or_create(&labels).inc();
    }

    /// Records the create request's egress policy on the new sandbox. A
    /// sandbox whose record cannot say so is removed: the caller is told the
    /// create failed, so nothing may be left running.
    pub async fn record_policy(
        self: &Arc<Self>,
        rec: SandboxRecord,
        policy: Option<ember_types::api::NetworkPolicy>,
    ) -> Result<SandboxRecord, EngineError> {
        let Some(policy) = policy else { return Ok(rec) };
        let e = self.entry(rec.id.as_str())?;
        let res = e.ask(Command::Edit(Edit::NetworkPolicy(policy))).await;
        self.or_remove(&rec.id, res).await
    }

    /// Passes a create's last step through; on an error the new sandbox is
    /// removed first (the record names it).
    async fn or_remove(
        self: &Arc<Self>,
        id: &SandboxId,
        res: Result<SandboxRecord, EngineError>,
    ) -> Result<SandboxRecord, EngineError> {
        if res.is_err() {
            self.metrics.create_failures.inc();
            if let Err(e) = self.remove(id.as_str()).await {
                tracing::error!(sandbox = %id, error = %e, "removing a sandbox whose create failed");
            }
        }
        res
    }

    /// Records the workspaces mounted after a launch (and the launch time
    /// that includes them); a sandbox whose record cannot say so is removed.
    pub async fn mount_workspaces(
        self: &Arc<Self>,
        id: &SandboxId,
        mounted: Vec<crate::MountedWorkspace>,
        launch_micros: Option<u64>,
    ) -> Result<SandboxRecord, EngineError> {
        let entry = self.entry(id.as_str())?;
        let res = entry.ask(Command::Edit(Edit::Workspaces { mounted, launch_micros })).await;
        self.or_remove(id, res).await
    }
}

/// Fills a prepared writable layer from a layer snapshot before the sandbox's
/// init starts (blocking). Every chunk is verified.
pub(crate) fn seed_layer(
    rt: &dyn ember_runtime::Runtime,
    id: &SandboxId,
    spec: &SandboxSpec,
    store: &dyn ObjectStore,
    layer_snapshot: &str,
) -> Result<(), EngineError> {
    let runtime = |source| EngineError::Runtime { id: id.clone(), source };
    let layer = rt
        .prepare_writable_layer(id, spec)
        .map_err(runtime)?
        .ok_or_else(|| EngineError::SnapshotUnsupportedRuntime(spec.runtime_class.clone()))?;
    // The prepared upper dir is empty; the restore creates it anew.
    std::fs::remove_dir(&layer.upper).map_err(|e| EngineError::Internal(format!("{}: {e}", layer.upper.display())))?;
    // No more than the sandbox's disk quota is written into its layer.
    // Files keep their owner's offset in the id range: the snapshot may
    // come from a sandbox in another range than this one's.
    let range = rt.id_range(id);
    let shift = |x| range.as_ref().map_or(x, |(to, ranges)| ranges.shift(x, *to));
    let opts = RestoreOptions { max_bytes: Some(spec.resources.disk_bytes), map_id: &shift, ..Default::default() };
    ember_snapshot::restore_layer(store, layer_snapshot, &layer.upper, layer.opaque_xattr, opts)?;
    Ok(())
}
