//! Reading and uploading a walked tree. The calling thread reads each file,
//! cuts it into chunks and hashes them (in order, so the manifest is
//! deterministic); a few worker threads take the chunks from a bounded channel,
//! check whether the store already has them, and compress and put the new ones.
//! Uploads to a remote store overlap their latency; compression uses the cores.
use std::collections::HashSet;
use std::fs::File;
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Mutex, MutexGuard, PoisonError};

use fastcdc::v2020::StreamCDC;
use sha2::{Digest, Sha256};

use crate::manifest::{chunk_key, ChunkRef, Chunking, EntryKind, Stats};
use crate::walk::Walked;
use crate::{ObjectStore, SnapshotError};

struct Job {
    sha: [u8; 32],
    data: Vec<u8>,
}

/// State the workers share. Every mutex is a std one held for a few field
/// updates, never across IO.
struct Shared<'s> {
    store: &'s dyn ObjectStore,
    level: i32,
    /// Chunks claimed by this snapshot: the first worker to insert a hash handles it.
    seen: Mutex<HashSet<[u8; 32]>>,
    stats: Mutex<Stats>,
    /// The first failure; the others are dropped, the producer stops.
    error: Mutex<Option<SnapshotError>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A worker that panicked cannot leave these half-updated in a way that matters: counters and a set.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared<'_> {
    fn failed(&self) -> bool {
        lock(&self.error).is_some()
    }

    fn worker(&self, rx: &Mutex<Receiver<Job>>) {
        loop {
            let job = lock(rx).recv();
            let Ok(job) = job else { return };
            if self.failed() {
                continue; // drain, so the producer never blocks on a full channel
            }
            if let Err(e) = self.handle(job) {
                lock(&self.error).get_or_insert(e);
            }
        }
    }

    fn handle(&self, job: Job) -> Result<(), SnapshotError> {
        let len = job.data.len() as u64;
        let reused = |s: &mut Stats| {
            s.chunks_reused += 1;
            s.bytes_reused += len;
        };
        if !lock(&self.seen).insert(job.sha) {
            reused(&mut lock(&self.stats));
            return Ok(());
        }
        let sha256 = hex::encode(job.sha);
        let key = chunk_key(&sha256);
        let present = self.store.exists(&key)?;
        if present {
            let mut s = lock(&self.stats);
            (s.unique_chunks, s.unique_bytes) = (s.unique_chunks + 1, s.unique_bytes + len);
            reused(&mut s);
            return Ok(());
        }
        let packed = zstd::bulk::compress(&job.data, self.level)
            .map_err(|e| SnapshotError::CorruptChunk { chunk: sha256.clone(), reason: format!("compressing: {e}") })?;
        self.store.put(&key, &packed)?;
        let mut s = lock(&self.stats);
        (s.unique_chunks, s.unique_bytes) = (s.unique_chunks + 1, s.unique_bytes + len);
        s.chunks_uploaded += 1;
        s.bytes_uploaded += len;
        s.stored_bytes_uploaded += packed.len() as u64;
        Ok(())
    }
}

/// Fills in every file entry's chunks and size, uploading absent chunks with
/// `threads` workers; `on_bytes` is told of every chunk read. Returns the stats.
pub(crate) fn upload(
    items: &mut [Walked],
    store: &dyn ObjectStore,
    chunking: Chunking,
    threads: usize,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<Stats, SnapshotError> {
    let threads = threads.max(1);
    let shared = Shared {
        store,
        level: chunking.zstd_level,
        seen: Mutex::new(HashSet::new()),
        stats: Mutex::new(Stats::default()),
        error: Mutex::new(None),
    };
    let (tx, rx) = sync_channel::<Job>(threads * 2);
    let rx = Mutex::new(rx);
    let mut counts = Stats::default();
    let produced = std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| shared.worker(&rx));
        }
        // `tx` moves in and is dropped on return: the workers then drain and exit.
        produce(items, tx, &shared, chunking, &mut counts, on_bytes)
    });
    if let Some(e) = lock(&shared.error).take() {
        return Err(e);
    }
    produced?;
    let s = lock(&shared.stats).clone();
    Ok(Stats {
        logical_bytes: counts.logical_bytes,
        files: counts.files,
        dirs: counts.dirs,
        symlinks: counts.symlinks,
        chunk_refs: counts.chunk_refs,
        ..s
    })
}

fn produce(
    items: &mut [Walked],
    tx: SyncSender<Job>,
    shared: &Shared<'_>,
    c: Chunking,
    counts: &mut Stats,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<(), SnapshotError> {
    for item in items {
        let source = item.source.as_path();
        match &mut item.entry.kind {
            EntryKind::Dir => counts.dirs += 1,
            EntryKind::Symlink { .. } => counts.symlinks += 1,
            EntryKind::File { size, chunks } => {
                counts.files += 1;
                *size = chunk_file(source, c, chunks, &tx, shared, on_bytes)?;
                counts.logical_bytes += *size;
                counts.chunk_refs += chunks.len() as u64;
            }
        }
    }
    Ok(())
}

/// Chunks one file, sending every chunk to the workers; returns the bytes read.
fn chunk_file(
    path: &Path,
    c: Chunking,
    out: &mut Vec<ChunkRef>,
    tx: &SyncSender<Job>,
    shared: &Shared<'_>,
    on_bytes: &mut dyn FnMut(u64),
) -> Result<u64, SnapshotError> {
    let io = |op| move |source| SnapshotError::Io { op, path: path.to_path_buf(), source };
    let f = File::open(path).map_err(io("open"))?;
    let mut total = 0;
    for chunk in StreamCDC::new(f, c.min as usize, c.avg as usize, c.max as usize) {
        let data = chunk.map_err(|e| io("read")(e.into()))?.data;
        let len = data.len() as u64;
        let sha: [u8; 32] = Sha256::digest(&data).into();
        out.push(ChunkRef { sha256: hex::encode(sha), len });
        if shared.failed() || tx.send(Job { sha, data }).is_err() {
            // A worker's error, if any, is what `upload` returns; this one only stops the walk.
            return Err(SnapshotError::UploadStopped);
        }
        total += len;
        on_bytes(len);
    }
    Ok(total)
}
