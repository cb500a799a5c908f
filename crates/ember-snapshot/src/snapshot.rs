//! `snapshot`: walk → chunk → stage absent chunks → make them durable → guard → manifest.
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::manifest::{manifest_key, Chunking, Manifest};
use crate::upload::Counters;
use crate::{coord, upload, walk, ObjectStore, SnapshotError, SnapshotSummary, Staged};

/// What a snapshot, restore or fork is doing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Walking the tree, listing the store, reading the manifest.
    #[default]
    Scanning,
    /// Chunks moving: read, hashed, packed and stored; or fetched, verified and written.
    Transferring,
    /// Waiting for the stored chunks to be durable.
    Syncing,
    /// Writing the manifest (snapshot) or setting metadata and renaming (restore).
    Committing,
    /// Fork: copying the restored tree into the other targets.
    Copying,
    Done,
}

/// Bytes of file content processed so far, out of the total the walk found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    pub bytes_done: u64,
    pub bytes_total: u64,
    /// Chunks processed (counting repeats), and of those, the ones this
    /// snapshot stored (absent before). Restores leave `chunks_new` at 0.
    pub chunks_done: u64,
    pub chunks_new: u64,
    pub phase: Phase,
}

fn always() -> bool {
    true
}

fn no_progress(_: Progress) {}

/// How to take a snapshot. `new` gives defaults; set the public fields.
pub struct SnapshotOptions<'a> {
    /// The snapshot id: 1..=128 of `[A-Za-z0-9._-]`, not starting with `.`.
    pub id: String,
    /// Recorded in the manifest, e.g. `workspace`, `lease_epoch`.
    pub labels: BTreeMap<String, String>,
    /// Called immediately before the manifest is written: the caller's lease
    /// fencing. `false` refuses the commit ([`SnapshotError::CommitRefused`]).
    pub commit_guard: &'a dyn Fn() -> bool,
    /// Called on the calling thread after every chunk read and at each phase.
    pub progress: &'a dyn Fn(Progress),
    pub chunking: Chunking,
    /// Worker threads that check, compress and upload chunks (default: the
    /// available cores, at most 4).
    pub threads: usize,
    /// Set by [`snapshot_layer`](crate::snapshot_layer): the tree is an overlay
    /// upper dir whose opaque dirs carry this xattr; its marks go in a label.
    pub(crate) layer_xattr: Option<String>,
    /// How long to wait for a gc sweep of the store to end before refusing
    /// with [`SnapshotError::GcRunning`] (default 30 s).
    pub gc_wait: Duration,
}

impl<'a> SnapshotOptions<'a> {
    pub fn new(id: impl Into<String>) -> Self {
        SnapshotOptions {
            id: id.into(),
            labels: BTreeMap::new(),
            commit_guard: &always,
            progress: &no_progress,
            chunking: Chunking::default(),
            threads: default_threads(),
            layer_xattr: None,
            gc_wait: Duration::from_secs(30),
        }
    }

    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
}

/// The available cores, at most 4: chunk work is CPU-bound (hash, zstd).
pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// What a finished snapshot reports.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotInfo {
    pub summary: SnapshotSummary,
    pub elapsed: Duration,
}

/// Checks a snapshot id: 1..=128 characters of `[A-Za-z0-9._-]`, not starting with `.`.
pub fn validate_id(id: &str) -> Result<(), SnapshotError> {
    let bad = |reason| Err(SnapshotError::InvalidId { id: id.to_string(), reason });
    if id.is_empty() || id.len() > 128 {
        return bad("must be 1 to 128 characters");
    }
    if id.starts_with('.') {
        return bad("must not start with `.`");
    }
    if !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return bad("only letters, digits, `.`, `_` and `-` are allowed");
    }
    Ok(())
}

fn check_chunking(c: &Chunking) -> Result<(), SnapshotError> {
    let ok = (64..=1 << 20).contains(&c.min)
        && (256..=4 << 20).contains(&c.avg)
        && (1024..=16 << 20).contains(&c.max)
        && c.min <= c.avg
        && c.avg <= c.max
        && (1..=19).contains(&c.zstd_level);
    if ok {
        Ok(())
    } else {
        Err(SnapshotError::InvalidOptions { reason: format!("chunking {c:?} is out of range") })
    }
}

/// Snapshots the tree at `dir` into `store`.
///
/// Guarantees: chunks are uploaded only when absent; the manifest is written
/// last, after `commit_guard` agreed, so an interrupted or refused snapshot
/// leaves at most unreferenced chunks (which gc removes), never a manifest
/// pointing at missing chunks. The tree must not change while it is read: the
/// caller freezes the writers or passes a read-only view.
pub fn snapshot(dir: &Path, store: &dyn ObjectStore, opts: SnapshotOptions<'_>) -> Result<SnapshotInfo, SnapshotError> {
    let start = Instant::now();
    validate_id(&opts.id)?;
    check_chunking(&opts.chunking)?;
    let id = opts.id.as_str();
    let key = manifest_key(id);
    if store.exists(&key)? {
        return Err(SnapshotError::AlreadyExists { id: id.to_string() });
    }
    coord::begin_snapshot(store, id, opts.gc_wait)?;
    let result = build_and_commit(dir, store, &opts, &key);
    let summary = match result {
        Ok(summary) => summary,
        Err(e) => return Err(coord::end_after(store, id, e)),
    };
    // The snapshot is committed; a marker left behind only delays gc until it goes stale.
    let _ = store.delete(&coord::pending_key(id));
    Ok(SnapshotInfo { summary, elapsed: start.elapsed() })
}

fn build_and_commit(
    dir: &Path,
    store: &dyn ObjectStore,
    opts: &SnapshotOptions<'_>,
    key: &str,
) -> Result<SnapshotSummary, SnapshotError> {
    (opts.progress)(Progress::default());
    let mut walked = walk::walk(dir, opts.layer_xattr.as_deref())?;
    let total = walked.file_bytes;
    let counters = Counters::default();
    let report = |phase| {
        (opts.progress)(Progress {
            bytes_done: counters.bytes.load(Ordering::Relaxed),
            bytes_total: total,
            chunks_done: counters.chunks.load(Ordering::Relaxed),
            chunks_new: counters.new_chunks.load(Ordering::Relaxed),
            phase,
        })
    };
    let batch = Staged::new();
    report(Phase::Transferring);
    let how =
        upload::How { chunking: opts.chunking, threads: opts.threads, scope: upload::Scope::of(store, &opts.labels) };
    let stats = upload::upload(&mut walked, store, &batch, how, &counters, &mut || report(Phase::Transferring))?;
    report(Phase::Syncing);
    // Every chunk durable before the manifest can name it.
    store.commit_staged(&batch)?;
    report(Phase::Committing);
    let entries = walked.items.into_iter().map(|i| i.entry).collect();
    let mut labels = opts.labels.clone();
    if opts.layer_xattr.is_some() {
        let json = serde_json::to_string(&walked.marks)
            .map_err(|e| SnapshotError::InvalidOptions { reason: format!("encoding overlay marks: {e}") })?;
        labels.insert(crate::LAYER_LABEL.to_string(), json);
    }
    let mut manifest = Manifest {
        id: opts.id.clone(),
        created_unix_ms: 0,
        labels,
        chunking: opts.chunking,
        entries,
        stats,
        warnings: walked.warnings,
    };
    if !(opts.commit_guard)() {
        return Err(SnapshotError::CommitRefused { id: opts.id.clone() });
    }
    manifest.created_unix_ms =
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default();
    // Looked for at the start, under a marker of this id: new.
    store.put_new(key, &manifest.encode(store.manifest_key())?)?;
    crate::packfile::places().learn(store, &manifest);
    report(Phase::Done);
    Ok(SnapshotSummary::from(&manifest))
}
