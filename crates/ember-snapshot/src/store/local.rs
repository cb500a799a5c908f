//! [`LocalStore`]: objects are files under a root directory.
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use ember_sys::beneath::{FileType, PinnedDir};
use ember_sys::SysError;
use rustix::fs::AtFlags;
use rustix::io::Errno;

use super::{check_key, check_size, ObjectMeta, ObjectStore, Staged, MAX_OBJECT_BYTES};
use crate::{ManifestKey, StoreError};

/// A directory as an object store: key `a/b` is the file `<root>/a/b`.
///
/// A `put` writes `<root>/.tmp/<unique>`, optionally fsyncs it, then renames it
/// over the key, so a key is never half-written, even if the process is killed.
///
/// The store is a directory another party may write (a shared volume, a
/// store a sandbox's snapshots fill): every path below the root is resolved
/// beneath the root's pinned fd without following a symlink
/// ([`PinnedDir`]: `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`),
/// the temp dir is held by its own fd from [`LocalStore::open`] on, and a
/// rename goes from that fd to the key's folder's fd.
#[derive(Debug)]
pub struct LocalStore {
    root: PathBuf,
    dir: PinnedDir,
    tmp: Arc<PinnedDir>,
    fsync: bool,
    key: ManifestKey,
}

/// Names temp files uniquely within the process (several stores may share a root).
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io { op, path: path.to_path_buf(), source }
}

fn sys(e: SysError) -> StoreError {
    StoreError::Io { op: e.op, path: e.target.into(), source: e.source }
}

fn errno<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> StoreError + 'a {
    move |e| StoreError::Io { op, path: path.to_path_buf(), source: e.into() }
}

fn is(e: &SysError, code: Errno) -> bool {
    e.source.raw_os_error() == Some(code.raw_os_error())
}

/// The folder part of `key` (up to its last `/`, `.` for none) and its name.
fn meta_of(key: &str, st: &rustix::fs::Stat) -> ObjectMeta {
    let since = Duration::new(st.st_mtime.max(0) as u64, st.st_mtime_nsec.clamp(0, 999_999_999) as u32);
    ObjectMeta { key: key.to_string(), size: st.st_size as u64, modified: UNIX_EPOCH + since }
}

fn split(key: &str) -> (&str, &str) {
    key.rsplit_once('/').unwrap_or((".", key))
}

impl LocalStore {
    /// Opens (creating if needed) a store rooted at `root`, its manifests
    /// signed and verified with `key`. Puts are fsynced before the rename, so
    /// a manifest never outlives its chunks across a power loss. The root's
    /// own path is the operator's; it is pinned (its last part not a symlink).
    pub fn open(root: impl Into<PathBuf>, key: ManifestKey) -> Result<Self, StoreError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(io("create", &root))?;
        let dir = PinnedDir::open(&root).map_err(sys)?;
        let tmp = Arc::new(dir.ensure_dir(".tmp", 0o755).map_err(sys)?);
        Ok(LocalStore { root, dir, tmp, fsync: true, key })
    }

    /// Turns the fsync before each rename off (tests, benchmarks on throwaway data).
    pub fn without_fsync(mut self) -> Self {
        self.fsync = false;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder `rel` below the root (`.` for the root), opened beneath
    /// it; `None` if it does not exist.
    fn folder(&self, rel: &str) -> Result<Option<PinnedDir>, StoreError> {
        match self.dir.open_dir(rel) {
            Ok(d) => Ok(Some(d)),
            Err(e) if is(&e, Errno::NOENT) => Ok(None),
            Err(e) => Err(sys(e)),
        }
    }

    /// The folder `rel` below the root, made part by part where missing
    /// (`mkdirat` in the parent's fd; a symlink on the way is ELOOP).
    fn make_folder(&self, rel: &str) -> Result<PinnedDir, StoreError> {
        let mut at = self.dir.open_dir(".").map_err(sys)?;
        for part in rel.split('/').filter(|p| *p != ".") {
            at = at.ensure_dir(part, 0o755).map_err(sys)?;
        }
        Ok(at)
    }

    /// The folder `prefix` names (its part up to the last `/`).
    fn prefix_folder(&self, prefix: &str) -> Result<Option<PinnedDir>, StoreError> {
        let (folder, _) = split(prefix);
        if folder != "." {
            check_key(folder)?;
        }
        self.folder(folder)
    }

    /// Writes `data` to a new temp file (its name in the temp dir, and the
    /// file); fsyncs it if `sync`, else only starts its writeback.
    fn write_tmp(&self, data: &[u8], sync: bool) -> Result<(String, fs::File), StoreError> {
        let name = format!("{}-{}", std::process::id(), TMP_COUNTER.fetch_add(1, Ordering::Relaxed));
        let path = self.tmp.path().join(&name);
        let result = (|| {
            let mut f = self.tmp.create_file(&name, 0o644).map_err(sys)?;
            f.write_all(data).map_err(io("write", &path))?;
            if sync {
                f.sync_all().map_err(io("fsync", &path))?;
            } else {
                // A staged object is fsynced in the background: its pages go
                // to the disk now (the kernel starts the writeback and does
                // not wait for it; the pages, never read again here, leave
                // the cache once clean).
                let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
            }
            Ok(f)
        })();
        match result {
            Ok(f) => Ok((name, f)),
            Err(e) => {
                let _ = self.tmp.remove_file(&name);
                Err(e)
            }
        }
    }

    /// Renames the temp file `tmp` over `key`, making its folder; returns
    /// the folder. Removes the temp file on failure.
    fn rename_into(&self, tmp: &str, key: &str) -> Result<PinnedDir, StoreError> {
        let (folder, name) = split(key);
        let result = self.make_folder(folder).and_then(|dest| {
            rustix::fs::renameat(&*self.tmp, tmp, &dest, name)
                .map_err(errno("rename into", &self.root.join(key)))
                .map(|()| dest)
        });
        if result.is_err() {
            let _ = self.tmp.remove_file(tmp);
        }
        result
    }

    /// Calls `found(key, folder, name)` for every regular file below `dir`
    /// (the folder `rel`), by the directory entries' types, each folder opened
    /// beneath its parent: a symlink is neither a file nor a folder here.
    fn walk(
        &self,
        dir: &PinnedDir,
        rel: &str,
        found: &mut dyn FnMut(&str, &PinnedDir, &str) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let path = dir.path().to_path_buf();
        for entry in rustix::fs::Dir::read_from(dir).map_err(errno("list", &path))? {
            let entry = entry.map_err(errno("list", &path))?;
            let Ok(name) = entry.file_name().to_str() else { continue };
            let key = if rel == "." { name.to_string() } else { format!("{rel}/{name}") };
            let kind = match entry.file_type() {
                FileType::Unknown => rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| FileType::from_raw_mode(st.st_mode))
                    .map_err(errno("stat", &path.join(name)))?,
                k => k,
            };
            match kind {
                FileType::Directory if name != "." && name != ".." => match dir.open_dir(name) {
                    Ok(sub) => self.walk(&sub, &key, found)?,
                    // Swapped for a link (or removed) since the listing.
                    Err(e) if is(&e, Errno::LOOP) || is(&e, Errno::NOENT) || is(&e, Errno::NOTDIR) => {}
                    Err(e) => return Err(sys(e)),
                },
                FileType::RegularFile => found(&key, dir, name)?,
                _ => {}
            }
        }
        Ok(())
    }

    fn collect(&self, dir: &PinnedDir, rel: &str, out: &mut Vec<ObjectMeta>) -> Result<(), StoreError> {
        self.walk(dir, rel, &mut |key, folder, name| {
            let st = match rustix::fs::statat(folder, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::NOENT) => return Ok(()),
                Err(e) => return Err(errno("stat", &folder.path().join(name))(e)),
            };
            out.push(meta_of(key, &st));
            Ok(())
        })
    }
}

impl ObjectStore for LocalStore {
    fn manifest_key(&self) -> &ManifestKey {
        &self.key
    }

    fn put(&self, key: &str, data: &[u8]) -> Result<(), StoreError> {
        check_key(key)?;
        check_size(key, data.len() as u64)?;
        let (tmp, _) = self.write_tmp(data, self.fsync)?;
        self.rename_into(&tmp, key).map(drop)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        check_key(key)?;
        let path = self.root.join(key);
        let mut f = self.dir.open_file(key).map_err(|e| match is(&e, Errno::NOENT) {
            true => StoreError::NotFound { key: key.to_string() },
            false => sys(e),
        })?;
        let size = f.metadata().map_err(io("stat", &path))?.len();
        check_size(key, size)?;
        // The file may grow after the stat: read no more than the cap allows.
        let mut data = Vec::with_capacity(size as usize);
        (&mut f).take(MAX_OBJECT_BYTES + 1).read_to_end(&mut data).map_err(io("read", &path))?;
        check_size(key, data.len() as u64)?;
        Ok(data)
    }

    fn get_range(&self, key: &str, at: u64, len: u64) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(key)?;
        check_size(key, len)?;
        let path = self.root.join(key);
        let f = self.dir.open_file(key).map_err(|e| match is(&e, Errno::NOENT) {
            true => StoreError::NotFound { key: key.to_string() },
            false => sys(e),
        })?;
        let mut data = vec![0u8; len as usize];
        let mut got = 0;
        while got < data.len() {
            match std::os::unix::fs::FileExt::read_at(&f, &mut data[got..], at + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io("read", &path)(e)),
            }
        }
        data.truncate(got);
        Ok(Some(data))
    }

    fn exists(&self, key: &str) -> Result<bool, StoreError> {
        check_key(key)?;
        match self.dir.kind(key) {
            Ok(kind) => Ok(kind == Some(FileType::RegularFile)),
            // A folder on the way that is a file: no such object.
            Err(e) if is(&e, Errno::NOTDIR) => Ok(false),
            Err(e) => Err(sys(e)),
        }
    }

    fn meta(&self, key: &str) -> Result<Option<ObjectMeta>, StoreError> {
        check_key(key)?;
        let (folder, name) = split(key);
        let dir = match self.dir.open_dir(folder) {
            Ok(dir) => dir,
            // No such folder, or a file where a folder would be: no object.
            Err(e) if is(&e, Errno::NOENT) || is(&e, Errno::NOTDIR) => return Ok(None),
            Err(e) => return Err(sys(e)),
        };
        match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => Ok(Some(meta_of(key, &st))),
            Ok(_) | Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(errno("stat", &dir.path().join(name))(e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        // Walk the deepest folder the prefix names, then filter by the full prefix.
        let mut out = Vec::new();
        if let Some(dir) = self.prefix_folder(prefix)? {
            self.collect(&dir, split(prefix).0, &mut out)?;
        }
        out.retain(|m| m.key.starts_with(prefix) && !m.key.starts_with(".tmp/"));
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        check_key(key)?;
        let (folder, name) = split(key);
        match self.folder(folder)? {
            Some(dir) => dir.remove_file(name).map_err(sys),
            None => Ok(()),
        }
    }

    fn list_keys(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        if let Some(dir) = self.prefix_folder(prefix)? {
            self.walk(&dir, split(prefix).0, &mut |key, _, _| {
                out.push(key.to_string());
                Ok(())
            })?;
        }
        out.retain(|k| k.starts_with(prefix) && !k.starts_with(".tmp/"));
        Ok(out)
    }

    /// The temp file is written and its fsync started in the background, but
    /// it is not renamed: invisible until the batch commits, so a power loss
    /// can never leave a chunk that exists but holds garbage (a later
    /// snapshot would reuse it).
    fn put_staged(&self, key: &str, data: &[u8], batch: &Staged) -> Result<(), StoreError> {
        check_key(key)?;
        check_size(key, data.len() as u64)?;
        if !self.fsync {
            return self.put(key, data);
        }
        let (name, file) = self.write_tmp(data, false)?;
        let path = self.tmp.path().join(&name);
        batch.push(&self.tmp, name, key.to_string());
        batch.early.push(file, path);
        Ok(())
    }

    /// Waits for the batch's fsyncs (started as each file was written, from
    /// several threads: the filesystem flushes many together), renames the
    /// files into place and fsyncs their folders.
    fn commit_staged(&self, batch: &Staged) -> Result<(), StoreError> {
        let synced = batch.early.finish();
        let files = batch.take();
        let result = synced.and_then(|()| {
            let mut folders: Vec<(&str, PinnedDir)> = Vec::new();
            for (tmp, key) in &files {
                let dest = self.rename_into(tmp, key)?;
                let folder = split(key).0;
                if !folders.iter().any(|(f, _)| *f == folder) {
                    folders.push((folder, dest));
                }
            }
            folders.iter().try_for_each(|(_, d)| rustix::fs::fsync(d).map_err(errno("fsync", d.path())))
        });
        if result.is_err() {
            for (tmp, _) in &files {
                let _ = self.tmp.remove_file(tmp);
            }
        }
        result
    }
}
