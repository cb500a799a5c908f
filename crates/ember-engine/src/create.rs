//! Create: request → validated spec → record (write-ahead) → launch → monitor.
use crate::catalog::Catalog;
use crate::pool::Pools;
use crate::record::{now_ms, SandboxRecord};
use crate::sandbox::Sandboxes;
use crate::snapshots::Snapshots;
use crate::workspaces::Workspaces;
use crate::EngineError;
use ember_types::{parse_cpu_millis, parse_memory_bytes, Resources, UserSpec};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

mod standby;

/// A create request, transport-independent. Every field is optional; the
/// template fills in what is missing.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
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
    /// Re-create this sandbox on a live node when its node dies (OpenSandbox
    /// `extensions.restartPolicy = "rebind"`): a cluster keeps the request;
    /// on one node it is accepted and changes nothing.
    #[serde(default)]
    pub rebind: bool,
    /// Create under this id: a cluster's rebind of a sandbox whose node died
    /// (the same id on a new node). Internal: no API request sets it, and it
    /// never crosses the wire (`serde(skip)`).
    #[serde(skip)]
    pub id: Option<ember_types::SandboxId>,
    /// Warm only, cold only, or either (the default). A cluster sends a warm
    /// claim to a node with an idle member and, on a miss, a cold create to
    /// the node it places it on (docs/cluster.md, "Pools on a cluster").
    #[serde(default)]
    pub launch: LaunchMode,
    /// Secret files for `/run/secrets`: held in memory for this call only,
    /// so never serialized (not into a cluster's rebind bucket, nor onto the
    /// wire between nodes: a create forwarded to another node carries none).
    #[serde(skip)]
    pub secrets: ember_types::secrets::Secrets,
    /// Idle auto-pause after this many seconds (docs/auto-pause.md).
    #[serde(default)]
    pub auto_pause_secs: Option<u64>,
    /// The first auto-pause is a gVisor checkpoint (docs/auto-pause.md).
    #[serde(default)]
    pub auto_pause_checkpoint: bool,
    /// The tenant the sandbox is made for: it claims warm only from that
    /// tenant's pools (`Tenants::may_claim`). `None` is the admin's create.
    /// Set by the API from the caller's key and by a task's worker, never
    /// from a request body; kept across a cluster's forward.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// How a create may start its sandbox.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LaunchMode {
    /// A warm claim from a matching pool, else a cold start.
    #[default]
    Any,
    /// A warm claim only: no idle member is `EngineError::PoolEmpty`.
    Warm,
    /// A cold start only: no pool is looked at.
    Cold,
}

/// A `host` volume as asked for: validated against the allow-list in
/// the catalog's `resolve`.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
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

/// The create path: it spans the catalog (spec), workspaces (made and
/// checked first), pools (a warm claim), sandboxes (a cold start) and
/// snapshots (a restore), so it is a service of its own over them.
pub(crate) struct Provisioner {
    catalog: Arc<Catalog>,
    workspaces: Arc<Workspaces>,
    pools: Arc<Pools>,
    sandboxes: Arc<Sandboxes>,
    snapshots: Arc<Snapshots>,
    /// Who owns each pool: a create claims only from its tenant's.
    tenants: Arc<crate::Tenants>,
    /// One launch under a fixed id at a time (`create/standby.rs`).
    fixed: standby::FixedIds,
}

impl Provisioner {
    pub fn new(
        catalog: Arc<Catalog>,
        workspaces: Arc<Workspaces>,
        pools: Arc<Pools>,
        sandboxes: Arc<Sandboxes>,
        snapshots: Arc<Snapshots>,
        tenants: Arc<crate::Tenants>,
    ) -> Provisioner {
        Provisioner { catalog, workspaces, pools, sandboxes, snapshots, tenants, fixed: standby::FixedIds::new() }
    }

    /// Creates a sandbox and returns once its agent answers: claimed warm from
    /// a matching pool when one has an idle sandbox, else started cold (a pool
    /// miss is never an error).
    pub async fn create(&self, req: CreateSandbox) -> Result<SandboxRecord, EngineError> {
        let t0 = Instant::now();
        // A standby of this id still starting is waited for, then claimed.
        let _held = match &req.id {
            Some(id) => Some(self.fixed.hold(id.as_str()).await),
            None => None,
        };
        if let Some(id) = &req.id {
            if self.sandboxes.entry(id.as_str()).is_ok_and(|e| !e.snapshot().is_standby()) {
                return Err(EngineError::invalid("id", format!("sandbox {id} exists on this node")));
            }
        }
        if let Some(sid) = req.snapshot_id.clone() {
            if let Some(rec) = self.claim_golden(&sid, &req, t0).await? {
                return self.sandboxes.record_policy(rec, req.network_policy).await;
            }
            let policy = req.network_policy.clone();
            let secrets = req.secrets.clone();
            let rec = self.snapshots.create_from_snapshot(&sid, req).await?;
            let rec = crate::secrets::deliver_or_remove(&self.sandboxes, rec, &secrets).await?;
            self.sandboxes.observe_launch(&rec.spec, "cold", rec.launch.as_ref().map_or(0, |l| l.micros));
            return self.sandboxes.record_policy(rec, policy).await;
        }
        self.catalog.prepare_image(&req).await?;
        let spec = self.catalog.resolve(&req)?;
        self.workspaces.create_missing_workspaces(&req.workspaces).await?;
        self.workspaces.check_workspaces(&req.workspaces)?;
        // A rebind (a fixed id) claims its standby if this node has one; a
        // pool's member has an id of its own.
        if let Some(id) = &req.id {
            if let Some(rec) = self.pools.claim_standby(id.as_str(), &spec, &req, t0).await? {
                return self.sandboxes.record_policy(rec, req.network_policy).await;
            }
        }
        if req.launch != LaunchMode::Cold && req.id.is_none() {
            let named = req.pool.is_some();
            let may_claim = |p: &str| self.tenants.may_claim(req.tenant.as_deref(), p, named);
            if let Some(pool) = self.pools.matching_pool(&spec, req.pool.as_deref(), &may_claim)? {
                let spec = inherit_auto_pause(spec.clone(), &pool);
                let claim = self.pools.claim(&pool, &spec, &req, t0);
                let span = tracing::info_span!("pool_claim", pool = %pool.spec().name);
                if let Some(rec) = tracing::Instrument::instrument(claim, span).await? {
                    return self.sandboxes.record_policy(rec, req.network_policy).await;
                }
            }
        }
        if req.launch == LaunchMode::Warm {
            return Err(EngineError::PoolEmpty(req.pool.unwrap_or_else(|| spec.template.clone())));
        }
        let launch = self.sandboxes.launch_as(req.id.clone(), spec.clone(), req.image_uri.clone(), t0);
        let span = tracing::info_span!("cold_start", template = %spec.template, runtime_class = %spec.runtime_class);
        let rec = tracing::Instrument::instrument(launch, span).await?;
        let rec = crate::secrets::deliver_or_remove(&self.sandboxes, rec, &req.secrets).await?;
        let rec = match self.workspaces.attach_workspaces(&rec, &req.workspaces).await {
            Ok(mounted) if mounted.is_empty() => rec,
            Ok(mounted) => {
                let launch_micros = Some(t0.elapsed().as_micros() as u64);
                self.sandboxes.mount_workspaces(&rec.id, mounted, launch_micros).await?
            }
            Err(e) => {
                let _ = self.sandboxes.remove(rec.id.as_str()).await;
                return Err(e);
            }
        };
        self.sandboxes.observe_launch(&spec, "cold", rec.launch.as_ref().map_or(0, |l| l.micros));
        self.sandboxes.record_policy(rec, req.network_policy).await
    }
}

impl Provisioner {
    /// A create restoring snapshot `sid` claims a member of a golden pool of
    /// it when one is idle (`Ok(None)`: none, or a cold start was asked for).
    async fn claim_golden(
        &self,
        sid: &str,
        req: &CreateSandbox,
        t0: Instant,
    ) -> Result<Option<SandboxRecord>, EngineError> {
        if req.launch == LaunchMode::Cold || req.id.is_some() {
            return Ok(None);
        }
        let snap = self.snapshots.sandbox_snapshot(sid)?;
        if snap.state != crate::snapshots::SandboxSnapshotState::Ready {
            return Ok(None);
        }
        let spec = self.snapshots.restored_spec(&snap, req)?;
        let Some(pool) = self.pools.golden_pool(sid, &spec, req.pool.as_deref())? else { return Ok(None) };
        let spec = inherit_auto_pause(spec, &pool);
        let ps = pool.spec();
        let span = tracing::info_span!("pool_claim", pool = %ps.name);
        let claimed = tracing::Instrument::instrument(self.pools.claim(&pool, &spec, req, t0), span).await?;
        // The primed processes are only in the members: a cold restore of
        // the snapshot would hand out the files without them.
        if claimed.is_none() && ps.from_checkpoint.is_some() {
            return Err(EngineError::PoolEmpty(ps.name));
        }
        Ok(claimed)
    }
}

/// A claim without an `autoPause` of its own takes its pool's.
fn inherit_auto_pause(mut spec: ember_types::SandboxSpec, pool: &crate::pool::Pool) -> ember_types::SandboxSpec {
    if spec.auto_pause_secs.is_none() {
        spec.auto_pause_secs = pool.spec().auto_pause_secs;
    }
    spec
}

/// What a restore starts from: the sandbox snapshot (reported as the sandbox's
/// `snapshotId`) and its layer snapshot, which fills the writable layer.
pub(crate) struct Seed {
    pub snapshot_id: String,
    pub layer: String,
    /// A golden pool from a gVisor checkpoint: its member starts by restoring
    /// this golden image (the runtime's key: the pool's snapshot id) instead
    /// of a launch, its writable layer seeded first.
    pub golden_image: Option<String>,
}

/// 16 random bytes for an id, from the kernel's CSPRNG.
pub(crate) fn random16() -> [u8; 16] {
    let mut b = [0u8; 16];
    let _ = getrandom::fill(&mut b);
    if b == [0; 16] {
        // getrandom(2) failed: fall back to time and pid, still unique here.
        let n = now_ms() as u128 ^ ((std::process::id() as u128) << 64) ^ Instant::now().elapsed().as_nanos();
        b = n.to_le_bytes();
    }
    b
}
