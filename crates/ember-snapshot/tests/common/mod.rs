//! Shared by the integration tests: trees, comparison, a failing store.
#![allow(dead_code, reason = "each test binary uses a different subset")]
use std::fs;
use std::os::unix::fs::{lchown, symlink, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};

use ember_snapshot::{LocalStore, ManifestKey, ObjectMeta, ObjectStore, StoreError};
use filetime::FileTime;

/// xorshift64*: deterministic test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(len);
        v
    }
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// Nested dirs, empty files, a 20 MB random file, symlinks (relative, absolute,
/// dangling), odd modes, uid/gid 1000, fixed mtimes, and a socket (skipped).
pub fn mixed_tree(root: &Path) {
    let mut rng = Rng(42);
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir_all(root.join("empty-dir")).unwrap();
    fs::create_dir_all(root.join("sticky")).unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    fs::write(root.join("a/b/c/empty2"), b"").unwrap();
    fs::write(root.join("big.bin"), rng.bytes(20_000_000)).unwrap();
    fs::write(root.join("a/hello.txt"), b"hello\n").unwrap();
    fs::write(root.join("a/b/script.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::write(root.join("a/b/setuid"), rng.bytes(3000)).unwrap();
    fs::write(root.join("owned-by-1000"), rng.bytes(100_000)).unwrap();
    fs::write(root.join("a/dup1"), b"same content").unwrap();
    fs::write(root.join("a/dup2"), b"same content").unwrap();
    symlink("hello.txt", root.join("a/link-rel")).unwrap();
    symlink("/etc/hostname", root.join("link-abs")).unwrap();
    symlink("does/not/exist", root.join("a/b/dangling")).unwrap();
    std::os::unix::net::UnixListener::bind(root.join("a/sock")).unwrap();
    chmod(&root.join("a/b/script.sh"), 0o755);
    chmod(&root.join("a/b/setuid"), 0o4750);
    chmod(&root.join("a/hello.txt"), 0o600);
    chmod(&root.join("sticky"), 0o1777);
    chmod(&root.join("empty-dir"), 0o555);
    lchown(root.join("owned-by-1000"), Some(1000), Some(1000)).unwrap();
    lchown(root.join("a/b"), Some(1000), Some(1001)).unwrap();
    lchown(root.join("a/link-rel"), Some(1000), Some(1000)).unwrap();
    chmod(&root.join("a/b"), 0o750);
    let t = FileTime::from_unix_time(1_600_000_000, 123_456_789);
    filetime::set_file_times(root.join("a/hello.txt"), t, t).unwrap();
    filetime::set_symlink_file_times(root.join("a/link-rel"), t, t).unwrap();
    filetime::set_file_times(root.join("a/b/c"), t, t).unwrap();
}

#[allow(unused_imports, reason = "each test binary uses a different subset")]
pub use ember_snapshot::conformance::assert_same_tree;

/// A store that fails every put after the first `allowed` (a crash mid-upload).
pub struct FailingStore {
    pub inner: LocalStore,
    pub puts_left: AtomicI64,
}

impl ObjectStore for FailingStore {
    fn manifest_key(&self) -> &ManifestKey {
        self.inner.manifest_key()
    }
    fn put(&self, key: &str, data: &[u8]) -> Result<(), StoreError> {
        if self.puts_left.fetch_sub(1, Ordering::SeqCst) <= 0 {
            let source = std::io::Error::other("injected failure");
            return Err(StoreError::Io { op: "put", path: key.into(), source });
        }
        self.inner.put(key, data)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.inner.get(key)
    }
    fn exists(&self, key: &str) -> Result<bool, StoreError> {
        self.inner.exists(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key)
    }
}

pub fn keys(store: &dyn ObjectStore, prefix: &str) -> Vec<String> {
    store.list(prefix).unwrap().into_iter().map(|m| m.key).collect()
}

/// A local store at `dir` with a key of its own (each test is its own node).
pub fn local_store(dir: &Path) -> LocalStore {
    LocalStore::open(dir, ManifestKey::ephemeral()).unwrap()
}

/// Whether `err` refuses snapshot `id`'s manifest as tampered (its MAC).
pub fn is_tampered(err: &ember_snapshot::SnapshotError, id: &str) -> bool {
    matches!(err, ember_snapshot::SnapshotError::Tampered { id: i, .. } if i == id)
}
