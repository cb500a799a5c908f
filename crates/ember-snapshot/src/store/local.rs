//! [`LocalStore`]: objects are files under a root directory.
use std::fs;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{check_key, ObjectMeta, ObjectStore};
use crate::StoreError;

/// A directory as an object store: key `a/b` is the file `<root>/a/b`.
///
/// A `put` writes `<root>/.tmp/<unique>`, optionally fsyncs it, then renames it
/// over the key, so a key is never half-written, even if the process is killed.
#[derive(Debug)]
pub struct LocalStore {
    root: PathBuf,
    fsync: bool,
}

/// Names temp files uniquely within the process (several stores may share a root).
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io { op, path: path.to_path_buf(), source }
}

impl LocalStore {
    /// Opens (creating if needed) a store rooted at `root`. Puts are fsynced
    /// before the rename, so a manifest never outlives its chunks across a power loss.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        let tmp = root.join(".tmp");
        fs::create_dir_all(&tmp).map_err(io("create", &tmp))?;
        Ok(LocalStore { root, fsync: true })
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

    fn collect(&self, dir: &Path, out: &mut Vec<ObjectMeta>) -> Result<(), StoreError> {
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io("list", dir)(e)),
        };
        for entry in rd {
            let entry = entry.map_err(io("list", dir))?;
            let path = entry.path();
            let meta = entry.metadata().map_err(io("stat", &path))?;
            if meta.is_dir() {
                self.collect(&path, out)?;
            } else if meta.is_file() {
                let Ok(rel) = path.strip_prefix(&self.root) else { continue };
                let Some(key) = rel.to_str() else { continue };
                let modified = meta.modified().map_err(io("stat", &path))?;
                out.push(ObjectMeta { key: key.to_string(), size: meta.len(), modified });
            }
        }
        Ok(())
    }
}

impl ObjectStore for LocalStore {
    fn put(&self, key: &str, data: &[u8]) -> Result<(), StoreError> {
        let dest = self.path(key)?;
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self.root.join(".tmp").join(format!("{}-{n}", std::process::id()));
        let result = (|| {
            let mut f = fs::File::create(&tmp).map_err(io("create", &tmp))?;
            f.write_all(data).map_err(io("write", &tmp))?;
            if self.fsync {
                f.sync_all().map_err(io("fsync", &tmp))?;
            }
            if let Some(parent) = dest.parent() {
                fs::create_dir_all(parent).map_err(io("create", parent))?;
            }
            fs::rename(&tmp, &dest).map_err(io("rename into", &dest))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let path = self.path(key)?;
        fs::read(&path).map_err(|e| match e.kind() {
            ErrorKind::NotFound => StoreError::NotFound { key: key.to_string() },
            _ => io("read", &path)(e),
        })
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
        let dir = match prefix.rfind('/') {
            Some(i) => {
                check_key(&prefix[..i])?;
                self.root.join(&prefix[..i])
            }
            None => self.root.clone(),
        };
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
}
