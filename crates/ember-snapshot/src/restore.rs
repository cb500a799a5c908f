//! `restore`: manifest → a temp dir beside the target → verified chunks
//! (fetched, decompressed and checked by a few worker threads, written at
//! their offsets) → metadata deepest-first → rename into place.
use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::{lchown, symlink, DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use filetime::FileTime;

use crate::fetch::{Fetcher, FileJob, Placed};
use crate::manifest::{chunk_key, manifest_key, pack_key, ChunkRef, Entry, EntryKind, Manifest, PackAt};
use crate::packfile::PACK_BELOW;
use crate::{sparse, ObjectStore, Phase, Progress, SnapshotError};

fn no_progress(_: Progress) {}

fn same_id(x: u32) -> u32 {
    x
}

/// How to restore. `new` gives defaults; set the public fields.
pub struct RestoreOptions<'a> {
    /// Restore the recorded uid/gid (needs root, or CAP_CHOWN). Default true.
    pub ownership: bool,
    /// Called on the calling thread as chunks are handed out and at each phase.
    pub progress: &'a dyn Fn(Progress),
    /// Worker threads that fetch, decompress, verify and write chunks
    /// (default: the available cores, at least 2 so fetches overlap, at most 4).
    pub threads: usize,
    /// The target's quota: a snapshot whose file data (holes excluded, counted
    /// from the manifest's entries) exceeds it is refused before anything is
    /// written ([`SnapshotError::TooLarge`]). `None`: no limit.
    pub max_bytes: Option<u64>,
    /// The host id a recorded uid or gid is restored as (a sandbox snapshot
    /// taken in one id range restored into another keeps each id's offset in
    /// its range). Default: as recorded.
    pub map_id: &'a (dyn Fn(u32) -> u32 + Sync),
}

impl Default for RestoreOptions<'_> {
    fn default() -> Self {
        RestoreOptions {
            ownership: true,
            progress: &no_progress,
            threads: crate::snapshot::default_threads().max(2),
            max_bytes: None,
            map_id: &same_id,
        }
    }
}

/// What a finished restore reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreInfo {
    pub id: String,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// File bytes written (all verified).
    pub bytes: u64,
    /// Chunks fetched and verified, counting repeats.
    pub chunks: u64,
    pub elapsed: Duration,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io { op, path: path.to_path_buf(), source }
}

/// Reads and verifies (checksum, MAC, id) a snapshot's manifest.
pub(crate) fn load(store: &dyn ObjectStore, id: &str) -> Result<Manifest, SnapshotError> {
    crate::validate_id(id)?;
    let key = manifest_key(id);
    let bytes = store.get(&key).map_err(|e| match e {
        e if e.is_not_found() => SnapshotError::NotFound { id: id.to_string() },
        e => e.into(),
    })?;
    let m = Manifest::decode(&key, id, &bytes, store.manifest_key())?;
    crate::packfile::places().learn(store, &m);
    Ok(m)
}

/// A snapshot's manifest, read from the store and verified once
/// ([`load_snapshot`]): a caller that checks a snapshot's size before it
/// makes the target, then restores it and copies it (a fork), reads the
/// manifest once, where [`inspect`](crate::inspect), [`restore`] and each
/// [`copy_restored`] read it again (on the JetStream object store each read
/// is two requests to the stream's leader: a rebind's restore read it twice).
pub struct LoadedSnapshot {
    manifest: Manifest,
}

impl LoadedSnapshot {
    pub fn id(&self) -> &str {
        &self.manifest.id
    }

    /// What [`inspect`](crate::inspect) answers, without a read.
    pub fn summary(&self) -> crate::SnapshotSummary {
        crate::SnapshotSummary::from(&self.manifest)
    }
}

/// Reads and verifies snapshot `id`'s manifest, for [`restore_loaded`] and
/// [`copy_loaded`].
pub fn load_snapshot(store: &dyn ObjectStore, id: &str) -> Result<LoadedSnapshot, SnapshotError> {
    Ok(LoadedSnapshot { manifest: load(store, id)? })
}

/// Restores snapshot `id` as the new directory `into` (which must not exist;
/// its parent must). The tree is built in a hidden sibling directory and
/// renamed into place only when every chunk has been verified and every
/// mode, owner and mtime set; on failure the sibling is removed.
pub fn restore(
    store: &dyn ObjectStore,
    id: &str,
    into: &Path,
    opts: RestoreOptions<'_>,
) -> Result<RestoreInfo, SnapshotError> {
    restore_loaded(store, &load_snapshot(store, id)?, into, opts)
}

/// [`restore`] of a snapshot whose manifest was loaded already.
pub fn restore_loaded(
    store: &dyn ObjectStore,
    snap: &LoadedSnapshot,
    into: &Path,
    opts: RestoreOptions<'_>,
) -> Result<RestoreInfo, SnapshotError> {
    restore_from(store, &snap.manifest, into, opts, None)
}

/// Makes `into` a copy of `from`, a tree this process restored from snapshot
/// `id` moments ago and that nothing else writes (the first workspace of a
/// fork, before it is handed out). Same result as [`restore`] — entries, modes,
/// owners, mtimes, atomic appearance — but file bytes are copied by the kernel
/// (`copy_file_range`) instead of fetched, decompressed and verified again;
/// each file's size is checked against the manifest.
pub fn copy_restored(
    store: &dyn ObjectStore,
    id: &str,
    from: &Path,
    into: &Path,
    opts: RestoreOptions<'_>,
) -> Result<RestoreInfo, SnapshotError> {
    copy_loaded(store, &load_snapshot(store, id)?, from, into, opts)
}

/// [`copy_restored`] of a snapshot whose manifest was loaded already.
pub fn copy_loaded(
    store: &dyn ObjectStore,
    snap: &LoadedSnapshot,
    from: &Path,
    into: &Path,
    opts: RestoreOptions<'_>,
) -> Result<RestoreInfo, SnapshotError> {
    restore_from(store, &snap.manifest, into, opts, Some(from))
}

fn restore_from(
    store: &dyn ObjectStore,
    manifest: &Manifest,
    into: &Path,
    opts: RestoreOptions<'_>,
    from: Option<&Path>,
) -> Result<RestoreInfo, SnapshotError> {
    let start = Instant::now();
    let bytes = manifest.data_bytes();
    if let Some(limit) = opts.max_bytes.filter(|l| bytes > *l) {
        return Err(SnapshotError::TooLarge { id: manifest.id.clone(), bytes, limit });
    }
    match fs::symlink_metadata(into) {
        Ok(_) => return Err(SnapshotError::TargetExists { path: into.to_path_buf() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("stat", into)(e)),
    }
    let (Some(parent), Some(name)) = (into.parent(), into.file_name()) else {
        return Err(SnapshotError::NotADirectory { path: into.to_path_buf() });
    };
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = parent.join(format!(".{}.restore-{}-{n}", name.to_string_lossy(), std::process::id()));
    fs::DirBuilder::new().mode(0o700).create(&tmp).map_err(io("create", &tmp))?;
    let result = build(store, manifest, &tmp, &opts, from)
        .and_then(|info| fs::rename(&tmp, into).map(|()| info).map_err(io("rename into", into)));
    match result {
        Ok(mut info) => {
            info.elapsed = start.elapsed();
            Ok(info)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// Checks a manifest path: relative plain names, and returns its parent's path.
fn parent_of<'p>(id: &str, path: &'p str) -> Result<&'p str, SnapshotError> {
    let bad = |reason| Err(SnapshotError::UnsafeEntry { id: id.into(), path: path.into(), reason });
    if path.split('/').any(|p| p.is_empty() || p == "." || p == ".." || p.contains('\0')) {
        return bad("not a relative path of plain names");
    }
    Ok(path.rfind('/').map(|i| &path[..i]).unwrap_or("."))
}

fn build(
    store: &dyn ObjectStore,
    m: &Manifest,
    root: &Path,
    opts: &RestoreOptions<'_>,
    from: Option<&Path>,
) -> Result<RestoreInfo, SnapshotError> {
    let mut info =
        RestoreInfo { id: m.id.clone(), files: 0, dirs: 0, symlinks: 0, bytes: 0, chunks: 0, elapsed: Duration::ZERO };
    let total = m.data_bytes();
    (opts.progress)(Progress { bytes_total: total, ..Default::default() });
    let Some((first, rest)) = m.entries.split_first() else {
        return Err(SnapshotError::UnsafeEntry {
            id: m.id.clone(),
            path: String::new(),
            reason: "manifest has no root",
        });
    };
    if first.path != "." || first.kind != EntryKind::Dir {
        return Err(SnapshotError::UnsafeEntry {
            id: m.id.clone(),
            path: first.path.clone(),
            reason: "first entry is not the root directory",
        });
    }
    let fetcher = Fetcher::new(store, m.chunking.max as u64);
    let copied = AtomicU64::new(0);
    let report = |phase| {
        let (fetched, chunks_done) = fetcher.done();
        let bytes_done = fetched + copied.load(Ordering::Relaxed);
        (opts.progress)(Progress { bytes_done, bytes_total: total, chunks_done, chunks_new: 0, phase })
    };
    let placed = fetcher.run(opts.threads, |jobs| {
        // Every entry's parent must be a directory this restore created: no writing through symlinks.
        let mut dirs: HashSet<&str> = HashSet::from(["."]);
        let mut placed: Vec<(PathBuf, &Entry)> = vec![(root.to_path_buf(), first)];
        for e in rest {
            let parent = parent_of(&m.id, &e.path)?;
            if !dirs.contains(parent) {
                return Err(SnapshotError::UnsafeEntry {
                    id: m.id.clone(),
                    path: e.path.clone(),
                    reason: "its parent is not a restored directory",
                });
            }
            let dest = root.join(&e.path);
            match &e.kind {
                EntryKind::Dir => {
                    fs::DirBuilder::new().mode(0o700).create(&dest).map_err(io("create dir", &dest))?;
                    if !dirs.insert(&e.path) {
                        return Err(SnapshotError::UnsafeEntry {
                            id: m.id.clone(),
                            path: e.path.clone(),
                            reason: "listed twice",
                        });
                    }
                    info.dirs += 1;
                }
                EntryKind::Symlink { target } => {
                    symlink(target, &dest).map_err(io("create symlink", &dest))?;
                    info.symlinks += 1;
                }
                EntryKind::File { size, chunks, data } => {
                    let (file, placed) = create_file(m, &e.path, &dest, *size, chunks, data)?;
                    let written = placed.iter().map(|(_, c)| c.len).sum::<u64>();
                    match from {
                        Some(from) => {
                            copy_file(m, &from.join(&e.path), file, &dest, *size, data)?;
                            copied.fetch_add(written, Ordering::Relaxed);
                        }
                        None => jobs.file(FileJob { file, path: dest.clone(), chunks: placed })?,
                    }
                    info.files += 1;
                    info.bytes += written;
                    info.chunks += chunks.len() as u64;
                    report(Phase::Transferring);
                }
            }
            placed.push((dest, e));
        }
        Ok(placed)
    })?;
    report(Phase::Committing);
    // Deepest first, so setting a child never bumps a parent's mtime after it was set.
    for (dest, e) in placed.iter().rev() {
        set_metadata(dest, e, opts.ownership.then_some(opts.map_id))?;
    }
    report(Phase::Done);
    Ok(info)
}

/// Creates a file to restore into, its size set (holes stay holes), after
/// checking its extents lie in order within it and its chunks fill them
/// exactly; returns it with each chunk's offset.
fn create_file<'m>(
    m: &Manifest,
    path: &str,
    dest: &Path,
    size: u64,
    chunks: &'m [ChunkRef],
    data: &Option<Vec<[u64; 2]>>,
) -> Result<(fs::File, Placed<'m>), SnapshotError> {
    let corrupt =
        |why: &str| SnapshotError::CorruptManifest { key: manifest_key(&m.id), reason: format!("{path}: {why}") };
    let mut placed = Vec::with_capacity(chunks.len());
    let mut next = chunks.iter();
    let mut end = 0u64;
    for [offset, len] in sparse::recorded(data, size) {
        let stop = offset.checked_add(len).filter(|s| offset >= end && *s <= size);
        let Some(stop) = stop else { return Err(corrupt("data extents out of order or past its size")) };
        let mut at = offset;
        while at < stop {
            let c = next.next().ok_or_else(|| corrupt("chunks do not fill its data extents"))?;
            placed.push((at, c));
            at = at.checked_add(c.len).filter(|a| *a <= stop).ok_or_else(|| corrupt("a chunk spans two extents"))?;
        }
        end = stop;
    }
    if next.next().is_some() {
        return Err(corrupt("more chunks than its data extents hold"));
    }
    let file =
        fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(dest).map_err(io("create", dest))?;
    file.set_len(size).map_err(io("set size of", dest))?;
    Ok((file, placed))
}

/// Copies a file of an earlier restore of the same manifest (`copy_restored`),
/// its data extents only: holes stay holes.
fn copy_file(
    m: &Manifest,
    src: &Path,
    dest_file: fs::File,
    dest: &Path,
    size: u64,
    data: &Option<Vec<[u64; 2]>>,
) -> Result<(), SnapshotError> {
    let changed = |what: String| SnapshotError::CorruptManifest {
        key: manifest_key(&m.id),
        reason: format!("copying from the first restore: {} {what}", src.display()),
    };
    // Not through a symlink that replaced the restored file.
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(src)
        .map_err(io("open (no symlinks)", src))?;
    let meta = f.metadata().map_err(io("stat", src))?;
    if !meta.is_file() || meta.len() != size {
        return Err(changed(format!("is no longer a regular file of {size} bytes")));
    }
    sparse::copy_extents(&f, &dest_file, &sparse::recorded(data, size)).map_err(io("copy into", dest))?;
    Ok(())
}

/// A worker's last pack read whole (a store without ranged reads), kept for
/// the next chunks: a pack's chunks come in walk order.
pub(crate) type LastPack = Option<([u8; 32], Vec<u8>)>;

/// Fetches a chunk and verifies its length and digest.
pub(crate) fn fetch_chunk(
    store: &dyn ObjectStore,
    dctx: &mut zstd::bulk::Decompressor<'static>,
    c: &ChunkRef,
    max_len: u64,
    last: &mut LastPack,
) -> Result<Vec<u8>, SnapshotError> {
    let corrupt = |reason: String| SnapshotError::CorruptChunk { chunk: c.id.hex().to_string(), reason };
    // Bounded by the chunker's limit too, so a tampered manifest cannot ask for a huge buffer.
    let max_len = max_len.min(16 << 20);
    if c.len > max_len {
        return Err(corrupt(format!("recorded length {} exceeds the chunker's maximum {max_len}", c.len)));
    }
    let data = match &c.pack {
        None => {
            let packed = store.get(&chunk_key(c.id.hex())).map_err(|e| missing(c.id.hex(), e))?;
            dctx.decompress(&packed, c.len as usize)
        }
        Some(at) => {
            let packed = packed_slice(store, at, c, last)?;
            dctx.decompress(packed.as_ref(), c.len as usize)
        }
    };
    let data = data.map_err(|e| corrupt(format!("does not decompress: {e}")))?;
    if data.len() as u64 != c.len {
        return Err(corrupt(format!("{} bytes, expected {}", data.len(), c.len)));
    }
    let actual = hex::encode(c.id.hash().digest(&data));
    if actual != c.id.hex() {
        return Err(corrupt(format!("content hashes to {actual}")));
    }
    Ok(data)
}

/// A packed chunk's stored bytes: a ranged read where the store has one,
/// else a slice of the whole pack (read once and kept in `last`).
fn packed_slice<'l>(
    store: &dyn ObjectStore,
    at: &PackAt,
    c: &ChunkRef,
    last: &'l mut LastPack,
) -> Result<std::borrow::Cow<'l, [u8]>, SnapshotError> {
    let corrupt = |reason: String| SnapshotError::CorruptChunk { chunk: c.id.hex().to_string(), reason };
    // A packed chunk is small, and its stored form at most a few bytes a frame over that.
    if at.stored > PACK_BELOW as u64 + 4096 {
        return Err(corrupt(format!("recorded stored length {} is too large for a packed chunk", at.stored)));
    }
    let key = pack_key(&at.pack);
    let short = |held: usize| corrupt(format!("{key} holds {held} bytes, not {}..+{}", at.at, at.stored));
    if last.as_ref().is_none_or(|(p, _)| *p != at.pack) {
        if let Some(bytes) = store.get_range(&key, at.at, at.stored).map_err(|e| missing(&key, e))? {
            if bytes.len() as u64 != at.stored {
                return Err(short(bytes.len()));
            }
            return Ok(std::borrow::Cow::Owned(bytes));
        }
        *last = Some((at.pack, store.get(&key).map_err(|e| missing(&key, e))?));
    }
    let pack = last.as_ref().map(|(_, b)| b.as_slice()).unwrap_or_default();
    match at.at.checked_add(at.stored).filter(|e| *e <= pack.len() as u64) {
        Some(end) => Ok(std::borrow::Cow::Borrowed(&pack[at.at as usize..end as usize])),
        None => Err(short(pack.len())),
    }
}

/// A store's not-found as the chunk (or pack) that is missing.
fn missing(key: &str, e: crate::StoreError) -> SnapshotError {
    match e {
        e if e.is_not_found() => SnapshotError::MissingChunk { chunk: key.to_string() },
        e => e.into(),
    }
}

fn set_metadata(dest: &Path, e: &Entry, ownership: Option<&dyn Fn(u32) -> u32>) -> Result<(), SnapshotError> {
    if let Some(map) = ownership {
        lchown(dest, Some(map(e.uid)), Some(map(e.gid))).map_err(io("chown", dest))?;
    }
    // After chown, which clears setuid/setgid bits.
    if !matches!(e.kind, EntryKind::Symlink { .. }) {
        fs::set_permissions(dest, fs::Permissions::from_mode(e.mode & 0o7777)).map_err(io("chmod", dest))?;
    }
    let t = FileTime::from_unix_time(e.mtime_sec, e.mtime_nsec);
    filetime::set_symlink_file_times(dest, t, t).map_err(io("set mtime", dest))
}

#[cfg(test)]
mod tests {
    use super::parent_of;

    #[test]
    fn paths_are_checked() {
        assert_eq!(parent_of("s", "a").unwrap(), ".");
        assert_eq!(parent_of("s", "a/b/c").unwrap(), "a/b");
        for bad in ["", "/a", "a//b", "../a", "a/..", "a/./b"] {
            assert!(parent_of("s", bad).is_err(), "{bad:?} accepted");
        }
    }
}
