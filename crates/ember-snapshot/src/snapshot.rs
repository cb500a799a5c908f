//! `snapshot`: walk → chunk → upload absent chunks → guard → manifest.
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::manifest::{manifest_key, Chunking, Manifest};
use crate::{coord, upload, walk, ObjectStore, SnapshotError, SnapshotSummary};

/// Bytes of file content processed so far, out of the total the walk found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub bytes_done: u64,
    pub bytes_total: u64,
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
    /// Called after every chunk (and once at the start).
    pub progress: &'a dyn Fn(Progress),
    pub chunking: Chunking,
    /// Worker threads that check, compress and upload chunks (default: the
    /// available cores, at most 4).
    pub threads: usize,
}

impl<'a> SnapshotOptions<'a> {
    pub fn new(id: impl Into<String>) -> Self {
        SnapshotOptions {
            id: id.into(),
            labels: BTreeMap::new(),
            commit_guard: &always,
            progress: &no_progress,
            chunking: Chunking::default(),
            threads: std::thread::available_parallelism().map_or(1, |n| n.get().min(4)),
        }
    }

    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }
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
    coord::begin_snapshot(store, id)?;
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
    let walked = walk::walk(dir)?;
    let mut items = walked.items;
    let mut progress = Progress { bytes_done: 0, bytes_total: walked.file_bytes };
    (opts.progress)(progress);
    let stats = upload::upload(&mut items, store, opts.chunking, opts.threads, &mut |n| {
        progress.bytes_done += n;
        (opts.progress)(progress);
    })?;
    let entries = items.into_iter().map(|i| i.entry).collect();
    let mut manifest = Manifest {
        id: opts.id.clone(),
        created_unix_ms: 0,
        labels: opts.labels.clone(),
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
    store.put(key, &manifest.encode()?)?;
    Ok(SnapshotSummary::from(&manifest))
}
