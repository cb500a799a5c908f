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
