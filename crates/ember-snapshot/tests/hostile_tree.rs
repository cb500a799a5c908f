//! A tree that changes while it is read and files that are mostly holes: a
//! directory swapped for a symlink is never read through; sparse files are
//! read and written by their data only, their holes recreated as holes.
mod common;

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};

use ember_snapshot::{copy_restored, inspect, restore, snapshot, Phase};
use ember_snapshot::{RestoreOptions, SnapshotOptions};

#[test]
fn dir_swapped_for_a_symlink_mid_snapshot_is_never_read_through() {
    let tmp = tempfile::tempdir().unwrap();
    let (src, host) = (tmp.path().join("src"), tmp.path().join("host"));
    fs::create_dir_all(src.join("d")).unwrap();
    fs::create_dir_all(&host).unwrap();
    fs::write(src.join("d/secret"), b"the sandbox's own").unwrap();
    fs::write(host.join("secret"), b"HOST SECRET").unwrap();
    // Present at walk time: stored as the link it is.
    symlink(&host, src.join("early")).unwrap();
    let store = common::local_store(&tmp.path().join("store"));
    let swapped = std::cell::Cell::new(false);
    // After the walk listed d/secret and before its bytes are read (a
    // fenced former holder still has the workspace mounted).
    let swap = |p: ember_snapshot::Progress| {
        if p.phase == Phase::Transferring && !swapped.replace(true) {
            fs::rename(src.join("d"), src.join("d.old")).unwrap();
            symlink(&host, src.join("d")).unwrap();
        }
    };
    let mut opts = SnapshotOptions::new("s");
    opts.progress = &swap;
    let res = snapshot(&src, &store, opts);
    assert!(swapped.get());
    let err = res.expect_err("d/secret is no longer reachable without following d -> host");
    assert!(err.to_string().contains("d/secret"), "names the path: {err}");
    for c in common::keys(&store, "chunks/") {
        let packed = fs::read(store.root().join(&c)).unwrap();
        assert!(!packed.windows(11).any(|w| w == b"HOST SECRET"), "host bytes reached the store");
    }

    fs::remove_file(src.join("d")).unwrap();
    fs::rename(src.join("d.old"), src.join("d")).unwrap();
    snapshot(&src, &store, SnapshotOptions::new("t")).unwrap();
    let out = tmp.path().join("out");
    restore(&store, "t", &out, RestoreOptions::default()).unwrap();
    assert_eq!(fs::read_link(out.join("early")).unwrap(), host);
}

const GIB: u64 = 1 << 30;

#[test]
fn sparse_files_are_read_and_written_by_their_data_only() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let f = fs::File::create(src.join("big")).unwrap();
    f.set_len(200 * GIB).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"hello", 100 * GIB).unwrap();
    fs::File::create(src.join("holes")).unwrap().set_len(16 * GIB).unwrap();
    fs::write(src.join("dense"), b"dense").unwrap();
    let store = common::local_store(&tmp.path().join("store"));
    // A byte bound, not a clock: the data is 5 bytes in one block.
    let read = |p: ember_snapshot::Progress| assert!(p.bytes_done <= 1 << 20, "read {} bytes", p.bytes_done);
    let mut opts = SnapshotOptions::new("s");
    opts.progress = &read;
    snapshot(&src, &store, opts).unwrap();
    assert_eq!(inspect(&store, "s").unwrap().stats.logical_bytes, 216 * GIB + 5, "apparent sizes");

    let restored = |dir: &std::path::Path| {
        let m = fs::metadata(dir.join("big")).unwrap();
        assert_eq!(m.len(), 200 * GIB);
        assert!(m.blocks() * 512 <= 1 << 20, "{} bytes allocated: holes written as zeros", m.blocks() * 512);
        let mut buf = [0u8; 5];
        std::os::unix::fs::FileExt::read_exact_at(&fs::File::open(dir.join("big")).unwrap(), &mut buf, 100 * GIB)
            .unwrap();
        assert_eq!(&buf, b"hello");
        let h = fs::metadata(dir.join("holes")).unwrap();
        assert_eq!((h.len(), h.blocks()), (16 * GIB, 0));
        assert_eq!(fs::read(dir.join("dense")).unwrap(), b"dense");
    };
    let out = tmp.path().join("out");
    restore(&store, "s", &out, RestoreOptions { progress: &read, ..Default::default() }).unwrap();
    restored(&out);
    for i in 0..5 {
        let fork = tmp.path().join(format!("fork{i}"));
        copy_restored(&store, "s", &out, &fork, RestoreOptions::default()).unwrap();
        restored(&fork);
    }
}

#[test]
fn restore_refuses_more_data_than_the_targets_quota_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("data"), common::Rng(7).bytes(3 << 20)).unwrap();
    // 200 GiB apparent, one block of data: holes do not count against the quota.
    let f = fs::File::create(src.join("sparse")).unwrap();
    f.set_len(200 * GIB).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"x", 1).unwrap();
    let store = common::local_store(&tmp.path().join("store"));
    snapshot(&src, &store, SnapshotOptions::new("s")).unwrap();
    let out = tmp.path().join("out");
    let err =
        restore(&store, "s", &out, RestoreOptions { max_bytes: Some(2 << 20), ..Default::default() }).unwrap_err();
    let ember_snapshot::SnapshotError::TooLarge { id, bytes, limit } = &err else { panic!("{err:?}") };
    assert_eq!((id.as_str(), *bytes, *limit), ("s", (3 << 20) + 4096, 2 << 20), "{err}");
    assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 2, "nothing written beside src and store");
    restore(&store, "s", &out, RestoreOptions { max_bytes: Some(4 << 20), ..Default::default() }).unwrap();
}
