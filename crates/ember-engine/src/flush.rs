//! The fsync half of a save that answers before it ([`Store::save_deferred`],
//! a warm claim's record): the record is already renamed into place, so a
//! daemon crash keeps it (the page cache is the kernel's, not the daemon's);
//! this thread makes it survive a power loss too, a moment later, batching
//! whatever queued up meanwhile (one directory fsync per batch).
//!
//! Why not before the answer: on this shared disk an fsync pair costs 8 ms at
//! the median and 67 ms at p99 under load, forty times the claim itself
//! (docs/performance.md). What a power loss inside that window costs: the
//! claimed sandbox's processes die with the host either way; its record may
//! still say Pooled, so the restart drops it as an idle member instead of
//! reporting it ended.
//!
//! [`Store::save_deferred`]: crate::store::Store::save_deferred
use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

pub(crate) struct Flusher {
    tx: mpsc::Sender<PathBuf>,
}

impl Flusher {
    /// Starts the flushing thread; it ends when the flusher is dropped.
    pub fn start() -> Flusher {
        let (tx, rx) = mpsc::channel::<PathBuf>();
        let spawned = std::thread::Builder::new().name("ember-flush".into()).spawn(move || run(rx));
        if let Err(e) = spawned {
            // `flush` then syncs on the caller's thread (its send fails).
            tracing::error!(error = %e, "cannot start the record flusher; records will be fsynced inline");
        }
        Flusher { tx }
    }

    /// Queues `path` (a record already renamed into place) for its fsync.
    pub fn flush(&self, path: PathBuf) {
        if let Err(mpsc::SendError(path)) = self.tx.send(path) {
            sync_batch(&BTreeSet::from([path]));
        }
    }
}

fn run(rx: mpsc::Receiver<PathBuf>) {
    while let Ok(first) = rx.recv() {
        let mut batch = BTreeSet::from([first]);
        batch.extend(rx.try_iter());
        sync_batch(&batch);
    }
}

/// Each file, then each directory once: a rename is durable only once its
/// directory is. A file gone since (removed, or replaced by a later save)
/// needs nothing from here.
fn sync_batch(batch: &BTreeSet<PathBuf>) {
    let mut dirs = BTreeSet::new();
    for p in batch {
        match File::open(p).and_then(|f| f.sync_all()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => tracing::error!(path = %p.display(), error = %e, "fsyncing a record failed"),
        }
        dirs.insert(p.parent().unwrap_or(Path::new(".")).to_path_buf());
    }
    for d in dirs {
        if let Err(e) = File::open(&d).and_then(|f| f.sync_all()) {
            tracing::error!(path = %d.display(), error = %e, "fsyncing a record directory failed");
        }
    }
}
