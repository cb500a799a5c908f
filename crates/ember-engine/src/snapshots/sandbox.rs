//! Sandbox snapshots (what OpenSandbox calls a snapshot): a Running sandbox's
//! writable rootfs layer plus its read-write workspaces, restorable as a new
//! sandbox.
//!
//! Taking one, in steps:
//! 1. the source must be live (running, or paused by its user) and its class must expose its writable layer
//!    on the host ([`Runtime::writable_layer`](ember_runtime::Runtime));
//! 2. the record is persisted as Creating, naming every manifest it will
//!    write (write-ahead);
//! 3. the snapshot takes a freeze hold of its own in the sandbox's lifecycle
//!    (cgroup freezer; a user's resume meanwhile does not thaw it, and a
//!    restart drops the hold and thaws it unless its user paused it);
//! 4. the upper dir goes to the object store as a layer snapshot (whiteouts and
//!    opaque dirs included), then each read-write workspace as a workspace
//!    snapshot, committed only while the sandbox still holds its lease epoch;
//! 5. the hold is given back (the sandbox thaws unless its user paused it), then the record becomes Ready (or Failed, its manifests deleted).
//!
//! A daemon crash before step 5 leaves a Creating record: the restart marks it
//! Failed and deletes whatever manifests it names, so no Ready record ever
//! points at missing data (a manifest is written only after all its chunks).
//!
//! Restoring (`sandbox_restore.rs`): a new sandbox whose upper dir is filled
//! from the layer snapshot (every chunk verified) before its init starts, then
//! each workspace snapshot restored into a new workspace at the same path.
use super::Snapshots;
use crate::record::now_ms;
use crate::sandbox::Command;
use crate::store::Store;
use crate::{EngineError, SandboxRecord};
use ember_types::lifecycle::Lifecycle;
use ember_types::{SandboxId, SandboxSpec};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Where a sandbox snapshot is in its life (OpenSandbox's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SandboxSnapshotState {
    Creating,
    Ready,
    Failed,
    Deleting,
}

impl SandboxSnapshotState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Creating => "Creating",
            Self::Ready => "Ready",
            Self::Failed => "Failed",
            Self::Deleting => "Deleting",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Creating, Self::Ready, Self::Failed, Self::Deleting].into_iter().find(|x| x.as_str() == s)
    }
}

/// A workspace the source sandbox had mounted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotWorkspace {
    pub name: String,
    pub path: String,
    pub read_only: bool,
    /// The workspace snapshot (read-write mounts only): restored into a new
    /// workspace. A read-only mount is mounted again, as it is.
    pub snapshot_id: Option<String>,
    pub size_bytes: u64,
}

/// A sandbox snapshot's persisted record (`<data>/state/sandbox-snapshots/<id>.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSnapshotRecord {
    pub id: String,
    pub sandbox_id: SandboxId,
    pub name: Option<String>,
    pub state: SandboxSnapshotState,
    /// Why it is Failed: a short code, and the error.
    pub reason: Option<String>,
    pub message: Option<String>,
    pub created_at_ms: i64,
    pub last_transition_ms: i64,
    /// The source's spec: template, runtime class, resources, env, entrypoint,
    /// user, image layers. A restore starts from it.
    pub spec: SandboxSpec,
    pub image_uri: Option<String>,
    /// The layer snapshot (an ember-snapshot manifest id) of the upper dir.
    pub layer_snapshot: String,
    pub workspaces: Vec<SnapshotWorkspace>,
    /// Bytes of file content in the layer when it was taken.
    #[serde(default)]
    pub layer_bytes: u64,
}

impl SandboxSnapshotRecord {
    fn transition(&mut self, to: SandboxSnapshotState, reason: Option<(&str, String)>) {
        self.state = to;
        self.last_transition_ms = now_ms();
        if let Some((code, message)) = reason {
            self.reason = Some(code.to_string());
            self.message = Some(message);
        }
    }

    /// Every manifest id this snapshot writes.
    fn manifests(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.layer_snapshot.as_str())
            .chain(self.workspaces.iter().filter_map(|w| w.snapshot_id.as_deref()))
    }
}

/// Filters of `list_sandbox_snapshots`; empty fields match everything.
#[derive(Clone, Debug, Default)]
pub struct SnapshotFilter {
    pub sandbox_id: Option<String>,
    pub name: Option<String>,
    /// OR-ed.
    pub states: Vec<SandboxSnapshotState>,
}

impl Snapshots {
    pub(crate) fn snapshot_records(&self) -> Result<Store<SandboxSnapshotRecord>, EngineError> {
        Store::open(self.records_dir.clone())
    }

    pub fn sandbox_snapshot(&self, id: &str) -> Result<SandboxSnapshotRecord, EngineError> {
        let not_found = || EngineError::SandboxSnapshotNotFound(id.to_string());
        if ember_snapshot::validate_id(id).is_err() {
            return Err(not_found());
        }
        match self.snapshot_records()?.load(id) {
            Some(Ok(r)) => Ok(r),
            Some(Err(why)) => Err(EngineError::Internal(format!("sandbox snapshot record {id}: {why}"))),
            None => Err(not_found()),
        }
    }

    /// Matching sandbox snapshots, oldest first.
    pub fn list_sandbox_snapshots(&self, f: &SnapshotFilter) -> Result<Vec<SandboxSnapshotRecord>, EngineError> {
        let mut out: Vec<_> = self
            .snapshot_records()?
            .load_all()
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .filter(|r| f.sandbox_id.as_ref().is_none_or(|s| r.sandbox_id.as_str() == s))
            .filter(|r| f.name.is_none() || r.name == f.name)
            .filter(|r| f.states.is_empty() || f.states.contains(&r.state))
            .collect();
        out.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(out)
    }

    /// Takes a snapshot of the Running sandbox `id` and returns its record once
    /// it is Ready. On failure the record stays, Failed, and the error is returned.
    pub async fn snapshot_sandbox(
        self: &Arc<Self>,
        id: &str,
        name: Option<String>,
    ) -> Result<SandboxSnapshotRecord, EngineError> {
        // Its freeze and thaw in one task: a caller gone meanwhile cannot
        // leave the sandbox frozen (`super::detached`).
        let (me, id) = (self.clone(), id.to_string());
        super::detached(async move { me.snapshot_sandbox_inner(&id, name).await }).await
    }

    async fn snapshot_sandbox_inner(
        self: &Arc<Self>,
        id: &str,
        name: Option<String>,
    ) -> Result<SandboxSnapshotRecord, EngineError> {
        let entry = self.sandboxes.visible(id)?;
        let src = entry.snapshot();
        // Live (running, or paused by its user: the snapshot keeps it paused).
        if !matches!(src.lifecycle, Lifecycle::Live { .. }) {
            return Err(EngineError::SnapshotSourceState { id: src.id, state: src.state });
        }
        let rt = self.sandboxes.rt(&src.spec.runtime_class);
        let Some(layer) = rt.writable_layer(&src.id) else {
            return Err(EngineError::SnapshotUnsupportedRuntime(src.spec.runtime_class.clone()));
        };
        let mut rec = new_record(&src, name);
        for w in &mut rec.workspaces {
            w.size_bytes = self.workspaces.meta(&w.name).map(|m| m.size_bytes).unwrap_or(0);
        }
        let records = self.snapshot_records()?;
        records.save(&rec.id, &rec)?;
        // Before the sandbox is frozen: a sweep under way may take a while.
        let gate = self.snapshot_write_gate().await;
        if let Err(e) = entry.ask(Command::SnapshotFreeze).await {
            // Nothing was written yet: no manifest to delete.
            rec.transition(SandboxSnapshotState::Failed, Some(("SNAPSHOT_FAILED", e.to_string())));
            records.save(&rec.id, &rec)?;
            return Err(e);
        }
        let (me, r2, holder) = (self.clone(), rec.clone(), src.id.to_string());
        let res = tokio::task::spawn_blocking(move || me.write_snapshot(&r2, &layer, &holder))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))
            .and_then(|r| r);
        drop(gate);
        // Thaw first: the snapshot's freeze must go whatever happened (a
        // user's pause stays).
        if let Err(e) = entry.ask(Command::SnapshotThaw).await {
            tracing::warn!(sandbox = %id, error = %e, "giving back a snapshot's freeze failed");
        }
        match res {
            Ok(bytes) => {
                rec.layer_bytes = bytes;
                rec.transition(SandboxSnapshotState::Ready, None);
                records.save(&rec.id, &rec)?;
                Ok(rec)
            }
            Err(e) => {
                let (me, msg) = (self.clone(), e.to_string());
                let _ = tokio::task::spawn_blocking(move || me.fail(&records, &mut rec, msg)).await;
                Err(e)
            }
        }
    }

    /// Marks `rec` Failed and deletes whatever manifests it managed to write.
    /// Blocking (object store calls).
    fn fail(&self, records: &Store<SandboxSnapshotRecord>, rec: &mut SandboxSnapshotRecord, message: String) {
        for m in rec.manifests() {
            let _ = ember_snapshot::delete(self.snapshot_store.as_ref(), m);
        }
        rec.transition(SandboxSnapshotState::Failed, Some(("SNAPSHOT_FAILED", message)));
        let _ = records.save(&rec.id, rec);
    }

    /// Step 4 (blocking): the layer, then every read-write workspace, fenced
    /// by the lease epoch the sandbox mounted it with. Returns the layer's bytes.
    fn write_snapshot(
        &self,
        rec: &SandboxSnapshotRecord,
        layer: &ember_runtime::WritableLayer,
        holder: &str,
    ) -> Result<u64, EngineError> {
        let store = self.snapshot_store.as_ref();
        let opts =
            self.options(rec.layer_snapshot.clone()).label("sandbox", holder).label("sandboxSnapshot", rec.id.clone());
        let info = ember_snapshot::snapshot_layer(&layer.upper, layer.opaque_xattr, store, opts)?;
        let src = self.sandboxes.entry(holder)?.snapshot();
        for w in &rec.workspaces {
            let Some(sid) = &w.snapshot_id else { continue };
            let epoch = src.workspaces.iter().find(|m| m.name == w.name && m.path == w.path).and_then(|m| m.epoch);
            let mnt = self.workspaces.ensure_mounted(&w.name)?;
            let guard = || {
                let now = self.workspaces.meta(&w.name).ok().and_then(|m| m.leases.lease);
                now.is_some_and(|l| l.holder == holder && Some(l.epoch) == epoch)
            };
            let mut opts = self
                .options(sid.clone())
                .label("workspace", w.name.clone())
                .label("sizeBytes", w.size_bytes.to_string())
                .label("sandboxSnapshot", rec.id.clone());
            if let Some(ep) = epoch {
                opts.labels.insert("epoch".into(), ep.to_string());
            }
            opts.commit_guard = &guard;
            ember_snapshot::snapshot(&mnt, store, opts)?;
        }
        Ok(info.summary.stats.logical_bytes)
    }

    /// Deletes a sandbox snapshot and its manifests; the scheduled gc then
    /// reclaims the chunks no other snapshot shares (`snapshot_gc.rs`).
    pub async fn delete_sandbox_snapshot(self: &Arc<Self>, id: &str) -> Result<(), EngineError> {
        let mut rec = self.sandbox_snapshot(id)?;
        if rec.state == SandboxSnapshotState::Creating {
            return Err(EngineError::SnapshotNotReady { id: rec.id, state: rec.state.as_str() });
        }
        let records = self.snapshot_records()?;
        if rec.state != SandboxSnapshotState::Deleting {
            // A golden pool's starting point stays until the pool goes; an
            // interrupted delete is finished whatever pins it.
            let id = rec.id.clone();
            self.unless_pinned(&id, || {
                rec.transition(SandboxSnapshotState::Deleting, None);
                records.save(&rec.id, &rec)
            })?;
        }
        let me = self.clone();
        let r2 = rec.clone();
        tokio::task::spawn_blocking(move || {
            for m in r2.manifests() {
                match ember_snapshot::delete(me.snapshot_store.as_ref(), m) {
                    Ok(()) | Err(ember_snapshot::SnapshotError::NotFound { .. }) => {}
                    Err(e) => return Err(EngineError::from(e)),
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| EngineError::Internal(e.to_string()))??;
        records.remove(&rec.id)?;
        self.snapshot_deleted();
        Ok(())
    }
}

fn new_record(src: &SandboxRecord, name: Option<String>) -> SandboxSnapshotRecord {
    let id = SandboxId::from_random(crate::create::random16()).to_string();
    let now = now_ms();
    let workspaces = src
        .workspaces
        .iter()
        .enumerate()
        .map(|(i, w)| SnapshotWorkspace {
            name: w.name.clone(),
            path: w.path.clone(),
            read_only: w.read_only,
            snapshot_id: (!w.read_only).then(|| format!("sbx-{id}-ws{i}")),
            size_bytes: 0,
        })
        .collect();
    SandboxSnapshotRecord {
        layer_snapshot: format!("sbx-{id}-layer"),
        id,
        sandbox_id: src.id.clone(),
        name,
        state: SandboxSnapshotState::Creating,
        reason: None,
        message: None,
        created_at_ms: now,
        last_transition_ms: now,
        spec: src.spec.clone(),
        image_uri: src.image_uri.clone(),
        workspaces,
        layer_bytes: 0,
    }
}

/// Restart convergence: a snapshot the crash interrupted (Creating) is Failed
/// and its manifests deleted; an interrupted delete is finished.
impl Snapshots {
    /// After a restart: a snapshot cut off mid-way is Failed, one cut off
    /// while being deleted is deleted.
    pub async fn recover(self: &Arc<Self>) -> Result<(), EngineError> {
        let engine = self;
        for (stem, rec) in engine.snapshot_records()?.recover_all() {
            let Ok(mut rec) = rec else {
                tracing::warn!(file = %stem, "unreadable sandbox snapshot record; leaving it");
                continue;
            };
            match rec.state {
                SandboxSnapshotState::Creating => {
                    tracing::warn!(snapshot = %rec.id, "sandbox snapshot interrupted by a restart; marking it Failed");
                    let msg = "the daemon restarted while the snapshot was being taken".to_string();
                    let me = engine.clone();
                    let records = me.snapshot_records()?;
                    let _ = tokio::task::spawn_blocking(move || me.fail(&records, &mut rec, msg)).await;
                }
                SandboxSnapshotState::Deleting => {
                    let _ = engine.delete_sandbox_snapshot(&rec.id).await;
                }
                _ => {}
            }
        }
        Ok(())
    }
}
