//! `list`, `inspect`, `delete` and `gc`.
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, SystemTime};

use crate::manifest::{manifest_key, Manifest, Stats};
use crate::restore::load;
use crate::{coord, ObjectStore, SnapshotError};

/// A snapshot as `list` and `inspect` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSummary {
    pub id: String,
    pub created_unix_ms: u64,
    pub labels: BTreeMap<String, String>,
    pub stats: Stats,
    pub warnings: Vec<String>,
}

impl From<&Manifest> for SnapshotSummary {
    fn from(m: &Manifest) -> Self {
        SnapshotSummary {
            id: m.id.clone(),
            created_unix_ms: m.created_unix_ms,
            labels: m.labels.clone(),
            stats: m.stats.clone(),
            warnings: m.warnings.clone(),
        }
    }
}

impl Stats {
    /// Logical bytes over the bytes this snapshot had to upload (uncompressed):
    /// 1.0 for a first snapshot of unique data, large for an incremental one;
    /// infinite when nothing was uploaded.
    pub fn dedup_ratio(&self) -> f64 {
        if self.logical_bytes == 0 {
            1.0
        } else {
            self.logical_bytes as f64 / self.bytes_uploaded as f64
        }
    }

    /// Uploaded bytes before and after zstd (1.0 when nothing was uploaded).
    pub fn compression_ratio(&self) -> f64 {
        if self.stored_bytes_uploaded == 0 {
            1.0
        } else {
            self.bytes_uploaded as f64 / self.stored_bytes_uploaded as f64
        }
    }
}

/// Every snapshot with a valid manifest, oldest first. A manifest that does not
/// verify is an error naming it (it must not vanish from the listing silently).
pub fn list(store: &dyn ObjectStore) -> Result<Vec<SnapshotSummary>, SnapshotError> {
    let mut out = Vec::new();
    for id in manifest_ids(store)? {
        out.push(SnapshotSummary::from(&load(store, &id)?));
    }
    out.sort_by(|a, b| (a.created_unix_ms, &a.id).cmp(&(b.created_unix_ms, &b.id)));
    Ok(out)
}

fn manifest_ids(store: &dyn ObjectStore) -> Result<Vec<String>, SnapshotError> {
    Ok(store
        .list("manifests/")?
        .into_iter()
        .filter_map(|m| m.key.strip_prefix("manifests/")?.strip_suffix(".json").map(str::to_string))
        .collect())
}

/// One snapshot's summary, from its verified manifest.
pub fn inspect(store: &dyn ObjectStore, id: &str) -> Result<SnapshotSummary, SnapshotError> {
    Ok(SnapshotSummary::from(&load(store, id)?))
}

/// Deletes a snapshot's manifest. Its chunks stay until `gc` finds them unreferenced.
pub fn delete(store: &dyn ObjectStore, id: &str) -> Result<(), SnapshotError> {
    crate::validate_id(id)?;
    let key = manifest_key(id);
    if !store.exists(&key)? {
        return Err(SnapshotError::NotFound { id: id.to_string() });
    }
    store.delete(&key)?;
    Ok(())
}

/// How gc decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcOptions {
    /// Unreferenced chunks younger than this are kept (default 10 minutes):
    /// a second guard, beside the lock, for stores without read-after-write.
    pub min_age: Duration,
    /// A snapshot marker older than this belongs to a crashed snapshot and is
    /// removed; a younger one makes gc refuse (default 24 hours).
    pub pending_stale_after: Duration,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions { min_age: Duration::from_secs(600), pending_stale_after: Duration::from_secs(24 * 3600) }
    }
}

/// What gc found and did. Its "chunks" are the store's chunk objects:
/// `chunks/<digest>`, and the packs of small chunks, `packs/<digest>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub manifests: u64,
    pub chunks_seen: u64,
    pub chunks_referenced: u64,
    pub chunks_deleted: u64,
    /// Stored (compressed) bytes freed.
    pub bytes_deleted: u64,
    /// Unreferenced but younger than `min_age`.
    pub chunks_spared_young: u64,
    /// Referenced by a manifest but absent from the store (restores of those snapshots will fail).
    pub missing_chunks: Vec<String>,
}

/// Mark and sweep: deletes every chunk no manifest references.
///
/// Refuses while a snapshot is being written (see the `coord` module for the
/// protocol) and aborts if any manifest does not verify: sweeping without
/// knowing what it references could delete live chunks.
pub fn gc(store: &dyn ObjectStore, opts: GcOptions) -> Result<GcReport, SnapshotError> {
    coord::begin_gc(store, opts.pending_stale_after)?;
    let result = sweep(store, opts);
    let unlocked = coord::end_gc(store);
    let report = result?;
    unlocked?;
    Ok(report)
}

fn sweep(store: &dyn ObjectStore, opts: GcOptions) -> Result<GcReport, SnapshotError> {
    let mut report = GcReport::default();
    let mut live = HashSet::new();
    let mut touched = std::time::Instant::now();
    for id in manifest_ids(store)? {
        coord::touch_gc(store, &mut touched)?;
        let m = load(store, &id)?;
        report.manifests += 1;
        live.extend(m.object_keys());
    }
    report.chunks_referenced = live.len() as u64;
    let now = SystemTime::now();
    let mut present = HashSet::new();
    let mut objects = store.list("chunks/")?;
    objects.extend(store.list("packs/")?);
    for obj in objects {
        report.chunks_seen += 1;
        present.insert(obj.key.clone());
        coord::touch_gc(store, &mut touched)?;
        if live.contains(&obj.key) {
            continue;
        }
        let age = now.duration_since(obj.modified).unwrap_or(Duration::ZERO);
        if age < opts.min_age {
            report.chunks_spared_young += 1;
            continue;
        }
        store.delete(&obj.key)?;
        report.chunks_deleted += 1;
        report.bytes_deleted += obj.size;
    }
    // A chunk by its id, as before packs; a pack by its key.
    report.missing_chunks = live
        .into_iter()
        .filter(|k| !present.contains(k))
        .map(|k| k.strip_prefix("chunks/").map(str::to_string).unwrap_or(k))
        .collect();
    report.missing_chunks.sort();
    Ok(report)
}
