//! [`LocalStore`]: objects are files under a root directory.
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{check_key, check_size, ObjectMeta, ObjectStore, Staged, MAX_OBJECT_BYTES};
use crate::{ManifestKey, StoreError};

/// A directory as an object store: key `a/b` is the file `<root>/a/b`.
///
/// A `put` writes `<root>/.tmp/<unique>`, optionally fsyncs it, then renames it
/// over the key, so a key is never half-written, even if the process is killed.
#[derive(Debug)]
pub struct LocalStore {
    root: PathBuf,
    fsync: bool,
    key: ManifestKey,
}

/// Names temp files uniquely within the process (several stores may share a root).
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io { op, path: path.to_path_buf(), source }
}

impl LocalStore {
    /// Opens (creating if needed) a store rooted at `root`, its manifests
    /// signed and verified with `key`. Puts are fsynced before the rename, so
    /// a manifest never outlives its chunks across a power loss.
    pub fn open(root: impl Into<PathBuf>, key: ManifestKey) -> Result<Self, StoreError> {
        let root = root.into();
        let tmp = root.join(".tmp");
        fs::create_dir_all(&tmp).map_err(io("create", &tmp))?;
        Ok(LocalStore { root, fsync: true, key })
    }

    /// Turns the fsync before each rename off (tests, benchmarks on throwaway data).
    pub fn without_fsync(mut self) -> Self {
        self.fsync = false;
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        check_key(key)?;
        Ok(self.root.join(key))
    }

    fn tmp_path(&self) -> PathBuf {
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        self.root.join(".tmp").join(format!("{}-{n}", std::process::id()))
    }

    /// The folder `prefix` names (its part up to the last `/`).
    fn prefix_dir(&self, prefix: &str) -> Result<PathBuf, StoreError> {
        Ok(match prefix.rfind('/') {
            Some(i) => {
                check_key(&prefix[..i])?;
                self.root.join(&prefix[..i])
            }
            None => self.root.clone(),
        })
    }

    /// Writes `data` to a new temp file; fsyncs it if `sync`.
    fn write_tmp(&self, data: &[u8], sync: bool) -> Result<PathBuf, StoreError> {
        let tmp = self.tmp_path();
        let result = (|| {
            let mut f = fs::File::create(&tmp).map_err(io("create", &tmp))?;
            f.write_all(data).map_err(io("write", &tmp))?;
            if sync {
                f.sync_all().map_err(io("fsync", &tmp))?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(tmp),
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// Calls `found(key, path, entry)` for every regular file below `dir`, by
    /// the directory entries' types (no stat unless `found` asks for one).
    fn walk(
        &self,
        dir: &Path,
        found: &mut dyn FnMut(&str, &Path, &fs::DirEntry) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io("list", dir)(e)),
        };
        for entry in rd {
            let entry = entry.map_err(io("list", dir))?;
            let path = entry.path();
            let ft = entry.file_type().map_err(io("stat", &path))?;
            if ft.is_dir() {
                self.walk(&path, found)?;
            } else if ft.is_file() {
                let Ok(rel) = path.strip_prefix(&self.root) else { continue };
                let Some(key) = rel.to_str() else { continue };
                found(key, &path, &entry)?;
            }
        }
        Ok(())
    }

    fn collect(&self, dir: &Path, out: &mut Vec<ObjectMeta>) -> Result<(), StoreError> {
        self.walk(dir, &mut |key, path, entry| {
            let meta = entry.metadata().map_err(io("stat", path))?;
            let modified = meta.modified().map_err(io("stat", path))?;
            out.push(ObjectMeta { key: key.to_string(), size: meta.len(), modified });
            Ok(())
        })
    }
}

impl ObjectStore for LocalStore {
    fn manifest_key(&self) -> &ManifestKey {
        &self.key
    }

    fn put(&self, key: &str, data: &[u8]) -> Result<(), StoreError> {
        let dest = self.path(key)?;
        check_size(key, data.len() as u64)?;
        let tmp = self.write_tmp(data, self.fsync)?;
        rename_into(&tmp, &dest)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let path = self.path(key)?;
        // The object itself is never followed if it is a symlink (a store
        // another party can write); the dirs above it are the store's own.
        let nofollow = rustix::fs::OFlags::NOFOLLOW.bits() as i32;
        let open = fs::OpenOptions::new().read(true).custom_flags(nofollow).open(&path);
        let mut f = open.map_err(|e| match e.kind() {
            ErrorKind::NotFound => StoreError::NotFound { key: key.to_string() },
            _ => io("read", &path)(e),
        })?;
        let size = f.metadata().map_err(io("stat", &path))?.len();
        check_size(key, size)?;
        // The file may grow after the stat: read no more than the cap allows.
        let mut data = Vec::with_capacity(size as usize);
        (&mut f).take(MAX_OBJECT_BYTES + 1).read_to_end(&mut data).map_err(io("read", &path))?;
        check_size(key, data.len() as u64)?;
        Ok(data)
    }

    fn exists(&self, key: &str) -> Result<bool, StoreError> {
        let path = self.path(key)?;
        match fs::symlink_metadata(&path) {
            Ok(m) => Ok(m.is_file()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io("stat", &path)(e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        // Walk the deepest folder the prefix names, then filter by the full prefix.
        let dir = self.prefix_dir(prefix)?;
        let mut out = Vec::new();
        self.collect(&dir, &mut out)?;
        out.retain(|m| m.key.starts_with(prefix) && !m.key.starts_with(".tmp/"));
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key)?;
        match fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(io("delete", &path)(e)),
            _ => Ok(()),
        }
    }

    fn list_keys(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        self.walk(&self.prefix_dir(prefix)?, &mut |key, _, _| {
            out.push(key.to_string());
            Ok(())
        })?;
        out.retain(|k| k.starts_with(prefix) && !k.starts_with(".tmp/"));
        Ok(out)
    }

    /// The temp file is written but neither fsynced nor renamed: invisible
    /// until the batch commits, so a power loss can never leave a chunk that
    /// exists but holds garbage (a later snapshot would reuse it).
    fn put_staged(&self, key: &str, data: &[u8], batch: &Staged) -> Result<(), StoreError> {
        let dest = self.path(key)?;
        check_size(key, data.len() as u64)?;
        if !self.fsync {
            return self.put(key, data);
        }
        batch.push(self.write_tmp(data, false)?, dest);
        Ok(())
    }

    /// fsyncs the batch's files from several threads at once (the filesystem
    /// then commits its journal for many of them together: ~4x faster than one
    /// fsync per put here), renames them into place and fsyncs their folders.
    fn commit_staged(&self, batch: &Staged) -> Result<(), StoreError> {
        let files = batch.take();
        let result = sync_all(&files).and_then(|()| {
            let mut dirs: Vec<&Path> = Vec::new();
            for (tmp, dest) in &files {
                rename_into(tmp, dest)?;
                if let Some(parent) = dest.parent().filter(|p| !dirs.contains(p)) {
                    dirs.push(parent);
                }
            }
            dirs.into_iter().try_for_each(|d| fs::File::open(d).and_then(|f| f.sync_all()).map_err(io("fsync", d)))
        });
        if result.is_err() {
            for (tmp, _) in &files {
                let _ = fs::remove_file(tmp);
            }
        }
        result
    }
}

/// Concurrent fsyncs: the time goes to waiting on the device, not the CPU.
const SYNC_THREADS: usize = 8;

fn sync_all(files: &[(PathBuf, PathBuf)]) -> Result<(), StoreError> {
    if files.is_empty() {
        return Ok(());
    }
    let per = files.len().div_ceil(SYNC_THREADS);
    std::thread::scope(|s| {
        let handles: Vec<_> = files
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    part.iter().try_for_each(|(tmp, _)| {
                        fs::File::open(tmp).and_then(|f| f.sync_all()).map_err(io("fsync", tmp))
                    })
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(io("fsync", Path::new("."))(std::io::Error::other("fsync thread panicked"))))
        })
    })
}

/// Renames a written temp file over `dest`, creating its folder; removes the temp file on failure.
fn rename_into(tmp: &Path, dest: &Path) -> Result<(), StoreError> {
    let result = (|| {
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent).map_err(io("create", parent))?;
        }
        fs::rename(tmp, dest).map_err(io("rename into", dest))
    })();
    if result.is_err() {
        let _ = fs::remove_file(tmp);
    }
    result
}
