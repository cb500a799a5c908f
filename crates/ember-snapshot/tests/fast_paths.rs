//! The fast paths: staged puts (batched fsync) keep chunks invisible until
//! their batch commits; a fork's copies equal a restore; progress phases come
//! in order; a second snapshot reuses chunks found by the one store listing.
mod common;

use std::cell::RefCell;
use std::fs;

use common::{assert_same_tree, mixed_tree};
use ember_snapshot::{copy_restored, restore, snapshot, ObjectStore, Phase, RestoreOptions, SnapshotOptions, Staged};

#[test]
fn staged_puts_appear_only_when_their_batch_commits() {
    let tmp = tempfile::tempdir().unwrap();
    let store = common::local_store(&tmp.path().join("store"));
    let batch = Staged::new();
    store.put_staged("chunks/aa", b"one", &batch).unwrap();
    store.put_staged("chunks/bb", b"two", &batch).unwrap();
    assert!(!store.exists("chunks/aa").unwrap(), "visible before the batch is durable");
    store.commit_staged(&batch).unwrap();
    assert_eq!(store.get("chunks/bb").unwrap(), b"two");

    // An abandoned batch (a failed snapshot) leaves neither objects nor temp files.
    let abandoned = Staged::new();
    store.put_staged("chunks/cc", b"three", &abandoned).unwrap();
    drop(abandoned);
    assert!(!store.exists("chunks/cc").unwrap());
    assert_eq!(fs::read_dir(tmp.path().join("store/.tmp")).unwrap().count(), 0, "temp files left");
}

#[test]
fn copies_of_a_restore_equal_the_source_and_phases_are_ordered() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    mixed_tree(&src);
    let store = common::local_store(&tmp.path().join("store"));
    let phases = RefCell::new(Vec::new());
    let progress = |p: ember_snapshot::Progress| {
        let mut seen = phases.borrow_mut();
        if seen.last() != Some(&p.phase) {
            seen.push(p.phase);
        }
    };
    let mut opts = SnapshotOptions::new("s1");
    opts.progress = &progress;
    let first = snapshot(&src, &store, opts).unwrap();
    let expected = [Phase::Scanning, Phase::Transferring, Phase::Syncing, Phase::Committing, Phase::Done];
    assert_eq!(*phases.borrow(), expected);
    assert!(first.summary.stats.stored_bytes > 0, "stored size recorded");

    // Nothing changed: everything is reused, found by the listing, and stored size is the same.
    let second = snapshot(&src, &store, SnapshotOptions::new("s2")).unwrap();
    assert_eq!(second.summary.stats.chunks_uploaded, 0);
    assert_eq!(second.summary.stats.stored_bytes, first.summary.stats.stored_bytes);

    let a = tmp.path().join("a");
    restore(&store, "s1", &a, RestoreOptions::default()).unwrap();
    let b = tmp.path().join("b");
    let info = copy_restored(&store, "s1", &a, &b, RestoreOptions::default()).unwrap();
    assert_eq!(info.bytes, first.summary.stats.logical_bytes);
    assert_same_tree(&src, &b);

    // A source that no longer matches the manifest is refused, and nothing is left.
    fs::OpenOptions::new().write(true).open(a.join("big.bin")).unwrap().set_len(1).unwrap();
    let c = tmp.path().join("c");
    assert!(copy_restored(&store, "s1", &a, &c, RestoreOptions::default()).is_err());
    assert!(!c.exists());
}

/// Counts the reads of manifests (`manifests/…`), passing every call on.
struct ManifestReads {
    inner: ember_snapshot::LocalStore,
    reads: std::sync::atomic::AtomicUsize,
}

impl ManifestReads {
    fn take(&self) -> usize {
        self.reads.swap(0, std::sync::atomic::Ordering::SeqCst)
    }
}

impl ObjectStore for ManifestReads {
    fn manifest_key(&self) -> &ember_snapshot::ManifestKey {
        self.inner.manifest_key()
    }
    fn put(&self, key: &str, data: &[u8]) -> Result<(), ember_snapshot::StoreError> {
        self.inner.put(key, data)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, ember_snapshot::StoreError> {
        if key.starts_with("manifests/") {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.inner.get(key)
    }
    fn exists(&self, key: &str) -> Result<bool, ember_snapshot::StoreError> {
        self.inner.exists(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ember_snapshot::ObjectMeta>, ember_snapshot::StoreError> {
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> Result<(), ember_snapshot::StoreError> {
        self.inner.delete(key)
    }
}

/// A fork checks the snapshot's size, restores it once and copies that
/// restore: with the manifest loaded once, the store is asked for it once
/// (the engine's restore asked twice, a fork of n once more per copy).
#[test]
fn a_loaded_snapshot_is_restored_and_copied_without_reading_its_manifest_again() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    mixed_tree(&src);
    let store = ManifestReads { inner: common::local_store(&tmp.path().join("store")), reads: Default::default() };
    snapshot(&src, &store, SnapshotOptions::new("s1")).unwrap();
    store.take();

    // Step by step, each call reads the manifest itself.
    let summary = ember_snapshot::inspect(&store, "s1").unwrap();
    restore(&store, "s1", &tmp.path().join("a"), RestoreOptions::default()).unwrap();
    copy_restored(&store, "s1", &tmp.path().join("a"), &tmp.path().join("b"), RestoreOptions::default()).unwrap();
    assert_eq!(store.take(), 3, "inspect, restore, copy");

    let loaded = ember_snapshot::load_snapshot(&store, "s1").unwrap();
    assert_eq!(loaded.summary(), summary);
    assert_eq!(loaded.id(), "s1");
    let (c, d, e) = (tmp.path().join("c"), tmp.path().join("d"), tmp.path().join("e"));
    let info = ember_snapshot::restore_loaded(&store, &loaded, &c, RestoreOptions::default()).unwrap();
    assert_eq!(info.bytes, summary.stats.logical_bytes);
    for copy in [&d, &e] {
        ember_snapshot::copy_loaded(&store, &loaded, &c, copy, RestoreOptions::default()).unwrap();
    }
    assert_eq!(store.take(), 1, "one read for the size check, the restore and both copies");
    for tree in [&c, &d, &e] {
        assert_same_tree(&src, tree);
    }
    // The size check still holds on a loaded snapshot.
    let small = RestoreOptions { max_bytes: Some(1), ..Default::default() };
    let refused = ember_snapshot::restore_loaded(&store, &loaded, &tmp.path().join("f"), small);
    assert!(matches!(refused, Err(ember_snapshot::SnapshotError::TooLarge { .. })), "{refused:?}");
    assert!(!tmp.path().join("f").exists());
}
