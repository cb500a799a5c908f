//! One owner per sandbox. A published sandbox (launched, adopted after a
//! restart, or ended and still visible) has one monitor task, and the monitor
//! is the only writer of its record: every change is a [`Command`] sent to it,
//! as firecracker routes every change to a VM through one action enum. The
//! record's lock is private to this module, so the compiler holds everyone
//! else to reading it. Lifecycle moves go through the pure machine of
//! `ember_types::lifecycle`; the monitor does their effects (freeze, thaw,
//! checkpoint, teardown) and persists the result.
//!
//! [`Sandboxes`] is the service: it owns the registry, the records on disk
//! and the monitors; the rest of the engine reaches a sandbox through it (a
//! lookup, then a command to the entry).
//!
//! Layout: `launch.rs` (a cold start, write-ahead), `monitor.rs` (the task:
//! exit, OOM, TTL and commands), `handle.rs` (one command: its checks, its
//! effect, the record written), `teardown.rs` (the end: destroy, the
//! terminal state, the record kept or dropped), `ops.rs` (get, list, remove,
//! pause, renew, metadata, egress policy, the retention sweep), `stats.rs`,
//! `checkpoint.rs` (gVisor checkpoint/restore I/O), `recover.rs` (restart
//! convergence), `registry.rs` (id → entry).
mod checkpoint;
mod handle;
mod launch;
mod monitor;
mod oom;
mod ops;
mod recover;
mod registry;
mod stats;
mod teardown;

pub(crate) use ops::gc_loop;
pub use ops::ListFilter;

pub(crate) use recover::IdleMember;
pub(crate) use registry::Registry;
pub(crate) use teardown::destroy_and_reap;

use crate::metrics::Metrics;
use crate::network::Network;
use crate::record::SandboxRecord;
use crate::store::Store;
use crate::workspaces::Workspaces;
use crate::{EngineError, MountedWorkspace};
use ember_runtime::{Launched, Runtime, Runtimes};
use ember_types::api::NetworkPolicy;
use ember_types::{EgressPolicy, SandboxId, TerminationReason};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Every change a sandbox's record can take. Sent to its monitor; answered
/// with the record as written, or why not.
pub(crate) enum Command {
    /// The user's pause (a hold of the cgroup freezer).
    Pause,
    /// The user's resume: thaws when no snapshot holds a freeze, or restores a
    /// checkpointed sandbox from its image.
    Resume,
    /// Save to disk and stop the processes (gVisor).
    Checkpoint,
    /// A snapshot's own freeze, and its end.
    SnapshotFreeze,
    SnapshotThaw,
    /// A pooled sandbox handed to a caller, with what the caller asked for.
    Claim(Box<ClaimPatch>),
    /// A change of the record's other fields.
    Edit(Edit),
    /// End it (an unclean claim, a discarded pool member).
    Stop(TerminationReason),
    /// End it if it runs, then forget it.
    Remove,
}

/// What a claim binds to a pooled sandbox.
pub(crate) struct ClaimPatch {
    pub spec: ember_types::SandboxSpec,
    pub image_uri: Option<String>,
    pub workspaces: Vec<MountedWorkspace>,
    pub created_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    /// Its `micros` are set by the monitor once the agent took the claim.
    pub launch: crate::record::LaunchRecord,
    /// When the claim's request began: the claim's time runs to the agent's answer.
    pub t0: std::time::Instant,
    /// What the agent is told (env, user, entrypoint, secrets): sent by the
    /// monitor itself, never kept.
    pub agent_claim: serde_json::Value,
    /// The claim's span (its request's): the monitor's step with the agent
    /// is logged under it.
    pub span: tracing::Span,
}

/// Changes to fields outside the lifecycle, each persisted before it counts.
pub(crate) enum Edit {
    /// Workspaces mounted after the launch; the launch time then includes them.
    Workspaces { mounted: Vec<MountedWorkspace>, launch_micros: Option<u64> },
    /// The recorded OpenSandbox egress policy.
    NetworkPolicy(NetworkPolicy),
    /// The enforced egress policy (egress networking).
    Egress(EgressPolicy),
    /// A renewed expiry.
    Expiry(i64),
    /// A JSON merge-patch of the metadata (`None` deletes a key).
    Metadata(BTreeMap<String, Option<String>>),
    /// A kept task sandbox moved to attempt `attempt` of `task`.
    TakeOver { labels: BTreeMap<String, String>, expires_at_ms: i64 },
}

struct Msg {
    cmd: Command,
    reply: oneshot::Sender<Result<SandboxRecord, EngineError>>,
}

/// One published sandbox: its record (read by anyone, written by its
/// monitor) and the way to its monitor.
pub(crate) struct Entry {
    /// A std Mutex: held only to copy or replace the record, never across an
    /// await. Private: only this module's monitor writes it.
    record: Mutex<SandboxRecord>,
    pub agent_socket: PathBuf,
    tx: mpsc::Sender<Msg>,
    /// Proxy traffic, for idle auto-pause (`crate::autopause`).
    pub(crate) idle: crate::autopause::Idle,
}

impl Entry {
    pub fn snapshot(&self) -> SandboxRecord {
        self.record.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Sends `cmd` to the monitor and waits for its answer. A monitor that
    /// is gone (it ended with the sandbox's removal) answers for a sandbox
    /// that no longer runs.
    pub async fn ask(&self, cmd: Command) -> Result<SandboxRecord, EngineError> {
        let (reply, wait) = oneshot::channel();
        let gone = || {
            let r = self.snapshot();
            EngineError::NotFound(r.id.to_string())
        };
        self.tx.send(Msg { cmd, reply }).await.map_err(|_| gone())?;
        wait.await.map_err(|_| gone())?
    }

    /// Sends `cmd` without waiting for the answer (a stop nobody waits for).
    pub fn tell(self: &Arc<Self>, cmd: Command) {
        let me = self.clone();
        tokio::spawn(async move {
            if let Err(e) = me.ask(cmd).await {
                tracing::debug!(sandbox = %me.snapshot().id, error = %e, "command refused");
            }
        });
    }

    fn write(&self, rec: SandboxRecord) {
        *self.record.lock().unwrap_or_else(|p| p.into_inner()) = rec;
    }
}

/// An idle pool member ended (it died, or was discarded): its pool must
/// stop counting it. Sent by its monitor; the pools listen, so this service
/// needs no handle on them.
pub(crate) struct IdleEnded {
    pub pool: String,
    pub id: SandboxId,
}

/// What the sandbox service works with, built by the engine.
pub(crate) struct Deps {
    pub runtimes: Runtimes,
    pub network: Arc<Network>,
    pub workspaces: Arc<Workspaces>,
    pub metrics: Arc<Metrics>,
    /// Where a restored sandbox's writable layer is read from.
    pub snapshots: Arc<dyn ember_snapshot::ObjectStore>,
}

/// The sandboxes of this node: the registry, their records on disk, one
/// monitor each.
pub(crate) struct Sandboxes {
    registry: Arc<Registry>,
    /// Written by a create until it publishes, then by the monitor only.
    store: Store<SandboxRecord>,
    runtimes: Runtimes,
    network: Arc<Network>,
    workspaces: Arc<Workspaces>,
    metrics: Arc<Metrics>,
    snapshots: Arc<dyn ember_snapshot::ObjectStore>,
    /// How long ended sandboxes stay visible before their record is dropped.
    retention: Duration,
    /// Upper bound on a sandbox's TTL (a renewal's too), if any.
    max_ttl: Option<Duration>,
    idle_ended: mpsc::UnboundedSender<IdleEnded>,
    /// The live sandboxes' OOM watch.
    oom: Arc<oom::OomHub>,
}

impl Sandboxes {
    pub fn open(
        cfg: &crate::EngineConfig,
        registry: Arc<Registry>,
        deps: Deps,
        idle_ended: mpsc::UnboundedSender<IdleEnded>,
    ) -> Result<Sandboxes, EngineError> {
        let store = Store::open(cfg.data_dir.join("state/sandboxes"))?;
        let Deps { runtimes, network, workspaces, metrics, snapshots } = deps;
        Ok(Sandboxes {
            registry,
            store,
            runtimes,
            network,
            workspaces,
            metrics,
            snapshots,
            retention: cfg.retention,
            max_ttl: cfg.max_ttl,
            idle_ended,
            oom: Arc::default(),
        })
    }

    /// The runtime that serves sandboxes of `class`.
    pub fn rt(&self, class: &str) -> Arc<dyn Runtime> {
        self.runtimes.for_class(class)
    }

    /// Any sandbox, idle pool members and removals under way included.
    pub fn entry(&self, id: &str) -> Result<Arc<Entry>, EngineError> {
        self.registry.entry(id)
    }

    /// A sandbox a caller may see: idle pool members and sandboxes on their
    /// way out of the store are not found.
    pub fn visible(&self, id: &str) -> Result<Arc<Entry>, EngineError> {
        let e = self.entry(id)?;
        if e.snapshot().lifecycle.is_hidden() {
            return Err(EngineError::NotFound(id.to_string()));
        }
        Ok(e)
    }

    /// Whether sandbox `id` is known and holds resources.
    pub fn is_alive(&self, id: &str) -> bool {
        self.registry.is_alive(id)
    }

    /// Persists a change nobody waits for (the monitor's, a teardown's): a
    /// failure can only be logged.
    fn persist(&self, r: &SandboxRecord) {
        if let Err(err) = self.store.save(r.id.as_str(), r) {
            tracing::error!(sandbox = %r.id, error = %err, "persisting sandbox record failed");
        }
    }

    /// Publishes a sandbox: its entry is visible from now on and its monitor
    /// owns it. `live`: the init's descriptors (none for a checkpointed or an
    /// ended sandbox).
    fn publish(self: &Arc<Self>, rec: SandboxRecord, agent_socket: PathBuf, live: Option<Launched>) -> Arc<Entry> {
        let (tx, rx) = mpsc::channel(8);
        let id: SandboxId = rec.id.clone();
        let idle = crate::autopause::Idle::default();
        let entry = Arc::new(Entry { record: Mutex::new(rec), agent_socket, tx, idle });
        self.registry.insert(id, entry.clone());
        monitor::spawn(self.clone(), entry.clone(), live, rx);
        entry
    }
}
