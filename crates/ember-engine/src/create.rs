//! Create: request → validated spec → record (write-ahead) → launch → monitor.
use crate::record::{now_ms, LaunchRecord, SandboxRecord};
use crate::sandbox::{Command, Edit};
use crate::{Engine, EngineError};
use ember_types::lifecycle::{Action, Lifecycle};
use ember_types::limits::expiry_ms;
use ember_types::{parse_cpu_millis, parse_memory_bytes, Resources, SandboxId, SandboxSpec, SandboxState, UserSpec};
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

/// A create request, transport-independent. Every field is optional; the
/// template fills in what is missing.
#[derive(Clone, Debug, Default)]
pub struct CreateSandbox {
    pub template: Option<String>,
    pub image_uri: Option<String>,
    pub memory: Option<String>,
    pub cpu: Option<String>,
    pub pids: Option<u64>,
    pub disk: Option<String>,
    pub ttl_secs: Option<u64>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub entrypoint: Vec<String>,
    pub user: Option<UserSpec>,
    pub runtime_class: Option<String>,
    /// Registry credentials, used if the image has to be pulled.
    pub image_auth: Option<ember_types::image::RegistryAuth>,
    pub network_policy: Option<ember_types::api::NetworkPolicy>,
    pub volumes: Vec<HostVolumeRequest>,
    /// Claim from this pool only (OpenSandbox `extensions.poolRef`); without it
    /// any pool of the resolved template and resources is used.
    pub pool: Option<String>,
    /// Workspaces to mount, bound at create or claim time.
    pub workspaces: Vec<crate::WorkspaceRequest>,
    /// `none` (default) or `egress`; a policy alone implies `egress`.
    pub network: Option<ember_types::NetworkMode>,
    pub egress: Option<ember_types::EgressPolicy>,
    /// Restore this sandbox snapshot (OpenSandbox `snapshotId`): its spec,
    /// writable layer and workspaces; the request may set timeout, metadata,
    /// resources, env and entrypoint.
    pub snapshot_id: Option<String>,
}

/// A `host` volume as asked for: validated against the allow-list in
/// [`Engine::resolve`].
#[derive(Clone, Debug, Default)]
pub struct HostVolumeRequest {
    pub name: String,
    pub host_path: String,
    pub sub_path: Option<String>,
    pub mount_path: String,
    pub read_only: bool,
}

const MIN_MEMORY: u64 = 16 << 20;
const MIN_DISK: u64 = 1 << 20;

/// Resource fields as a request spells them.
#[derive(Clone, Debug, Default)]
pub(crate) struct ResourceArgs {
    pub memory: Option<String>,
    pub cpu: Option<String>,
    pub pids: Option<u64>,
    pub disk: Option<String>,
}

/// `base` with the given fields parsed and checked.
pub(crate) fn apply_resources(mut res: Resources, a: &ResourceArgs) -> Result<Resources, EngineError> {
    if let Some(m) = &a.memory {
        res.memory_bytes = parse_memory_bytes(m).map_err(|e| EngineError::invalid("memory", e.to_string()))?;
    }
    if res.memory_bytes < MIN_MEMORY {
        return Err(EngineError::invalid("memory", "at least 16Mi is needed for the agent and a command"));
    }
    if let Some(c) = &a.cpu {
        res.cpu_millis = parse_cpu_millis(c).map_err(|e| EngineError::invalid("cpu", e.to_string()))?;
    }
    if let Some(p) = a.pids {
        if !(8..=1 << 22).contains(&p) {
            return Err(EngineError::invalid("pids", "between 8 and 4194304"));
        }
        res.pids = p;
    }
    if let Some(d) = &a.disk {
        res.disk_bytes = parse_memory_bytes(d).map_err(|e| EngineError::invalid("disk", e.to_string()))?;
    }
    if res.disk_bytes < MIN_DISK {
        return Err(EngineError::invalid("disk", "at least 1Mi"));
    }
    Ok(res)
}

pub(crate) fn check_env<'a>(keys: impl IntoIterator<Item = &'a String>) -> Result<(), EngineError> {
    for k in keys {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(EngineError::invalid("env", format!("bad variable name {k:?}")));
        }
    }
    Ok(())
}

impl Engine {
    /// Creates a sandbox and returns once its agent answers: claimed warm from
    /// a matching pool when one has an idle sandbox, else started cold (a pool
    /// miss is never an error).
    pub async fn create(self: &Arc<Self>, req: CreateSandbox) -> Result<SandboxRecord, EngineError> {
        let t0 = Instant::now();
        if let Some(sid) = req.snapshot_id.clone() {
            let policy = req.network_policy.clone();
            let rec = self.create_from_snapshot(&sid, req).await?;
            self.observe_launch(&rec.spec, "cold", rec.launch.as_ref().map_or(0, |l| l.micros));
            return self.record_policy(rec, policy).await;
        }
        self.catalog.prepare_image(&req).await?;
        let spec = self.catalog.resolve(&req)?;
        self.workspaces.create_missing_workspaces(&req.workspaces).await?;
        self.workspaces.check_workspaces(&req.workspaces)?;
        if let Some(pool) = self.matching_pool(&spec, req.pool.as_deref())? {
            if let Some(rec) = self.claim(&pool, &spec, req.image_uri.clone(), &req.workspaces, t0).await? {
                return self.record_policy(rec, req.network_policy).await;
            }
        }
        let rec = self.launch(spec.clone(), req.image_uri.clone(), None, t0).await?;
        let rec = match self.workspaces.attach_workspaces(&rec, &req.workspaces).await {
            Ok(mounted) if mounted.is_empty() => rec,
            Ok(mounted) => {
                let entry = self.entry(rec.id.as_str())?;
                let launch_micros = Some(t0.elapsed().as_micros() as u64);
                let res = entry.ask(Command::Edit(Edit::Workspaces { mounted, launch_micros })).await;
                self.or_remove(&rec.id, res).await?
            }
            Err(e) => {
                let _ = self.remove(rec.id.as_str()).await;
                return Err(e);
            }
        };
        self.observe_launch(&spec, "cold", rec.launch.as_ref().map_or(0, |l| l.micros));
        self.record_policy(rec, req.network_policy).await
    }

    /// Records the create request's egress policy on the new sandbox. A
    /// sandbox whose record cannot say so is removed: the caller is told the
    /// create failed, so nothing may be left running.
    async fn record_policy(
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

    /// Starts a sandbox cold. The record is persisted as Pending before anything
    /// is started, so a crash mid-create is found and reaped on restart.
    /// `pool`: started by that pool's refill, idle until claimed.
    pub(crate) async fn launch(
        self: &Arc<Self>,
        spec: SandboxSpec,
        image_uri: Option<String>,
        pool: Option<String>,
        t0: Instant,
    ) -> Result<SandboxRecord, EngineError> {
        self.launch_from(spec, image_uri, pool, t0, None).await
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
        self.launch_from(spec, image_uri, None, t0, Some(seed)).await
    }

    async fn launch_from(
        self: &Arc<Self>,
        spec: SandboxSpec,
        image_uri: Option<String>,
        pool: Option<String>,
        t0: Instant,
        seed: Option<Seed>,
    ) -> Result<SandboxRecord, EngineError> {
        let id = SandboxId::from_random(random16());
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
        let store = self.snapshot_store.clone();
        let layer = seed.map(|s| s.layer);
        let launched = tokio::task::spawn_blocking(move || {
            if let Some(l) = &layer {
                crate::sandbox_restore::seed_layer(rt.as_ref(), &lid, &lspec, store.as_ref(), l)?;
            }
            match join {
                Some(j) => rt.launch_in_network(&lid, &lspec, &j),
                None => rt.launch(&lid, &lspec),
            }
            .map_err(|source| EngineError::Runtime { id: lid.clone(), source })
        })
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))?;
        let launched = match launched {
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
        ]);
        rec.pid = Some(launched.pid);
        rec.start_time = Some(launched.start_time);
        rec.launch = Some(LaunchRecord { kind: "cold".into(), micros, phases });
        // Not published yet: this create still owns the record.
        if let Err(e) = rec.apply(Action::Launched { idle: rec.pool.is_some() }, None) {
            self.discard_launch(&rec, Some(launched.pidfd)).await;
            return Err(EngineError::Internal(e.to_string()));
        }
        if let Err(e) = self.store.save(rec.id.as_str(), &rec) {
            // Running but not recorded: the caller is told the create failed,
            // so the sandbox must not outlive this call.
            self.discard_launch(&rec, Some(launched.pidfd)).await;
            return Err(e);
        }
        let socket = launched.agent_socket.clone();
        crate::sandbox::publish(self, rec.clone(), socket, Some(launched));
        Ok(rec)
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
                let _ = crate::sandbox::destroy_and_reap(rt.as_ref(), &id, init);
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
}

/// 16 random bytes for an id, from the kernel's CSPRNG.
/// What a restore starts from: the sandbox snapshot (reported as the sandbox's
/// `snapshotId`) and its layer snapshot, which fills the writable layer.
pub(crate) struct Seed {
    pub snapshot_id: String,
    pub layer: String,
}

pub(crate) fn random16() -> [u8; 16] {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    if b == [0; 16] {
        // /dev/urandom unavailable: fall back to time and pid, still unique here.
        let n = now_ms() as u128 ^ ((std::process::id() as u128) << 64) ^ Instant::now().elapsed().as_nanos();
        b = n.to_le_bytes();
    }
    b
}
