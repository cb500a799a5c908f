//! Reading and uploading a walked tree. The calling thread reads each file and
//! cuts it into chunks (FastCDC, in order, so the manifest is deterministic;
//! see [`crate::window`]);
//! worker threads take the chunks from a bounded channel, hash them, and
//! compress (see [`crate::pack`]) and stage the ones the store does not have:
//! a large chunk as an object of its own (one lookup each), a small one in
//! the worker's pack (see [`crate::packfile`]). Staged objects become durable
//! together when the caller commits the batch, before the manifest is written.
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

use ember_sys::beneath::PinnedDir;

use crate::manifest::{chunk_key, ChunkHash, ChunkId, ChunkRef, Chunking, EntryKind, PackAt, Stats};
pub(crate) use crate::packfile::Scope;
use crate::packfile::{places, PackCheck, PackWriter, PACK_BELOW};
use crate::walk::{Walk, Walked};
use crate::window::{cut, Chunk, Cut, Windows};
use crate::{pack, sparse, ObjectStore, SnapshotError, Staged};

struct Job {
    /// Index of the chunk in walk order: where its hash goes.
    slot: usize,
    data: Chunk,
}

/// Chunks travel to the workers in batches of up to this many bytes or
/// [`BATCH_JOBS`] chunks: a tree of small files would otherwise cost a thread
/// handoff (and, on a busy machine, a scheduler wait) per file.
const BATCH_BYTES: usize = 4 << 20;
const BATCH_JOBS: usize = 64;

/// The producer's side of the channel: collects jobs into batches.
struct Batcher {
    tx: SyncSender<Vec<Job>>,
    pending: Vec<Job>,
    bytes: usize,
}

impl Batcher {
    /// Queues a job; false when the workers are gone.
    fn push(&mut self, job: Job) -> bool {
        self.bytes += job.data.bytes().len();
        self.pending.push(job);
        if self.bytes >= BATCH_BYTES || self.pending.len() >= BATCH_JOBS {
            return self.flush();
        }
        true
    }

    fn flush(&mut self) -> bool {
        self.bytes = 0;
        let batch = std::mem::take(&mut self.pending);
        batch.is_empty() || self.tx.send(batch).is_ok()
    }
}

/// Counters the calling thread reads to report progress while workers run.
#[derive(Default)]
pub(crate) struct Counters {
    pub bytes: AtomicU64,
    pub chunks: AtomicU64,
    pub new_chunks: AtomicU64,
}

/// State the workers share. Every mutex is a std one held for a few field
/// updates, never across IO.
struct Shared<'s> {
    store: &'s dyn ObjectStore,
    batch: &'s Staged,
    level: i32,
    /// Names the chunks and packs.
    hash: ChunkHash,
    /// The store's chunks when the snapshot started, with their stored sizes.
    /// Chunks claimed by this snapshot: the first worker to insert a hash handles it.
    seen: Mutex<HashSet<[u8; 32]>>,
    /// Every chunk's hash, by slot.
    hashes: Mutex<Vec<[u8; 32]>>,
    /// Where this snapshot's packed chunks are, by hash.
    placed: Mutex<HashMap<[u8; 32], PackAt>>,
    /// The packs places were reused in, looked up once each.
    packs: PackCheck,
    scope: Scope,
    stats: Mutex<Stats>,
    counters: &'s Counters,
    /// The first failure; the others are dropped, the producer stops.
    error: Mutex<Option<SnapshotError>>,
}

impl Shared<'_> {
    fn failed(&self) -> bool {
        self.error.lock().is_some()
    }

    fn worker(&self, rx: &Mutex<Receiver<Vec<Job>>>) {
        let mut w =
            Worker { packer: pack::Packer::new(self.level), pack: PackWriter::new(self.hash), stored: Vec::new() };
        loop {
            let batch = rx.lock().recv();
            let Ok(batch) = batch else { break };
            for job in batch {
                if self.failed() {
                    break; // drain, so the producer never blocks on a full channel
                }
                if let Err(e) = self.handle(job, &mut w) {
                    self.error.lock().get_or_insert(e);
                }
            }
        }
        if !self.failed() {
            if let Err(e) = w.pack.finish(self.store, self.batch).map(|p| self.place(p)) {
                self.error.lock().get_or_insert(e);
            }
        }
    }

    fn place(&self, written: Vec<([u8; 32], PackAt)>) {
        if !written.is_empty() {
            self.placed.lock().extend(written);
        }
    }

    /// A place for small chunk `sha` known to this process, in a pack the
    /// store still has.
    fn known_place(&self, sha: &[u8; 32]) -> Result<Option<PackAt>, SnapshotError> {
        for at in places().get(self.scope, self.hash, sha) {
            if self.packs.holds(self.store, &at)? {
                return Ok(Some(at));
            }
        }
        Ok(None)
    }

    /// Chunk `sha`'s stored size if the store has it: one lookup per
    /// distinct chunk of this snapshot (after its marker is up, so gc cannot
    /// remove one meanwhile), not a listing of every chunk in the store.
    fn stored(&self, id: &ChunkId) -> Result<Option<u64>, SnapshotError> {
        Ok(self.store.meta(&chunk_key(id.hex()))?.map(|m| m.size))
    }

    fn handle(&self, job: Job, w: &mut Worker) -> Result<(), SnapshotError> {
        let data = job.data.bytes();
        let len = data.len() as u64;
        let sha = self.hash.digest(data);
        self.hashes.lock()[job.slot] = sha;
        let done = || {
            self.counters.bytes.fetch_add(len, Ordering::Relaxed);
            self.counters.chunks.fetch_add(1, Ordering::Relaxed);
        };
        let reused = |s: &mut Stats| {
            s.chunks_reused += 1;
            s.bytes_reused += len;
        };
        if !self.seen.lock().insert(sha) {
            reused(&mut self.stats.lock());
            done();
            return Ok(());
        }
        let small = data.len() < PACK_BELOW;
        let found = match small {
            true => self.known_place(&sha)?.map(|at| {
                self.placed.lock().insert(sha, at);
                at.stored
            }),
            false => self.stored(&ChunkId::new(self.hash, &sha))?,
        };
        if let Some(stored) = found {
            let mut s = self.stats.lock();
            (s.unique_chunks, s.unique_bytes, s.stored_bytes) =
                (s.unique_chunks + 1, s.unique_bytes + len, s.stored_bytes + stored);
            reused(&mut s);
            drop(s);
            done();
            return Ok(());
        }
        let hex = hex::encode(sha);
        w.packer
            .pack_into(data, &mut w.stored)
            .map_err(|e| SnapshotError::CorruptChunk { chunk: hex.clone(), reason: format!("compressing: {e}") })?;
        let packed = &w.stored;
        match small {
            true => self.place(w.pack.add(sha, packed, self.store, self.batch)?),
            false => self.store.put_staged(&chunk_key(&hex), packed, self.batch)?,
        }
        let mut s = self.stats.lock();
        (s.unique_chunks, s.unique_bytes) = (s.unique_chunks + 1, s.unique_bytes + len);
        s.chunks_uploaded += 1;
        s.bytes_uploaded += len;
        s.stored_bytes_uploaded += packed.len() as u64;
        s.stored_bytes += packed.len() as u64;
        drop(s);
        self.counters.new_chunks.fetch_add(1, Ordering::Relaxed);
        done();
        Ok(())
    }
}

/// How [`upload`] cuts and stores: the chunking, its worker threads, and
/// where it may reuse packed chunks.
pub(crate) struct How {
    pub chunking: Chunking,
    pub threads: usize,
    pub scope: Scope,
}

/// A worker's compression contexts, its pack being filled, and the stored
/// form of its current chunk (one allocation, reused).
struct Worker {
    packer: pack::Packer,
    pack: PackWriter,
    stored: Vec<u8>,
}

/// Fills in every file entry's chunks and size, staging absent chunks in
/// `batch` with `threads` workers; `on_chunk` is called on the calling thread
/// after every chunk read. Returns the stats.
pub(crate) fn upload(
    walked: &mut Walk,
    store: &dyn ObjectStore,
    batch: &Staged,
    how: How,
    counters: &Counters,
    on_chunk: &mut dyn FnMut(),
) -> Result<Stats, SnapshotError> {
    let How { chunking, threads, scope } = how;
    let threads = threads.max(1);
    let shared = Shared {
        store,
        batch,
        level: chunking.zstd_level,
        hash: chunking.hash,
        seen: Mutex::new(HashSet::new()),
        hashes: Mutex::new(Vec::new()),
        placed: Mutex::new(HashMap::new()),
        packs: PackCheck::default(),
        scope,
        stats: Mutex::new(Stats::default()),
        counters,
        error: Mutex::new(None),
    };
    let (tx, rx) = sync_channel::<Vec<Job>>(threads * 2);
    let rx = Mutex::new(rx);
    let mut counts = Stats::default();
    let produced = std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| shared.worker(&rx));
        }
        // `tx` moves in and is dropped on return: the workers then drain and exit.
        let mut out = Batcher { tx, pending: Vec::new(), bytes: 0 };
        produce(&walked.root, &mut walked.items, &mut out, &shared, chunking, &mut counts, on_chunk)
    });
    if let Some(e) = shared.error.lock().take() {
        return Err(e);
    }
    produced?;
    let hashes = std::mem::take(&mut *shared.hashes.lock());
    fill_hashes(&mut walked.items, chunking.hash, &hashes, &shared.placed.lock())?;
    let s = shared.stats.lock().clone();
    Ok(Stats {
        logical_bytes: counts.logical_bytes,
        files: counts.files,
        dirs: counts.dirs,
        symlinks: counts.symlinks,
        chunk_refs: counts.chunk_refs,
        hole_bytes: counts.hole_bytes,
        ..s
    })
}

/// Writes the workers' hashes, and each packed chunk's place, into the
/// chunk references, in walk order.
fn fill_hashes(
    items: &mut [Walked],
    hash: ChunkHash,
    hashes: &[[u8; 32]],
    placed: &HashMap<[u8; 32], PackAt>,
) -> Result<(), SnapshotError> {
    let mut slots = hashes.iter();
    for item in items {
        if let EntryKind::File { chunks, .. } = &mut item.entry.kind {
            for (c, sha) in chunks.iter_mut().zip(&mut slots) {
                c.id = ChunkId::new(hash, sha);
                if (c.len as usize) < PACK_BELOW {
                    // Every small chunk was packed or found packed by a worker.
                    let at = placed.get(sha).ok_or_else(|| SnapshotError::CorruptChunk {
                        chunk: c.id.hex().to_string(),
                        reason: "a small chunk has no place in a pack".into(),
                    })?;
                    c.pack = Some(*at);
                }
            }
        }
    }
    Ok(())
}

fn produce(
    root: &PinnedDir,
    items: &mut [Walked],
    out: &mut Batcher,
    shared: &Shared<'_>,
    c: Chunking,
    counts: &mut Stats,
    on_chunk: &mut dyn FnMut(),
) -> Result<(), SnapshotError> {
    let windows = &mut Windows::default();
    for item in items {
        let rel = item.entry.path.as_str();
        match &mut item.entry.kind {
            EntryKind::Dir => counts.dirs += 1,
            EntryKind::Symlink { .. } => counts.symlinks += 1,
            EntryKind::File { size, chunks, data } => {
                counts.files += 1;
                let mut reader = Reader { root, rel, c, out, shared, windows, on_chunk: &mut *on_chunk };
                let read = reader.file(chunks)?;
                (*size, *data) = (read.size, read.data);
                counts.logical_bytes += read.size;
                counts.hole_bytes += read.size - read.bytes;
                counts.chunk_refs += chunks.len() as u64;
            }
        }
    }
    if !out.flush() {
        return Err(SnapshotError::UploadStopped);
    }
    Ok(())
}

/// What [`Reader::file`] found: the size, the data extents as recorded
/// (`None`: dense), and the bytes read.
struct ReadFile {
    size: u64,
    data: Option<Vec<[u64; 2]>>,
    bytes: u64,
}

/// Reads one file for [`produce`].
struct Reader<'r, 's> {
    root: &'r PinnedDir,
    rel: &'r str,
    c: Chunking,
    windows: &'r mut Windows,
    out: &'r mut Batcher,
    shared: &'r Shared<'s>,
    on_chunk: &'r mut dyn FnMut(),
}

impl Reader<'_, '_> {
    fn err(&self, op: &'static str, source: std::io::Error) -> SnapshotError {
        SnapshotError::Io { op, path: self.root.path().join(self.rel), source }
    }

    /// Opens the file beneath the root (never through a symlink: a directory
    /// swapped for one since the walk fails here, naming the path) and chunks
    /// its data extents, sending every chunk to the workers; holes are not read.
    fn file(&mut self, chunks: &mut Vec<ChunkRef>) -> Result<ReadFile, SnapshotError> {
        let mut f = self.root.open_file(self.rel).map_err(|e| SnapshotError::Io {
            op: "open beneath the snapshot root (no symlinks)",
            path: e.target.into(),
            source: e.source,
        })?;
        let size = f.metadata().map_err(|e| self.err("stat", e))?.len();
        let extents = sparse::data_extents(&f, size).map_err(|e| self.err("find data (SEEK_DATA)", e))?;
        let mut total = 0;
        for &[offset, len] in &extents {
            f.seek(std::io::SeekFrom::Start(offset)).map_err(|e| self.err("seek", e))?;
            total += self.extent(&mut f, len, chunks)?;
        }
        Ok(ReadFile { size, data: sparse::as_recorded(extents, size), bytes: total })
    }

    /// Chunks one extent ([`cut`]); returns the bytes read. The references
    /// get their hashes later, from the workers ([`fill_hashes`]).
    fn extent(&mut self, r: impl Read, len: u64, out: &mut Vec<ChunkRef>) -> Result<u64, SnapshotError> {
        let mut total = 0;
        let mut windows = std::mem::take(self.windows);
        let read = cut(r, len, self.c, &mut windows, &mut |data| {
            total += self.send(data, out)?;
            Ok(())
        });
        *self.windows = windows;
        read.map_err(|e| match e {
            Cut::Read(e) => self.err("read", e),
            Cut::Send(e) => e,
        })?;
        Ok(total)
    }

    /// Hands one chunk to the workers; returns its length.
    fn send(&mut self, data: Chunk, out: &mut Vec<ChunkRef>) -> Result<u64, SnapshotError> {
        let shared = self.shared;
        let len = data.bytes().len() as u64;
        // Named by its digest once a worker has hashed it (`fill_hashes`).
        out.push(ChunkRef { id: ChunkId::Sha256(String::new()), len, pack: None });
        let slot = {
            let mut hashes = shared.hashes.lock();
            hashes.push([0; 32]);
            hashes.len() - 1
        };
        if shared.failed() || !self.out.push(Job { slot, data }) {
            // A worker's error, if any, is what `upload` returns; this one only stops the walk.
            return Err(SnapshotError::UploadStopped);
        }
        (self.on_chunk)();
        Ok(len)
    }
}
