//! A store someone else wrote: a forged manifest (its checksum recomputed, its
//! MAC not) is refused before anything is restored from it; one without a MAC
//! only when the key accepts unsigned manifests.
mod common;

use std::fs;

use ember_snapshot::conformance::forge;
use ember_snapshot::manifest::{EntryKind, Manifest};
use ember_snapshot::{copy_restored, gc, inspect, restore, snapshot, GcOptions};
use ember_snapshot::{RestoreOptions, SnapshotOptions};

fn two_files(root: &std::path::Path) {
    fs::create_dir_all(root.join("tmp")).unwrap();
    fs::write(root.join("a"), b"mine").unwrap();
    fs::write(root.join("b"), b"someone else's").unwrap();
}

#[test]
fn forged_manifest_is_refused_not_restored() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    two_files(&src);
    let store = common::local_store(&tmp.path().join("store"));
    for id in ["link", "swap"] {
        snapshot(&src, &store, SnapshotOptions::new(id)).unwrap();
    }
    // `tmp -> /`: an OCI bundle binds <rootfs>/tmp, so the host's / would be mounted.
    forge(&store, "link", |m| {
        let e = m.entries.iter_mut().find(|e| e.path == "tmp").unwrap();
        e.kind = EntryKind::Symlink { target: "/".into() };
    });
    // `a` now names `b`'s chunk.
    forge(&store, "swap", |m| {
        let chunk = |m: &Manifest, p: &str| m.entries.iter().find(|e| e.path == p).unwrap().kind.clone();
        let b = chunk(m, "b");
        m.entries.iter_mut().find(|e| e.path == "a").unwrap().kind = b;
    });
    for id in ["link", "swap"] {
        let out = tmp.path().join(format!("out-{id}"));
        let err = restore(&store, id, &out, RestoreOptions::default()).unwrap_err();
        assert!(common::is_tampered(&err, id), "{id}: {err:?}");
        assert!(err.to_string().contains(id), "the error names the snapshot: {err}");
        assert!(!out.exists(), "{id}: nothing restored");
        let err = copy_restored(&store, id, &src, &out, RestoreOptions::default()).unwrap_err();
        assert!(common::is_tampered(&err, id), "fork: {err:?}");
        assert!(common::is_tampered(&inspect(&store, id).unwrap_err(), id));
    }
    let err = gc(&store, GcOptions::default()).unwrap_err();
    assert!(common::is_tampered(&err, "link") || common::is_tampered(&err, "swap"), "gc: {err:?}");
}

#[test]
fn manifest_without_a_mac_is_refused_unless_the_key_accepts_unsigned() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    two_files(&src);
    let key = ember_snapshot::ManifestKey::ephemeral();
    let store = ember_snapshot::LocalStore::open(tmp.path().join("store"), key.clone()).unwrap();
    snapshot(&src, &store, SnapshotOptions::new("old")).unwrap();
    // As a build before authentication wrote it: no `mac` field.
    let path = store.root().join("manifests/old.json");
    let mut env: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert!(env.as_object_mut().unwrap().remove("mac").is_some());
    fs::write(&path, serde_json::to_vec(&env).unwrap()).unwrap();
    let err = restore(&store, "old", &tmp.path().join("out"), RestoreOptions::default()).unwrap_err();
    assert!(common::is_tampered(&err, "old") && err.to_string().contains("no MAC"), "{err}");
    let migrating = ember_snapshot::LocalStore::open(store.root(), key.accept_unsigned(true)).unwrap();
    restore(&migrating, "old", &tmp.path().join("out"), RestoreOptions::default()).unwrap();
    assert_eq!(fs::read(tmp.path().join("out/a")).unwrap(), b"mine");
}

/// A directory of a local store swapped for a symlink (the store is a
/// directory another party can write) is never followed: not by a get, an
/// exists, a put (its folder, its rename), a list or gc's walk, a delete.
#[test]
fn a_symlinked_directory_in_a_local_store_is_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let store = common::local_store(&tmp.path().join("store"));
    let outside = tmp.path().join("outside");
    fs::create_dir_all(outside.join("ab")).unwrap();
    fs::write(outside.join("ab/cd"), b"host file").unwrap();
    std::os::unix::fs::symlink(&outside, store.root().join("chunks")).unwrap();
    use ember_snapshot::ObjectStore;
    assert!(store.get("chunks/ab/cd").is_err(), "read through the link");
    assert!(!store.exists("chunks/ab/cd").unwrap_or(false), "seen through the link");
    assert!(store.put("chunks/zz/new", b"x").is_err(), "written through the link");
    assert!(!outside.join("zz").exists());
    let listed = |prefix: &str| store.list(prefix).map(|l| l.len()).unwrap_or(0);
    assert_eq!((listed("chunks/"), listed("chunks/ab/")), (0, 0), "listed through the link");
    assert!(store.list_keys("chunks/ab/").unwrap_or_default().is_empty());
    let _ = store.delete("chunks/ab/cd");
    assert_eq!(fs::read(outside.join("ab/cd")).unwrap(), b"host file", "deleted through the link");
    // The store's temp dir swapped for a link: a put writes nothing there.
    fs::remove_dir(store.root().join(".tmp")).unwrap();
    std::os::unix::fs::symlink(&outside, store.root().join(".tmp")).unwrap();
    let _ = store.put("chunks2/x", b"y");
    assert_eq!(fs::read_dir(&outside).unwrap().count(), 1, "only ab/ in {outside:?}");
}
