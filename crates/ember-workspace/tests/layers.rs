//! Attempt layers on a real workspace (ext4 image, loop mount, overlay; the
//! tests run as root): a committed layer's creates, edits, deletes and
//! replaced dirs all reach the workspace; a dropped one leaves nothing; a
//! commit whose intent was written before a crash is finished on the next
//! mount; a workspace from before the layers has its tree moved, not lost.
use ember_workspace::WorkspaceStore;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

struct Fixture {
    root: PathBuf,
    store: WorkspaceStore,
}

impl Fixture {
    fn new(tag: &str) -> Fixture {
        let root = std::env::temp_dir().join(format!("ember-ws-layers-{tag}-{}", std::process::id()));
        let store = WorkspaceStore::open(root.clone(), (0, 0)).expect("open store");
        store.create("w", 32 << 20).expect("create workspace");
        Fixture { root, store }
    }

    fn mnt(&self) -> PathBuf {
        self.store.mount_path("w")
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.store.remove("w", |_| false);
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| format!("<{e}>"))
}

/// A base tree, then a layer that changes every kind of entry.
fn base_and_changes(f: &Fixture) -> PathBuf {
    let m = f.mnt();
    fs::write(m.join("keep"), "keep").unwrap();
    fs::write(m.join("edit"), "old").unwrap();
    fs::write(m.join("gone"), "x").unwrap();
    fs::create_dir_all(m.join("tree/sub")).unwrap();
    fs::write(m.join("tree/sub/a"), "a").unwrap();
    fs::write(m.join("tree/b"), "b").unwrap();
    fs::create_dir_all(m.join("redo")).unwrap();
    fs::write(m.join("redo/old"), "old").unwrap();
    fs::create_dir(m.join("dir2file")).unwrap();
    let l = f.store.open_layer("w", "sb-1").expect("open layer");
    assert_eq!(read(&l.join("keep")), "keep", "the layer shows the workspace");
    fs::write(l.join("edit"), "new").unwrap();
    fs::remove_file(l.join("gone")).unwrap();
    fs::write(l.join("tree/sub/c"), "c").unwrap();
    fs::remove_file(l.join("tree/b")).unwrap();
    fs::remove_dir_all(l.join("redo")).unwrap();
    fs::create_dir(l.join("redo")).unwrap(); // opaque now
    fs::write(l.join("redo/new"), "new").unwrap();
    fs::remove_dir(l.join("dir2file")).unwrap();
    fs::write(l.join("dir2file"), "file").unwrap();
    fs::create_dir_all(l.join("fresh/deep")).unwrap();
    fs::write(l.join("fresh/deep/f"), "f").unwrap();
    symlink("/etc/passwd", l.join("link")).unwrap();
    assert_eq!(read(&f.mnt().join("edit")), "old", "nothing reaches the workspace before the commit");
    l
}

#[test]
fn a_committed_layer_applies_every_change_and_records_the_commit() {
    let f = Fixture::new("commit");
    let layer = base_and_changes(&f);
    assert!(f.store.commit_layer("w", "sb-1", "t-1", || true).expect("commit"));
    let m = f.mnt();
    assert_eq!(read(&m.join("keep")), "keep");
    assert_eq!(read(&m.join("edit")), "new");
    assert!(!m.join("gone").exists());
    assert_eq!(read(&m.join("tree/sub/a")), "a");
    assert_eq!(read(&m.join("tree/sub/c")), "c");
    assert!(!m.join("tree/b").exists());
    assert!(!m.join("redo/old").exists(), "a dir removed and made again replaces the old one");
    assert_eq!(read(&m.join("redo/new")), "new");
    assert_eq!(read(&m.join("dir2file")), "file");
    assert_eq!(read(&m.join("fresh/deep/f")), "f");
    assert_eq!(fs::read_link(m.join("link")).unwrap(), Path::new("/etc/passwd"), "moved, not followed");
    assert!(!layer.exists(), "the layer's mount point is gone");
    assert!(f.store.committed("w", "t-1").unwrap());
    f.store.forget_committed("w", "t-1").unwrap();
    assert!(!f.store.committed("w", "t-1").unwrap());
}

#[test]
fn a_refused_or_discarded_layer_leaves_the_workspace_as_it_was() {
    let f = Fixture::new("discard");
    base_and_changes(&f);
    assert!(!f.store.commit_layer("w", "sb-1", "t-1", || false).expect("refused commit"));
    let l = f.store.open_layer("w", "sb-2").expect("second layer");
    fs::write(l.join("edit"), "newer").unwrap();
    f.store.discard_layer("w", "sb-2").expect("discard");
    let m = f.mnt();
    assert_eq!(read(&m.join("edit")), "old");
    assert!(m.join("gone").exists() && m.join("tree/b").exists() && m.join("redo/old").exists());
    assert!(!m.join("fresh").exists() && !m.join("link").exists());
    assert!(!f.store.committed("w", "t-1").unwrap());
    assert!(!f.store.commit_layer("w", "sb-2", "t-2", || true).unwrap(), "a dropped layer cannot commit");
}

#[test]
fn a_commit_decided_before_a_crash_is_finished_by_the_next_mount() {
    let f = Fixture::new("crash");
    base_and_changes(&f);
    // The state a daemon killed right after step 2 (the intent) leaves.
    let layer_dir = f.root.join("w/fs/.ember-ws/attempts/sb-1");
    fs::write(layer_dir.join("commit"), "t-1").unwrap();
    f.store.unmount("w").expect("unmount");
    f.store.ensure_mounted("w").expect("mount again");
    assert_eq!(read(&f.mnt().join("edit")), "new");
    assert!(!f.mnt().join("gone").exists());
    assert!(f.store.committed("w", "t-1").unwrap());
    assert!(!layer_dir.exists());
    // An undecided layer of a dead holder is dropped by a sweep.
    let l = f.store.open_layer("w", "sb-2").unwrap();
    fs::write(l.join("edit"), "lost").unwrap();
    f.store.sweep_layers("w", |h| h != "sb-2").unwrap();
    assert_eq!(read(&f.mnt().join("edit")), "new");
}

#[test]
fn a_workspace_from_before_the_layers_keeps_its_tree() {
    let f = Fixture::new("migrate");
    fs::write(f.mnt().join("a"), "a").unwrap();
    f.store.unmount("w").unwrap();
    // The old layout: the tree at the filesystem's root.
    let (fsdir, img) = (f.root.join("w/fs"), f.root.join("w/disk.img"));
    let mount = |args: &[&Path]| assert!(std::process::Command::new("mount").args(args).status().unwrap().success());
    mount(&[Path::new("-o"), Path::new("loop"), &img, &fsdir]);
    let host = fsdir.join(".ember-ws");
    fs::rename(host.join("data/a"), fsdir.join("a")).unwrap();
    fs::create_dir(fsdir.join("d")).unwrap();
    fs::remove_dir_all(&host).unwrap();
    assert!(std::process::Command::new("umount").arg(&fsdir).status().unwrap().success());
    f.store.ensure_mounted("w").expect("mount and migrate");
    assert_eq!(read(&f.mnt().join("a")), "a");
    assert!(f.mnt().join("d").is_dir());
    assert!(!f.mnt().join(".ember-ws").exists(), "the host dir is not in the tree");
}
