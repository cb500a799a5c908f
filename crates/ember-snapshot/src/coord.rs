//! Keeping gc and snapshots apart, with two kinds of marker object.
//!
//! 1. A snapshot puts `pending/<id>` first, then looks for `locks/gc`; if a
//!    fresh one is there it removes its marker, waits for the lock to go (up
//!    to its `gc_wait`) and starts over, and fails with
//!    [`SnapshotError::GcRunning`] past that wait. A sweep is short; a
//!    checkpoint refused for one is an error a user sees for nothing.
//! 2. gc puts `locks/gc` first, then looks for `pending/*`; if a fresh one is
//!    there it removes its lock and fails with
//!    [`SnapshotError::SnapshotsInProgress`].
//!
//! Each side writes before it reads, so on a store with read-after-write
//! consistency (a local directory; S3 since 2020) at least one of them sees the
//! other: gc never sweeps a chunk that a running snapshot has just found
//! present and decided to reuse. Markers of crashed processes go stale by age
//! (their store timestamp), and gc removes stale snapshot markers. A running
//! gc rewrites its lock every [`GC_LOCK_TOUCH`], so that the lock of a gc
//! whose node was killed goes stale in two minutes, not an hour.
use std::time::{Duration, SystemTime};

use crate::{ObjectStore, SnapshotError, StoreError};

pub(crate) const GC_LOCK: &str = "locks/gc";
pub(crate) const PENDING: &str = "pending/";
/// A gc lock older than this is a crashed gc's; snapshots ignore it.
pub(crate) const GC_LOCK_STALE: Duration = Duration::from_secs(120);
/// How often a running gc rewrites its lock (well inside [`GC_LOCK_STALE`]).
pub(crate) const GC_LOCK_TOUCH: Duration = Duration::from_secs(10);
/// How often a snapshot waiting for a gc looks at its lock again.
const GC_POLL: Duration = Duration::from_millis(200);

pub(crate) fn pending_key(id: &str) -> String {
    format!("{PENDING}{id}")
}

fn fresh(modified: SystemTime, stale_after: Duration) -> bool {
    SystemTime::now().duration_since(modified).map(|age| age < stale_after).unwrap_or(true)
}

/// Step 1 for a snapshot: announce it, then check for a running gc; while
/// one runs, withdraw and wait for it, at most `wait`.
pub(crate) fn begin_snapshot(store: &dyn ObjectStore, id: &str, wait: Duration) -> Result<(), SnapshotError> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        // Empty: its key says it all, and a marker without parts costs one
        // request to put and one to remove on the JetStream store.
        store.put_new(&pending_key(id), b"")?;
        let gc = store.meta(GC_LOCK).map_err(|e| end_after(store, id, e.into()))?;
        if !gc.is_some_and(|m| fresh(m.modified, GC_LOCK_STALE)) {
            return Ok(());
        }
        // Withdrawn while waiting: the sweep must not see a marker it could
        // mistake for a snapshot under way, nor a snapshot proceed beside it.
        let _ = end_after(store, id, SnapshotError::GcRunning { key: GC_LOCK.into() });
        if std::time::Instant::now() + GC_POLL > deadline {
            return Err(SnapshotError::GcRunning { key: GC_LOCK.into() });
        }
        std::thread::sleep(GC_POLL);
    }
}

/// Removes the snapshot's marker (best effort) and passes `err` through.
pub(crate) fn end_after(store: &dyn ObjectStore, id: &str, err: SnapshotError) -> SnapshotError {
    let _ = store.delete(&pending_key(id));
    err
}

/// Step 2 for gc: take the lock, then check for snapshots in progress, and
/// delete the markers older than `stale_after`.
pub(crate) fn begin_gc(store: &dyn ObjectStore, stale_after: Duration) -> Result<(), SnapshotError> {
    store.put(GC_LOCK, b"gc")?;
    let check = || -> Result<(), SnapshotError> {
        let mut running = Vec::new();
        for m in store.list(PENDING)? {
            if fresh(m.modified, stale_after) {
                running.push(m.key[PENDING.len()..].to_string());
            } else {
                store.delete(&m.key)?;
            }
        }
        if running.is_empty() {
            Ok(())
        } else {
            Err(SnapshotError::SnapshotsInProgress { ids: running })
        }
    };
    check().inspect_err(|_| {
        let _ = store.delete(GC_LOCK);
    })
}

/// Rewrites the lock of a gc that is still sweeping, at most every
/// [`GC_LOCK_TOUCH`]; `last` is when it was last written.
pub(crate) fn touch_gc(store: &dyn ObjectStore, last: &mut std::time::Instant) -> Result<(), StoreError> {
    if last.elapsed() >= GC_LOCK_TOUCH {
        store.put(GC_LOCK, b"gc")?;
        *last = std::time::Instant::now();
    }
    Ok(())
}

pub(crate) fn end_gc(store: &dyn ObjectStore) -> Result<(), StoreError> {
    store.delete(GC_LOCK)
}
