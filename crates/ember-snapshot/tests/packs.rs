//! Small chunks go to pack objects: few objects for a tree of small files,
//! dedup across snapshots, restores through ranged and whole reads, gc, and
//! damage found.
mod common;

use std::fs;
use std::path::Path;

use common::{assert_same_tree, keys, Rng};
use ember_snapshot::{
    delete, gc, restore, snapshot, GcOptions, LocalStore, ObjectMeta, ObjectStore, RestoreOptions, SnapshotError,
    SnapshotOptions, StoreError,
};

/// `files` small files (1-40 KB, half text, half random) in a few dirs, and
/// one of 3 MB.
fn tree(root: &Path, files: usize) {
    let mut rng = Rng(7);
    for i in 0..files {
        let dir = root.join(format!("d{}", i % 7));
        fs::create_dir_all(&dir).unwrap();
        let len = 1_000 + (rng.next() % 40_000) as usize;
        let data = match i % 2 {
            0 => format!("line {i} of a source file\n").repeat(len / 24).into_bytes(),
            _ => rng.bytes(len),
        };
        fs::write(dir.join(format!("f{i}")), data).unwrap();
    }
    fs::write(root.join("big.bin"), rng.bytes(3_000_000)).unwrap();
}

/// A temp dir with `tree(src, files)` and an empty local store beside it.
fn setup(files: usize) -> (tempfile::TempDir, std::path::PathBuf, LocalStore) {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    tree(&src, files);
    let store = common::local_store(&tmp.path().join("store"));
    (tmp, src, store)
}

fn now() -> GcOptions {
    GcOptions { min_age: std::time::Duration::ZERO, ..GcOptions::default() }
}

#[test]
fn a_tree_of_small_files_is_stored_in_a_few_packs_and_restored() {
    let (tmp, src, store) = setup(400);
    let info = snapshot(&src, &store, SnapshotOptions::new("one")).unwrap();
    let s = &info.summary.stats;
    assert_eq!(s.files, 401);
    assert!(s.chunks_uploaded >= 401, "{s:?}");
    let (packs, chunks) = (keys(&store, "packs/"), keys(&store, "chunks/"));
    // 400 small files in ~8 MB: a pack per worker, each holding up to 4 MiB.
    assert!(!packs.is_empty() && packs.len() <= 8, "packs: {packs:?}");
    assert!(chunks.len() <= 4, "only the big file's chunks are objects of their own: {chunks:?}");

    let out = tmp.path().join("out");
    restore(&store, "one", &out, RestoreOptions::default()).unwrap();
    assert_same_tree(&src, &out);
}

#[test]
fn an_unchanged_small_file_is_not_stored_again_and_a_changed_one_goes_to_a_new_pack() {
    let (tmp, src, store) = setup(100);
    snapshot(&src, &store, SnapshotOptions::new("one")).unwrap();
    let packs = keys(&store, "packs/");
    let again = snapshot(&src, &store, SnapshotOptions::new("two")).unwrap().summary.stats;
    assert_eq!((again.chunks_uploaded, again.bytes_uploaded), (0, 0), "{again:?}");
    assert_eq!(keys(&store, "packs/"), packs, "no pack written");

    fs::write(src.join("d3/f3"), b"changed").unwrap();
    let third = snapshot(&src, &store, SnapshotOptions::new("three")).unwrap().summary.stats;
    assert_eq!((third.chunks_uploaded, third.bytes_uploaded), (1, 7), "{third:?}");
    assert_eq!(keys(&store, "packs/").len(), packs.len() + 1);
    let out = tmp.path().join("out");
    restore(&store, "three", &out, RestoreOptions::default()).unwrap();
    assert_same_tree(&src, &out);
}

/// A store that reads only whole objects (as the JetStream object store).
struct WholeReads(LocalStore);

impl ObjectStore for WholeReads {
    fn manifest_key(&self) -> &ember_snapshot::ManifestKey {
        self.0.manifest_key()
    }
    fn put(&self, key: &str, data: &[u8]) -> Result<(), StoreError> {
        self.0.put(key, data)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.0.get(key)
    }
    fn exists(&self, key: &str) -> Result<bool, StoreError> {
        self.0.exists(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        self.0.list(prefix)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.0.delete(key)
    }
}

#[test]
fn a_store_without_ranged_reads_restores_packed_chunks_from_whole_packs() {
    let (tmp, src, store) = setup(300);
    let store = WholeReads(store);
    snapshot(&src, &store, SnapshotOptions::new("one")).unwrap();
    assert!(!keys(&store, "packs/").is_empty());
    let out = tmp.path().join("out");
    restore(&store, "one", &out, RestoreOptions { threads: 3, ..Default::default() }).unwrap();
    assert_same_tree(&src, &out);
}

#[test]
fn gc_keeps_the_packs_a_manifest_references_and_sweeps_the_others() {
    let (tmp, src, store) = setup(50);
    snapshot(&src, &store, SnapshotOptions::new("one")).unwrap();
    fs::write(src.join("d1/f1"), b"new").unwrap();
    snapshot(&src, &store, SnapshotOptions::new("two")).unwrap();
    let packs = keys(&store, "packs/").len();
    assert!(packs >= 2);

    delete(&store, "one").unwrap();
    let report = gc(&store, now()).unwrap();
    assert_eq!(report.chunks_deleted, 0, "two references every pack: {report:?}");
    assert!(report.missing_chunks.is_empty(), "{report:?}");
    delete(&store, "two").unwrap();
    let report = gc(&store, now()).unwrap();
    assert!(keys(&store, "packs/").is_empty() && keys(&store, "chunks/").is_empty(), "{report:?}");

    // The places this process learned now name collected packs: stored again.
    let info = snapshot(&src, &store, SnapshotOptions::new("three")).unwrap().summary.stats;
    assert_eq!(info.chunks_reused, 0, "{info:?}");
    let out = tmp.path().join("out");
    restore(&store, "three", &out, RestoreOptions::default()).unwrap();
    assert_same_tree(&src, &out);
}

/// A pack holds the other small files of the snapshot that wrote it: one
/// workspace's snapshot reusing a chunk of another's pack would keep that
/// workspace's files in the store after its snapshots are deleted.
#[test]
fn a_workspace_reuses_its_own_packs_never_another_workspaces() {
    let (tmp, src, store) = setup(60);
    let of = |w: &str, id: &str| snapshot(&src, &store, SnapshotOptions::new(id).label("workspace", w)).unwrap();
    let a1 = of("a", "a1").summary.stats;
    let a2 = of("a", "a2").summary.stats;
    assert_eq!(a2.chunks_uploaded, 0, "{a2:?}");
    // (b's tree has one file more, so its packs are not byte for byte a's,
    // which would give them a's names: the same bytes, b's own.)
    fs::write(src.join("only-b"), b"b's").unwrap();
    let b1 = of("b", "b1").summary.stats;
    // b's 61 small files in packs of its own; the big file's two chunks, objects of their own, reused.
    assert_eq!((b1.chunks_uploaded, b1.chunks_reused), (61, 2), "{b1:?}");
    assert!(b1.chunks_uploaded < a1.chunks_uploaded, "{a1:?}");

    let before = keys(&store, "packs/").len();
    for id in ["a1", "a2"] {
        delete(&store, id).unwrap();
    }
    let report = gc(&store, now()).unwrap();
    assert!(report.chunks_deleted >= 1, "{report:?}");
    let after = keys(&store, "packs/").len();
    assert!(after < before, "a's packs swept: {before} -> {after}");
    let out = tmp.path().join("out");
    restore(&store, "b1", &out, RestoreOptions::default()).unwrap();
    assert_same_tree(&src, &out);
}

#[test]
fn a_missing_or_damaged_pack_fails_the_restore_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), b"only file").unwrap();
    let store = common::local_store(&tmp.path().join("store"));
    snapshot(&src, &store, SnapshotOptions::new("one")).unwrap();
    let pack = keys(&store, "packs/").pop().expect("a pack");
    let bytes = store.get(&pack).unwrap();

    let mut damaged = bytes.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 0xff;
    store.put(&pack, &damaged).unwrap();
    let err = restore(&store, "one", &tmp.path().join("out1"), RestoreOptions::default()).unwrap_err();
    assert!(matches!(err, SnapshotError::CorruptChunk { .. }), "{err:?}");

    store.put(&pack, &bytes[..bytes.len() - 2]).unwrap();
    let err = restore(&store, "one", &tmp.path().join("out2"), RestoreOptions::default()).unwrap_err();
    assert!(matches!(&err, SnapshotError::CorruptChunk { reason, .. } if reason.contains(&pack)), "{err:?}");

    store.delete(&pack).unwrap();
    let err = restore(&store, "one", &tmp.path().join("out3"), RestoreOptions::default()).unwrap_err();
    assert!(matches!(&err, SnapshotError::MissingChunk { chunk } if *chunk == pack), "{err:?}");
    assert!(!tmp.path().join("out3").exists());
}
