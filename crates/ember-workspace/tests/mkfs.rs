//! `mkfs.ext4` runs in the store's own small mount namespace, not the
//! host's: it reads the whole mount table of the namespace it runs in (to
//! refuse a mounted target), and a busy node's holds one mount per sandbox
//! layer and two per workspace. And a new image's journal is not zeroed:
//! the file is sparse and new. Real images and mounts (the tests run as
//! root). The test runs itself again with a `mkfs.ext4` of its own first on
//! PATH (the environment is the process's).
mod common;

use common::Scratch;
use ember_workspace::WorkspaceStore;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

/// The real `mkfs.ext4`, found on PATH before the test puts its own first.
fn real_mkfs() -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join("mkfs.ext4")).find(|p| p.exists()).expect("mkfs.ext4 on PATH")
}

const INNER: &str = "EMBER_TEST_MKFS_INNER";

#[test]
fn mkfs_reads_a_short_mount_table_and_writes_no_journal_of_zeros() {
    let Some(base) = std::env::var_os(INNER) else {
        let base = Scratch(std::env::temp_dir().join(format!("ember-ws-mkfs-{}", std::process::id())));
        let bin = base.0.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        // Records the mount table it was started with, then is the real one.
        let seen = base.0.join("seen");
        let wrapper = format!(
            "#!/bin/sh\nwc -l < /proc/self/mountinfo >> {}\nexec {} \"$@\"\n",
            seen.display(),
            real_mkfs().display()
        );
        std::fs::write(bin.join("mkfs.ext4"), wrapper).unwrap();
        std::fs::set_permissions(bin.join("mkfs.ext4"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let me = std::env::current_exe().unwrap();
        let status = std::process::Command::new(me)
            .args(["--exact", "mkfs_reads_a_short_mount_table_and_writes_no_journal_of_zeros", "--nocapture"])
            .env("PATH", path)
            .env(INNER, &base.0)
            .status()
            .unwrap();
        assert!(status.success(), "the test's run with its own mkfs.ext4 failed: {status}");
        return;
    };
    let base = PathBuf::from(base);
    let (root, seen) = (base.join("store"), base.join("seen"));
    let store = WorkspaceStore::open(root.clone(), (1000, 1000)).unwrap();
    // A busy host's table: 300 more mounts, as many sandboxes' layers.
    let busy = base.join("busy");
    for i in 0..300 {
        let d = busy.join(i.to_string());
        std::fs::create_dir_all(&d).unwrap();
        let ok = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=64k", "busy"]).arg(&d).status();
        assert!(ok.unwrap().success(), "mount {}", d.display());
    }
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().count();

    store.create("a", 1 << 30).unwrap();
    let counts: Vec<usize> =
        std::fs::read_to_string(&seen).unwrap().lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(counts.len(), 1, "one mkfs.ext4: {counts:?}");
    assert!(counts[0] + 300 <= host, "mkfs.ext4 read {} mounts, the host has {host}", counts[0]);
    // The new filesystem works: mounted, writable, the sandbox user's.
    let mnt = store.mount_path("a");
    std::fs::write(mnt.join("f"), b"kept").unwrap();
    assert_eq!(std::fs::metadata(&mnt).unwrap().uid(), 1000);
    // 1 GiB image, metadata only: a zeroed journal alone is 32 MiB.
    let img = root.join("a/disk.img");
    let allocated = std::fs::metadata(&img).unwrap().blocks() * 512;
    assert!(allocated < 8 << 20, "{} allocates {allocated} bytes", img.display());
    store.remove("a", |_| false).unwrap();
}
