//! The restore's worker pool: the calling thread creates the files and hands
//! out their chunks; workers fetch, decompress and verify each chunk and
//! write it at its offset, so fetch latency, zstd and sha256 use every core.
use parking_lot::Mutex;
use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;

use crate::manifest::ChunkRef;
use crate::restore::{fetch_chunk, LastPack};
use crate::{ObjectStore, SnapshotError};

/// A file's chunks with the offset each is written at.
pub(crate) type Placed<'m> = Vec<(u64, &'m ChunkRef)>;

/// A file created empty, and the chunks to write into it, at their offsets.
pub(crate) struct FileJob<'m> {
    pub file: File,
    pub path: PathBuf,
    pub chunks: Placed<'m>,
}

struct Job<'m> {
    file: Arc<(File, PathBuf)>,
    offset: u64,
    chunk: &'m ChunkRef,
}

/// Chunks go to the workers in batches of up to this many (uncompressed)
/// bytes or [`BATCH_JOBS`] chunks, so a tree of small files does not cost a
/// thread handoff per file.
const BATCH_BYTES: u64 = 4 << 20;
const BATCH_JOBS: usize = 64;

/// Hands chunks to the workers. Used on the producing thread only.
pub(crate) struct Jobs<'f, 'm> {
    tx: SyncSender<Vec<Job<'m>>>,
    fetcher: &'f Fetcher<'f>,
    pending: RefCell<(Vec<Job<'m>>, u64)>,
}

impl<'m> Jobs<'_, 'm> {
    /// Queues every chunk of `job`; blocks while the workers are busy.
    pub(crate) fn file(&self, job: FileJob<'m>) -> Result<(), SnapshotError> {
        let file = Arc::new((job.file, job.path));
        for (offset, chunk) in job.chunks {
            let full = {
                let mut p = self.pending.borrow_mut();
                p.0.push(Job { file: Arc::clone(&file), offset, chunk });
                p.1 += chunk.len;
                p.1 >= BATCH_BYTES || p.0.len() >= BATCH_JOBS
            };
            if self.fetcher.failed() || (full && !self.flush()) {
                return Err(SnapshotError::UploadStopped);
            }
        }
        Ok(())
    }

    /// Sends what is pending; false when the workers are gone.
    fn flush(&self) -> bool {
        let batch = std::mem::take(&mut *self.pending.borrow_mut()).0;
        batch.is_empty() || self.tx.send(batch).is_ok()
    }
}

pub(crate) struct Fetcher<'s> {
    store: &'s dyn ObjectStore,
    max_len: u64,
    bytes: AtomicU64,
    chunks: AtomicU64,
    error: Mutex<Option<SnapshotError>>,
}

impl<'s> Fetcher<'s> {
    pub(crate) fn new(store: &'s dyn ObjectStore, max_len: u64) -> Self {
        Fetcher { store, max_len, bytes: AtomicU64::new(0), chunks: AtomicU64::new(0), error: Mutex::new(None) }
    }

    /// Bytes and chunks written and verified so far.
    pub(crate) fn done(&self) -> (u64, u64) {
        (self.bytes.load(Ordering::Relaxed), self.chunks.load(Ordering::Relaxed))
    }

    fn failed(&self) -> bool {
        self.error.lock().is_some()
    }

    /// Runs `produce` on the calling thread with `threads` workers behind it;
    /// returns once every queued chunk is written. A worker's error wins over
    /// the producer's (which is then only "stopped").
    pub(crate) fn run<'m, T>(
        &self,
        threads: usize,
        produce: impl FnOnce(&Jobs<'_, 'm>) -> Result<T, SnapshotError>,
    ) -> Result<T, SnapshotError> {
        let threads = threads.max(1);
        let (tx, rx) = sync_channel::<Vec<Job<'m>>>(threads * 2);
        let rx = Mutex::new(rx);
        let produced = std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| self.worker(&rx));
            }
            let jobs = Jobs { tx, fetcher: self, pending: RefCell::new((Vec::new(), 0)) };
            let produced = produce(&jobs);
            if produced.is_ok() && !jobs.flush() {
                return Err(SnapshotError::UploadStopped);
            }
            produced
            // `jobs` (the sender) drops here: the workers drain and exit.
        });
        if let Some(e) = self.error.lock().take() {
            return Err(e);
        }
        produced
    }

    fn worker(&self, rx: &Mutex<Receiver<Vec<Job<'_>>>>) {
        let mut dctx = match zstd::bulk::Decompressor::new() {
            Ok(d) => d,
            Err(e) => {
                let path = Path::new("zstd").to_path_buf();
                self.error.lock().get_or_insert(SnapshotError::Io { op: "create decompressor", path, source: e });
                return;
            }
        };
        let mut last: LastPack = None;
        loop {
            let batch = rx.lock().recv();
            let Ok(batch) = batch else { return };
            for job in &batch {
                if self.failed() {
                    break; // drain, so the producer never blocks on a full channel
                }
                if let Err(e) = self.write(&mut dctx, job, &mut last) {
                    self.error.lock().get_or_insert(e);
                }
            }
        }
    }

    fn write(
        &self,
        dctx: &mut zstd::bulk::Decompressor<'static>,
        job: &Job<'_>,
        last: &mut LastPack,
    ) -> Result<(), SnapshotError> {
        let data = fetch_chunk(self.store, dctx, job.chunk, self.max_len, last)?;
        let (file, path) = &*job.file;
        file.write_all_at(&data, job.offset).map_err(|source| SnapshotError::Io {
            op: "write",
            path: path.clone(),
            source,
        })?;
        self.bytes.fetch_add(job.chunk.len, Ordering::Relaxed);
        self.chunks.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
