//! What a snapshot leaves when it cannot commit, and gc.
mod common;

use std::collections::HashSet;
use std::fs;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use common::{keys, FailingStore, Rng};
use ember_snapshot::manifest::Manifest;
use ember_snapshot::{
    delete, gc, list, restore, snapshot, GcOptions, ObjectStore, RestoreOptions, SnapshotError, SnapshotOptions,
};

fn tree(root: &std::path::Path, seed: u64, files: usize) {
    fs::create_dir_all(root).unwrap();
    let mut rng = Rng(seed);
    for i in 0..files {
        fs::write(root.join(format!("f{i}")), rng.bytes(300_000 + i * 1000)).unwrap();
    }
}

#[test]
fn interrupted_snapshot_leaves_no_manifest_and_a_later_one_completes() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src, 1, 10);
    let inner = common::local_store(&tmp.path().join("store"));
    // 1 marker + 4 chunks succeed, then the store "dies".
    let failing = FailingStore { inner, puts_left: AtomicI64::new(5) };
    let err = snapshot(&src, &failing, SnapshotOptions::new("snap")).unwrap_err();
    assert!(matches!(err, SnapshotError::Store(_)), "{err:?}");
    assert_eq!(keys(&failing, "chunks/").len(), 4, "the chunks before the failure stay");
    assert!(keys(&failing, "manifests/").is_empty());
    assert!(keys(&failing, "pending/").is_empty(), "the marker is removed on failure");
    assert!(list(&failing).unwrap().is_empty());

    let store = failing.inner;
    let info = snapshot(&src, &store, SnapshotOptions::new("snap")).unwrap();
    assert_eq!(info.summary.stats.chunks_reused, 4, "the chunks of the failed attempt are reused");
    assert_eq!(list(&store).unwrap().len(), 1);
    restore(&store, "snap", &tmp.path().join("out"), RestoreOptions::default()).unwrap();
}

#[test]
fn commit_guard_false_refuses_and_writes_no_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src, 2, 3);
    let store = common::local_store(&tmp.path().join("store"));
    let fenced = || false;
    let mut opts = SnapshotOptions::new("stale-writer");
    opts.commit_guard = &fenced;
    let err = snapshot(&src, &store, opts).unwrap_err();
    assert!(matches!(&err, SnapshotError::CommitRefused { id } if id == "stale-writer"), "{err:?}");
    assert!(err.to_string().contains("commit guard"));
    assert!(!store.exists("manifests/stale-writer.json").unwrap());
    assert!(list(&store).unwrap().is_empty());
    assert!(keys(&store, "pending/").is_empty());
}

fn chunks_of(store: &dyn ObjectStore, id: &str) -> HashSet<String> {
    let key = format!("manifests/{id}.json");
    let m = Manifest::decode(&key, id, &store.get(&key).unwrap(), store.manifest_key()).unwrap();
    m.chunk_ids().map(|c| format!("chunks/{c}")).collect()
}

#[test]
fn gc_removes_exactly_the_unreferenced_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src, 3, 6);
    let store = common::local_store(&tmp.path().join("store"));
    snapshot(&src, &store, SnapshotOptions::new("a")).unwrap();
    // b shares f0..f2 with a, replaces f3..f5.
    tree(&src.join("../src2"), 4, 6);
    for i in 0..3 {
        fs::copy(src.join(format!("f{i}")), tmp.path().join(format!("src2/f{i}"))).unwrap();
    }
    snapshot(&tmp.path().join("src2"), &store, SnapshotOptions::new("b")).unwrap();
    store.put("chunks/0000orphan", b"not referenced by anything").unwrap();
    let (a, b) = (chunks_of(&store, "a"), chunks_of(&store, "b"));
    assert!(!a.is_disjoint(&b));

    // Young unreferenced chunks are spared by default.
    let report = gc(&store, GcOptions::default()).unwrap();
    assert_eq!((report.chunks_deleted, report.chunks_spared_young), (0, 1));

    delete(&store, "a").unwrap();
    assert!(matches!(delete(&store, "a"), Err(SnapshotError::NotFound { .. })));
    let before: HashSet<String> = keys(&store, "chunks/").into_iter().collect();
    let expected: HashSet<String> = before.difference(&b).cloned().collect();
    assert_eq!(expected.len(), a.difference(&b).count() + 1);
    let report = gc(&store, GcOptions { min_age: Duration::ZERO, ..GcOptions::default() }).unwrap();
    let after: HashSet<String> = keys(&store, "chunks/").into_iter().collect();
    assert_eq!(after, b, "exactly b's chunks remain");
    assert_eq!(report.chunks_deleted, expected.len() as u64);
    assert_eq!((report.manifests, report.chunks_referenced), (1, b.len() as u64));
    assert!(report.missing_chunks.is_empty());
    assert!(keys(&store, "locks/").is_empty(), "gc released its lock");
    restore(&store, "b", &tmp.path().join("out"), RestoreOptions::default()).unwrap();
}

#[test]
fn gc_and_snapshots_exclude_each_other() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src, 5, 2);
    let store = common::local_store(&tmp.path().join("store"));
    store.put("pending/running", b"").unwrap();
    let err = gc(&store, GcOptions::default()).unwrap_err();
    assert!(matches!(&err, SnapshotError::SnapshotsInProgress { ids } if ids == &["running"]), "{err:?}");
    assert!(keys(&store, "locks/").is_empty());
    // A marker older than the staleness bound is a crashed snapshot's: removed, gc proceeds.
    gc(&store, GcOptions { pending_stale_after: Duration::ZERO, ..GcOptions::default() }).unwrap();
    assert!(keys(&store, "pending/").is_empty());

    store.put("locks/gc", b"").unwrap();
    let mut no_wait = SnapshotOptions::new("s");
    no_wait.gc_wait = Duration::ZERO;
    let err = snapshot(&src, &store, no_wait).unwrap_err();
    assert!(matches!(err, SnapshotError::GcRunning { .. }), "{err:?}");
    assert!(keys(&store, "pending/").is_empty() && keys(&store, "chunks/").is_empty());
    store.delete("locks/gc").unwrap();
    snapshot(&src, &store, SnapshotOptions::new("s")).unwrap();
    let dup = snapshot(&src, &store, SnapshotOptions::new("s")).unwrap_err();
    assert!(matches!(dup, SnapshotError::AlreadyExists { .. }));
    let bad = snapshot(&src, &store, SnapshotOptions::new("../x")).unwrap_err();
    assert!(matches!(bad, SnapshotError::InvalidId { .. }));
}

/// A checkpoint that meets a sweep waits for it instead of failing (the
/// drill saw `409 SNAPSHOT::BUSY` from another node's scheduled gc), and
/// does not announce itself while it waits; a killed gc's lock goes stale.
#[test]
fn a_snapshot_waits_for_a_running_gc_and_ignores_a_dead_ones_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src, 6, 2);
    let store = std::sync::Arc::new(common::local_store(&tmp.path().join("store")));
    store.put("locks/gc", b"gc").unwrap();
    let sweeper = {
        let store = store.clone();
        std::thread::spawn(move || {
            let mut markers_seen = 0;
            for _ in 0..10 {
                std::thread::sleep(Duration::from_millis(60));
                // By design a snapshot's marker is up for the instant
                // between its put and its look at the lock, every poll (a
                // sample once landed there in CI): only a marker still up
                // 20 ms later was left while the snapshot waits.
                if !keys(&*store, "pending/").is_empty() {
                    std::thread::sleep(Duration::from_millis(20));
                    markers_seen += keys(&*store, "pending/").len();
                }
            }
            store.delete("locks/gc").unwrap();
            markers_seen
        })
    };
    let t0 = std::time::Instant::now();
    snapshot(&src, &*store, SnapshotOptions::new("waited")).unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(600), "the snapshot ran beside the lock");
    assert_eq!(sweeper.join().unwrap(), 0, "a waiting snapshot left its marker for the sweep to see");
    assert!(keys(&*store, "pending/").is_empty());

    // A lock last written three minutes ago is a killed gc's: ignored.
    store.put("locks/gc", b"gc").unwrap();
    let lock = tmp.path().join("store/locks/gc");
    let old = std::time::SystemTime::now() - Duration::from_secs(180);
    fs::File::options().write(true).open(&lock).unwrap().set_modified(old).unwrap();
    let mut no_wait = SnapshotOptions::new("past-a-dead-gc");
    no_wait.gc_wait = Duration::ZERO;
    snapshot(&src, &*store, no_wait).unwrap();
}

/// A store that counts listings and answers everything else from a local one.
struct Listings {
    inner: ember_snapshot::LocalStore,
    lists: std::sync::atomic::AtomicUsize,
}

impl ObjectStore for Listings {
    fn manifest_key(&self) -> &ember_snapshot::ManifestKey {
        self.inner.manifest_key()
    }
    fn put(&self, key: &str, data: &[u8]) -> Result<(), ember_snapshot::StoreError> {
        self.inner.put(key, data)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, ember_snapshot::StoreError> {
        self.inner.get(key)
    }
    fn exists(&self, key: &str) -> Result<bool, ember_snapshot::StoreError> {
        self.inner.exists(key)
    }
    fn meta(&self, key: &str) -> Result<Option<ember_snapshot::ObjectMeta>, ember_snapshot::StoreError> {
        self.inner.meta(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ember_snapshot::ObjectMeta>, ember_snapshot::StoreError> {
        self.lists.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> Result<(), ember_snapshot::StoreError> {
        self.inner.delete(key)
    }
}

/// A snapshot costs lookups of its own chunks and of the gc lock, never a
/// listing of the store: a listing per snapshot grows with every chunk
/// ever stored (the JetStream store's full metadata scan per checkpoint
/// flooded the 300-session drill's servers). The second snapshot still
/// finds and reuses the first one's chunks.
#[test]
fn a_snapshot_lists_nothing_and_still_reuses_stored_chunks() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src, 3, 4);
    let store = Listings { inner: common::local_store(&tmp.path().join("store")), lists: Default::default() };
    let first = snapshot(&src, &store, SnapshotOptions::new("one")).unwrap();
    assert!(first.summary.stats.chunks_uploaded > 0);
    let second = snapshot(&src, &store, SnapshotOptions::new("two")).unwrap();
    assert_eq!(second.summary.stats.chunks_uploaded, 0, "every chunk found in the store");
    assert_eq!(second.summary.stats.chunks_reused, first.summary.stats.chunks_uploaded);
    assert_eq!(store.lists.load(std::sync::atomic::Ordering::SeqCst), 0, "listings during two snapshots");
}
