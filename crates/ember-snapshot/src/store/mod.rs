//! The [`ObjectStore`] trait and its two backends: [`LocalStore`] (a directory)
//! and [`S3Store`] (any S3-compatible endpoint).
//!
//! Keys are relative, `/`-separated paths of plain names, such as
//! `chunks/<digest>` and `manifests/<id>.json`. A `put` is atomic: readers see
//! the whole object or nothing.
use ember_sys::beneath::PinnedDir;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::SystemTime;

use crate::{ManifestKey, StoreError};

mod early;
mod local;
mod s3;

pub use local::LocalStore;
pub use s3::{S3Config, S3Store};

#[cfg(feature = "testing")]
pub mod conformance;

/// The largest object any store writes or reads: a packed chunk is at most
/// 16 MiB (the chunker's cap) and a manifest of a million entries about
/// 200 MiB. A put over it is refused (the snapshot fails then, instead of
/// writing what no restore could read back); a get checks the object's size
/// before reading it, so a store someone else wrote cannot make a reader
/// allocate without bound.
pub const MAX_OBJECT_BYTES: u64 = 256 << 20;

/// [`StoreError::TooLarge`] when `size` is over [`MAX_OBJECT_BYTES`].
pub fn check_size(key: &str, size: u64) -> Result<(), StoreError> {
    if size > MAX_OBJECT_BYTES {
        return Err(StoreError::TooLarge { key: key.to_string(), size, limit: MAX_OBJECT_BYTES });
    }
    Ok(())
}

/// One listed object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: String,
    pub size: u64,
    /// When the object was last written; gc spares objects younger than its grace period.
    pub modified: SystemTime,
}

/// A flat key-value object store. Synchronous: call it from a blocking thread.
///
/// A store is opened with the [`ManifestKey`] its manifests are signed and
/// verified with: the key lives outside the store, so writing the store is
/// not enough to get a manifest accepted.
pub trait ObjectStore: Send + Sync {
    /// The key that signs the manifests written here and verifies those read.
    fn manifest_key(&self) -> &ManifestKey;

    /// Writes `data` under `key`, replacing any object there. Atomic.
    /// Refuses data over [`MAX_OBJECT_BYTES`] ([`StoreError::TooLarge`]).
    fn put(&self, key: &str, data: &[u8]) -> Result<(), StoreError>;
    /// [`put`](Self::put) of a key the caller expects to be absent: a chunk
    /// its lookup did not find, a new snapshot's manifest or marker. The
    /// effect is `put`'s whatever the store holds; a store whose `put` looks
    /// the key up first skips that when the guess holds (the JetStream
    /// object store: one request fewer per object).
    fn put_new(&self, key: &str, data: &[u8]) -> Result<(), StoreError> {
        self.put(key, data)
    }
    /// Reads the whole object; [`StoreError::NotFound`] when absent,
    /// [`StoreError::TooLarge`] (before reading it) when over [`MAX_OBJECT_BYTES`].
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError>;
    fn exists(&self, key: &str) -> Result<bool, StoreError>;
    /// Bytes `at..at + len` of the object at `key` (fewer if it ends
    /// sooner), when the store reads part of an object for less than all of
    /// it (a local file, an S3 range request); `None` when it cannot, and
    /// the caller reads the whole object ([`get`](Self::get)). A restore
    /// reads packed chunks so. `len` is a packed chunk's: the caller bounds it.
    fn get_range(&self, key: &str, at: u64, len: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let _ = (key, at, len);
        Ok(None)
    }
    /// Every object whose key starts with `prefix` (a folder such as `chunks/`), in key order.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError>;
    /// Deletes the object; deleting an absent key is not an error.
    fn delete(&self, key: &str) -> Result<(), StoreError>;

    /// The metadata of the object at `key` (`None`: absent), at the cost of
    /// one lookup. A snapshot asks this per chunk and for the gc lock: a
    /// listing of the store's folder per snapshot grew with every chunk ever
    /// stored (on the JetStream object store, a scan of all its metadata per
    /// checkpoint flooded the cluster's servers in the 300-session drill).
    /// The default filters a listing of `key`, for stores that have nothing
    /// cheaper.
    fn meta(&self, key: &str) -> Result<Option<ObjectMeta>, StoreError> {
        Ok(self.list(key)?.into_iter().find(|m| m.key == key))
    }

    /// The keys under `prefix`, in no particular order. A store can answer
    /// this more cheaply than [`list`](Self::list) (no sizes or times).
    fn list_keys(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        Ok(self.list(prefix)?.into_iter().map(|m| m.key).collect())
    }

    /// Writes `data` under `key` as part of `batch`: the object need not be
    /// visible or durable before [`commit_staged`](Self::commit_staged) returns
    /// for that batch. Lets a local store fsync many objects at once instead of
    /// one at a time. Called for chunks a lookup did not find: the default is
    /// [`put_new`](Self::put_new).
    fn put_staged(&self, key: &str, data: &[u8], batch: &Staged) -> Result<(), StoreError> {
        let _ = batch;
        self.put_new(key, data)
    }

    /// Makes every object of `batch` durable and visible (atomically each).
    fn commit_staged(&self, batch: &Staged) -> Result<(), StoreError> {
        let _ = batch;
        Ok(())
    }
}

/// Objects put with [`ObjectStore::put_staged`] and not yet committed: for
/// [`LocalStore`], temp files written but neither fsynced nor renamed. One
/// batch per snapshot, so committing one snapshot's batch never races another's.
/// Dropping an uncommitted batch removes its temp files (by name, in the
/// store's pinned temp dir).
#[derive(Debug, Default)]
pub struct Staged {
    /// (temp file's name, key)
    files: Mutex<Vec<(String, String)>>,
    /// The temp dir they are in (the store's, set by the first push).
    tmp: std::sync::OnceLock<Arc<PinnedDir>>,
    /// Their fsyncs, started as each is written.
    early: early::EarlySync,
}

impl Staged {
    pub fn new() -> Self {
        Staged::default()
    }

    fn push(&self, tmp_dir: &Arc<PinnedDir>, tmp: String, key: String) {
        let _ = self.tmp.set(tmp_dir.clone());
        self.files.lock().push((tmp, key));
    }

    fn take(&self) -> Vec<(String, String)> {
        std::mem::take(&mut *self.files.lock())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let Some(dir) = self.tmp.get().cloned() else { return };
        for (tmp, _) in self.take() {
            let _ = dir.remove_file(&tmp);
        }
    }
}

/// Checks that `key` is relative, `/`-separated plain names (no `.`, `..` or
/// empty parts). Public for backends outside this crate.
pub fn check_key(key: &str) -> Result<(), StoreError> {
    let bad = |reason| Err(StoreError::InvalidKey { key: key.to_string(), reason });
    if key.is_empty() || key.len() > 1024 {
        return bad("empty or longer than 1024 bytes");
    }
    for part in key.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return bad("has an empty, `.` or `..` component");
        }
        if part.starts_with(".tmp") || part.chars().any(|c| c.is_control() || c == '\\') {
            return bad("has a reserved or control character name");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_key;

    #[test]
    fn keys_are_checked() {
        assert!(check_key("chunks/abc").is_ok());
        assert!(check_key("manifests/x.json").is_ok());
        for bad in ["", "/abs", "a//b", "../x", "a/./b", "a/", ".tmp/x", "a\\b"] {
            assert!(check_key(bad).is_err(), "{bad:?} accepted");
        }
    }
}
