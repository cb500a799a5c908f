//! The behaviour every [`ObjectStore`] backend shares, as functions each
//! backend's tests call on a fresh, empty store of its own (feature
//! `testing`): [`LocalStore`](crate::LocalStore) in this crate's
//! `tests/conformance.rs`, [`S3Store`](crate::S3Store) against moto in
//! `tests/s3.rs`, the cluster's JetStream object store on a real 3-server
//! NATS cluster in ember-cluster's `tests/snapshot_store.rs`. They panic on
//! the first difference, naming the call.
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{ObjectStore, MAX_OBJECT_BYTES};
use crate::manifest::{EntryKind, Manifest};
use crate::{SnapshotError, StoreError};

/// Every case below, in order, on one empty store; `scratch` is an empty
/// directory for trees.
pub fn run_all(store: &dyn ObjectStore, scratch: &Path) {
    objects(store);
    put_new_is_a_put(store);
    snapshots(store, scratch);
    forged_manifest_is_refused(store, scratch);
}

/// put, get, exists, list, list_keys and delete on plain objects.
pub fn objects(store: &dyn ObjectStore) {
    assert!(!store.exists("t/none").expect("exists of an absent key"));
    assert!(store.get("t/none").expect_err("get of an absent key").is_not_found());
    store.delete("t/none").expect("deleting an absent key is not an error");

    // Empty, small, and larger than one NATS message / one S3 part buffer.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let objects: [(&str, &[u8]); 4] = [("t/a", b""), ("t/b/c", b"hello"), ("t/big", &big), ("tx/other", b"x")];
    for (key, data) in objects {
        store.put(key, data).unwrap_or_else(|e| panic!("put {key}: {e}"));
    }
    for (key, data) in objects {
        assert!(store.exists(key).expect("exists"), "{key} exists");
        assert!(store.get(key).expect("get") == data, "{key}: the bytes put come back");
    }
    store.put("t/b/c", b"replaced").expect("put over an object");
    assert_eq!(store.get("t/b/c").expect("get"), b"replaced");

    // A prefix is a string prefix: `t/` is not `tx/`; in key order, with sizes.
    let listed = store.list("t/").expect("list");
    let keys: Vec<&str> = listed.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(keys, ["t/a", "t/b/c", "t/big"], "list t/");
    let sizes: Vec<u64> = listed.iter().map(|m| m.size).collect();
    assert_eq!(sizes, [0, 8, big.len() as u64], "sizes");
    assert!(listed.iter().all(|m| m.modified > std::time::UNIX_EPOCH), "every object has a write time");
    assert_eq!(store.list("t/b").expect("list").len(), 2, "a prefix inside a name: t/b/c and t/big");
    let mut keys = store.list_keys("t/").expect("list_keys");
    keys.sort();
    assert_eq!(keys, ["t/a", "t/b/c", "t/big"], "list_keys t/");
    assert!(store.list("nothing/").expect("list of an empty folder").is_empty());
    // One object's metadata by one lookup (a prefix is not an object).
    let m = store.meta("t/big").expect("meta").expect("t/big is there");
    assert_eq!((m.key.as_str(), m.size), ("t/big", big.len() as u64), "meta of t/big");
    assert!(m.modified > std::time::UNIX_EPOCH, "meta has the write time");
    assert!(store.meta("t/b").expect("meta of a prefix").is_none(), "a prefix is not an object");
    assert!(store.meta("t/none").expect("meta of an absent key").is_none());
    // A ranged read, where the store has one, is exactly those bytes (a
    // restore reads packed chunks so); of an absent key, not found.
    let (at, len) = (1_500_000u64, 70_000u64);
    if let Some(part) = store.get_range("t/big", at, len).expect("get_range") {
        assert!(part == big[at as usize..(at + len) as usize], "get_range of t/big: {} bytes", part.len());
        let err = store.get_range("t/none", 0, 1).expect_err("get_range of an absent key");
        assert!(err.is_not_found(), "get_range of an absent key: {err:?}");
    }

    for (key, _) in objects {
        store.delete(key).unwrap_or_else(|e| panic!("delete {key}: {e}"));
        assert!(!store.exists(key).expect("exists"), "{key} deleted");
        assert!(store.get(key).expect_err("get of a deleted key").is_not_found());
    }
    assert!(store.list("t").expect("list").is_empty(), "nothing left");

    for bad in ["", "/abs", "a/../b", ".tmp/x"] {
        let err = store.put(bad, b"x").expect_err("a bad key");
        assert!(matches!(err, StoreError::InvalidKey { .. }), "put {bad:?}: {err:?}");
        let err = store.get(bad).expect_err("a bad key");
        assert!(matches!(err, StoreError::InvalidKey { .. }), "get {bad:?}: {err:?}");
    }
    // Zeroed pages, never touched: refused on its size alone.
    let over = vec![0u8; MAX_OBJECT_BYTES as usize + 1];
    let err = store.put("t/over", &over).expect_err("an object over the cap");
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err:?}");
    assert!(!store.exists("t/over").expect("exists"), "nothing written");
}

/// `put_new` has `put`'s effect whether or not its guess that the key is
/// absent holds: on an absent key, over an object, over a deleted one, and
/// mixed with `put` and `delete`.
pub fn put_new_is_a_put(store: &dyn ObjectStore) {
    let big: Vec<u8> = (0..1_500_000u32).map(|i| (i.wrapping_mul(40_503) >> 7) as u8).collect();
    store.put_new("n/a", b"first").expect("put_new of an absent key");
    assert_eq!(store.get("n/a").expect("get"), b"first");
    store.put_new("n/a", b"second").expect("put_new over an object");
    assert_eq!(store.get("n/a").expect("get"), b"second", "the guess was wrong: replaced all the same");
    store.put("n/a", &big).expect("put over it");
    store.put_new("n/a", b"").expect("put_new of an empty object over a big one");
    assert_eq!(store.get("n/a").expect("get"), b"");
    store.delete("n/a").expect("delete");
    store.delete("n/a").expect("delete again");
    assert!(!store.exists("n/a").expect("exists"));
    store.put_new("n/a", &big).expect("put_new over a deleted key");
    assert!(store.get("n/a").expect("get") == big);
    store.put_new("n/b", b"").expect("an empty marker");
    let keys: Vec<String> = store.list("n/").expect("list").into_iter().map(|m| m.key).collect();
    assert_eq!(keys, ["n/a", "n/b"]);
    for key in ["n/a", "n/b"] {
        store.delete(key).expect("delete");
        assert!(store.get(key).expect_err("deleted").is_not_found(), "{key}");
    }
    let err = store.put_new("../x", b"x").expect_err("a bad key");
    assert!(matches!(err, StoreError::InvalidKey { .. }), "{err:?}");
}

/// A snapshot and an unchanged second one (every chunk reused), list,
/// inspect, restore, delete and gc.
pub fn snapshots(store: &dyn ObjectStore, scratch: &Path) {
    use crate::{delete, gc, inspect, list, restore, snapshot, GcOptions, RestoreOptions, SnapshotOptions};
    let src = scratch.join("conf-src");
    small_tree(&src);
    let first = snapshot(&src, store, SnapshotOptions::new("conf-one").label("workspace", "w")).expect("snapshot");
    assert!(first.summary.stats.chunks_uploaded > 1, "several chunks: {:?}", first.summary.stats);
    // The same workspace's next snapshot: its small files' packs are reused too.
    let again = snapshot(&src, store, SnapshotOptions::new("conf-two").label("workspace", "w")).expect("second");
    assert_eq!(again.summary.stats.chunks_uploaded, 0, "unchanged tree: every chunk reused");
    let ids: Vec<String> = list(store).expect("list").into_iter().map(|s| s.id).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_eq!(inspect(store, "conf-one").expect("inspect").stats, first.summary.stats);

    let out = scratch.join("conf-out");
    restore(store, "conf-two", &out, RestoreOptions::default()).expect("restore");
    assert_same_tree(&src, &out);

    delete(store, "conf-one").expect("delete");
    let now = GcOptions { min_age: Duration::ZERO, ..GcOptions::default() };
    let report = gc(store, now).expect("gc");
    assert_eq!((report.manifests, report.chunks_deleted), (1, 0), "conf-two references every chunk");
    store.put("chunks/orphan", b"x").expect("put");
    let young = gc(store, GcOptions::default()).expect("gc");
    assert_eq!((young.chunks_deleted, young.chunks_spared_young), (0, 1), "a young orphan is spared");
    let report = gc(store, now).expect("gc");
    assert_eq!(report.chunks_deleted, 1, "the orphan is swept");
    assert!(!store.exists("chunks/orphan").expect("exists"));
    assert!(store.list("locks/").expect("list").is_empty() && store.list("pending/").expect("list").is_empty());
    let out2 = scratch.join("conf-out2");
    restore(store, "conf-two", &out2, RestoreOptions::default()).expect("restore after gc");
    assert_same_tree(&src, &out2);
}

/// A manifest rewritten by someone who can write the store but has not the
/// key (its checksum recomputed, its MAC not) is refused: nothing restored.
pub fn forged_manifest_is_refused(store: &dyn ObjectStore, scratch: &Path) {
    use crate::{restore, snapshot, RestoreOptions, SnapshotOptions};
    let src = scratch.join("forge-src");
    fs::create_dir_all(src.join("tmp")).expect("mkdir");
    fs::write(src.join("a"), b"mine").expect("write");
    snapshot(&src, store, SnapshotOptions::new("forged")).expect("snapshot");
    // `tmp -> /`: a sandbox's rootfs link to the host's root.
    forge(store, "forged", |m| {
        let e = m.entries.iter_mut().find(|e| e.path == "tmp").expect("tmp entry");
        e.kind = EntryKind::Symlink { target: "/".into() };
    });
    let out = scratch.join("forge-out");
    let err = restore(store, "forged", &out, RestoreOptions::default()).expect_err("a forged manifest");
    assert!(matches!(&err, SnapshotError::Tampered { id, .. } if id == "forged"), "{err:?}");
    assert!(!out.exists(), "nothing restored");
    crate::delete(store, "forged").expect("delete");
}

/// Rewrites snapshot `id`'s manifest as a writer of the store without the
/// key would: `edit` it, recompute the envelope's sha256, keep the old MAC.
pub fn forge(store: &dyn ObjectStore, id: &str, edit: impl FnOnce(&mut Manifest)) {
    let key = format!("manifests/{id}.json");
    let mut env: serde_json::Value = serde_json::from_slice(&store.get(&key).expect("manifest")).expect("json");
    let mut m: Manifest = serde_json::from_value(env["manifest"].take()).expect("a manifest");
    edit(&mut m);
    env["sha256"] = hex::encode(Sha256::digest(serde_json::to_vec(&m).expect("json"))).into();
    env["manifest"] = serde_json::to_value(&m).expect("json");
    store.put(&key, &serde_json::to_vec_pretty(&env).expect("json")).expect("put the forged manifest");
}

/// Nested dirs, an empty file, a 3 MB file of distinct bytes (several
/// chunks), a symlink, odd modes.
pub fn small_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b")).expect("mkdir");
    fs::write(root.join("empty"), b"").expect("write");
    fs::write(root.join("a/hello.txt"), b"hello\n").expect("write");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..3_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    fs::write(root.join("a/b/data.bin"), data).expect("write");
    symlink("hello.txt", root.join("a/link")).expect("symlink");
    fs::set_permissions(root.join("a/hello.txt"), fs::Permissions::from_mode(0o600)).expect("chmod");
}

/// Asserts two trees are equal: kinds, contents, link targets, modes, owners, mtimes.
pub fn assert_same_tree(a: &Path, b: &Path) {
    let (ma, mb) = (fs::symlink_metadata(a).expect("stat"), fs::symlink_metadata(b).expect("stat"));
    let what = a.display();
    assert_eq!(ma.file_type(), mb.file_type(), "{what}: kind");
    assert_eq!((ma.uid(), ma.gid()), (mb.uid(), mb.gid()), "{what}: owner");
    assert_eq!((ma.mtime(), ma.mtime_nsec()), (mb.mtime(), mb.mtime_nsec()), "{what}: mtime");
    if ma.is_symlink() {
        assert_eq!(fs::read_link(a).expect("readlink"), fs::read_link(b).expect("readlink"), "{what}: target");
        return;
    }
    assert_eq!(ma.mode() & 0o7777, mb.mode() & 0o7777, "{what}: mode");
    if ma.is_file() {
        assert!(fs::read(a).expect("read") == fs::read(b).expect("read"), "{what}: content differs");
    } else if ma.is_dir() {
        let names = |p: &Path| {
            let mut v: Vec<_> = fs::read_dir(p)
                .expect("read_dir")
                .map(|e| e.expect("entry"))
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_dir() || t.is_symlink()))
                .map(|e| e.file_name())
                .collect();
            v.sort();
            v
        };
        let (na, nb) = (names(a), names(b));
        assert_eq!(na, nb, "{what}: entries");
        for n in na {
            assert_same_tree(&a.join(&n), &b.join(&n));
        }
    }
}
