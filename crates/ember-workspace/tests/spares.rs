//! Spare volumes on real ext4 images and loop mounts (the tests run as root):
//! a create of a spare's size takes the spare, mounted and writable under the
//! workspace's own path; a create of another size makes its image and has the
//! refill keep that size too; clearing the spares unmounts and removes every
//! one of them and nothing else.
mod common;

use common::{mounts_under, Scratch};
use ember_workspace::WorkspaceStore;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

const SMALL: u64 = 32 << 20;
const OTHER: u64 = 48 << 20;

#[test]
fn a_create_takes_a_spare_of_its_size_and_the_refill_keeps_the_sizes_asked() {
    let root = Scratch(std::env::temp_dir().join(format!("ember-ws-spares-{}", std::process::id())));
    let store = WorkspaceStore::open(root.0.clone(), (1000, 1000)).unwrap();
    assert_eq!(store.refill_spares(2, SMALL).unwrap(), 2);
    assert_eq!(store.spares_ready(), BTreeMap::from([(SMALL, 2)]));
    // Each spare: its filesystem and its bind.
    assert_eq!(mounts_under(&root.0).len(), 4, "{:?}", mounts_under(&root.0));

    let meta = store.create("a", SMALL).unwrap();
    assert_eq!((meta.name.as_str(), meta.size_bytes), ("a", SMALL));
    assert_eq!(store.spares_ready(), BTreeMap::from([(SMALL, 1)]), "the create took one spare");
    let a = root.0.join("a");
    let under_a = mounts_under(&a);
    assert!(under_a.contains(&a.join("fs")) && under_a.contains(&a.join("mnt")), "{under_a:?}");
    assert!(store.is_mounted("a"));
    let mnt = store.mount_path("a");
    let st = std::fs::metadata(&mnt).unwrap();
    assert_eq!((st.uid(), st.gid()), (1000, 1000), "the tree's root is the sandbox user's");
    std::fs::write(mnt.join("f"), b"kept").unwrap();
    assert_eq!(std::fs::read(a.join("fs/.ember-ws/data/f")).unwrap(), b"kept", "mnt is the filesystem's data dir");
    assert_eq!(store.meta("a").unwrap(), meta, "the record is in place");
    assert_eq!(store.list().len(), 1, "spares are not workspaces");

    // No spare of this size: made the slow way; the refill now keeps both sizes.
    store.create("b", OTHER).unwrap();
    assert!(store.is_mounted("b"));
    assert_eq!(store.refill_spares(2, SMALL).unwrap(), 3);
    assert_eq!(store.spares_ready(), BTreeMap::from([(SMALL, 2), (OTHER, 2)]));

    // Removing a workspace that was a spare unmounts it like any other.
    store.remove("a", |_| false).unwrap();
    assert!(mounts_under(&a).is_empty() && !a.exists());

    // Wanting fewer removes the extra ones.
    assert_eq!(store.refill_spares(1, SMALL).unwrap(), 0);
    assert_eq!(store.spares_ready(), BTreeMap::from([(SMALL, 1), (OTHER, 1)]));
    assert_eq!(mounts_under(&root.0).iter().filter(|m| !m.starts_with(root.0.join("b"))).count(), 4);

    assert_eq!(store.clear_spares().unwrap(), 2);
    assert!(store.spares_ready().is_empty());
    let left = mounts_under(&root.0);
    assert!(left.iter().all(|m| m.starts_with(root.0.join("b"))) && left.len() == 2, "{left:?}");
    store.remove("b", |_| false).unwrap();
    assert!(mounts_under(&root.0).is_empty());
}

/// A crash mid-refill leaves a build dir with its mounts: the next start's
/// clear removes it without walking into (and emptying) the mounted filesystem.
#[test]
fn clearing_removes_an_unfinished_build_with_its_mounts() {
    let root = Scratch(std::env::temp_dir().join(format!("ember-ws-spares-crash-{}", std::process::id())));
    let store = WorkspaceStore::open(root.0.clone(), (0, 0)).unwrap();
    store.refill_spares(1, SMALL).unwrap();
    let ready = std::fs::read_dir(&root.0).unwrap().flatten().map(|e| e.path()).next().unwrap();
    let build = root.0.join(".sparebuild-crashed");
    std::fs::rename(&ready, &build).unwrap();
    assert_eq!(mounts_under(&build).len(), 2);
    assert!(store.spares_ready().is_empty(), "a build is not ready");
    assert_eq!(store.clear_spares().unwrap(), 1);
    assert!(!build.exists() && mounts_under(&root.0).is_empty());
}
