//! The root filesystem of an OCI sandbox, assembled by the daemon on the host
//! (an OCI runtime takes a directory, not a mount plan): the same lower layers
//! as the native class, under an overlay whose upper layer lives on a tmpfs
//! sized by `disk_bytes`.
//!
//! - `<dir>/mnt`        tmpfs (`size=disk_bytes`): the writable layer
//! - `<dir>/mnt/upper`, `<dir>/mnt/work`  overlay upper and work dirs
//! - `<dir>/mnt/root`   overlay of the template's lower dirs + upper: `root.path`
//! - `<dir>/mnt/l<i>`   in a sandbox's own id range, lower dir `i` idmapped
//!   from the storage range onto it (overlayfs takes idmapped layers); the
//!   merged root then shows the range's ids
//! - `<dir>/mnt/v<i>`   likewise volume `i`, which the runtime binds from there
//!
//! These mounts are in the host's mount namespace, so [`unmount`] must run on
//! every destroy and leftover reap. They are the daemon's own mount(2) and
//! umount2(2) (`ember_sys::fs`), not mount(8): a process a mount, each a fork
//! of the daemon and a read of the host's mount table, were ~4 ms each on a
//! create's path and a removal's (docs/performance.md, "An OCI sandbox's
//! mounts without mount(8)").
use crate::RuntimeError;
use ember_sys::beneath::PinnedDir;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

fn prep(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let path = path.to_path_buf();
    move |source| RuntimeError::Prepare { what, path, source }
}

/// Mounts the writable tmpfs and the overlay under `dir` and returns the root.
/// `owner` (the host uid of the sandbox's root) owns the upper layer, so the
/// merged root is writable by root inside the user namespace. `lower_trees`,
/// if any, are the lowers as detached idmapped trees, used in their place.
pub fn assemble(
    dir: &Path,
    lowers: &[PathBuf],
    lower_trees: &[OwnedFd],
    disk_bytes: u64,
    owner: u32,
    hostname: &str,
) -> Result<PathBuf, RuntimeError> {
    let mnt = dir.join("mnt");
    let upper = prepare_layer(dir, disk_bytes)?;
    let attached;
    let lowers = match lower_trees.is_empty() {
        true => lowers,
        false => {
            attached = attach_trees(&mnt, "l", lower_trees)?;
            &attached[..]
        }
    };
    let (work, root) = (mnt.join("work"), mnt.join("root"));
    // A restored layer is the sandbox's or a snapshot store's content: never
    // followed (its `tmp` is bound by the runtime: bundle.rs).
    crate::native::rootfs::check_layer_root(&upper, &[])?;
    write_identity(&upper, owner, hostname)?;
    let lower = lowers.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(":");
    // `userxattr`: image layers mark opaque dirs with `user.overlay.opaque`
    // (ember-image unpacks them for the native class, which mounts overlay
    // inside a user namespace where `trusted.*` is out of reach); without it a
    // host mount would ignore the marker and show the hidden lower files.
    let data = format!("lowerdir={lower},upperdir={},workdir={},userxattr", upper.display(), work.display());
    ember_sys::fs::mount_overlay_nosuid(&root, &data)?;
    ensure_tmp(&root, owner)?;
    Ok(root)
}

/// Attaches each detached tree at `<mnt>/<prefix><i>` (made on the layer's
/// tmpfs, which nothing but the daemon has seen yet) and returns those paths.
/// They go with the tmpfs's lazy unmount ([`unmount`]).
pub fn attach_trees(mnt: &Path, prefix: &str, trees: &[OwnedFd]) -> Result<Vec<PathBuf>, RuntimeError> {
    let pinned = PinnedDir::open(mnt)?;
    let mut out = Vec::with_capacity(trees.len());
    for (i, tree) in trees.iter().enumerate() {
        let name = format!("{prefix}{i}");
        let dir = pinned.ensure_dir(&name, 0o755)?;
        ember_sys::idmap::attach_tree(tree.as_fd(), dir.as_fd(), dir.path())?;
        out.push(mnt.join(name));
    }
    Ok(out)
}

/// The sandbox's own `/etc/hostname` and `/etc/hosts`, in the upper layer (a
/// restored layer may hold a whiteout or the source's files there), through
/// the layer's fd: `etc` was checked not to be a symlink and is opened without
/// following one; the files are unlinked and created anew (`O_EXCL`).
fn write_identity(upper: &Path, owner: u32, hostname: &str) -> Result<(), RuntimeError> {
    let upper = PinnedDir::open(upper)?;
    let etc = upper.ensure_dir("etc", 0o755)?;
    etc.replace_file("hostname", format!("{hostname}\n").as_bytes(), 0o644)?;
    let hosts = format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost {hostname}\n");
    etc.replace_file("hosts", hosts.as_bytes(), 0o644)?;
    upper.chown("", owner, owner)?;
    etc.chown("", owner, owner)?;
    for f in ["hostname", "hosts"] {
        etc.chown(f, owner, owner)?;
    }
    Ok(())
}

/// `/tmp` is bound from the rootfs (bundle.rs); an image may not have one.
/// The OCI runtime resolves that bind's source on the host, so it must be a
/// real directory (checked in the layer; the sandbox is not running yet).
fn ensure_tmp(root: &Path, owner: u32) -> Result<(), RuntimeError> {
    let root = PinnedDir::open(root)?;
    if root.kind("tmp")?.is_none() {
        root.ensure_dir("tmp", 0o1777)?;
        root.chmod("tmp", 0o1777)?;
        root.chown("tmp", owner, owner)?;
    }
    root.open_dir("tmp")?;
    Ok(())
}

/// The opaque-directory xattr of this overlay: it is mounted with `userxattr`
/// (like the native class's), so overlayfs uses `user.overlay.*`.
pub const OPAQUE_XATTR: &str = "user.overlay.opaque";

/// Mounts the writable tmpfs under `dir` (unless a restore did already) and
/// makes `upper`, `work` and `root` in it; returns the upper dir.
pub fn prepare_layer(dir: &Path, disk_bytes: u64) -> Result<PathBuf, RuntimeError> {
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).map_err(prep("rootfs dir", &mnt))?;
    if !is_mountpoint(&mnt) {
        ember_sys::fs::mount_tmpfs(&mnt, &format!("size={disk_bytes},mode=0755"))?;
    }
    for d in ["upper", "work", "root"] {
        let p = mnt.join(d);
        std::fs::create_dir_all(&p).map_err(prep("rootfs dir", &p))?;
    }
    Ok(mnt.join("upper"))
}

/// Unmounts the overlay and the tmpfs under `dir` (lazily: the idmapped trees
/// attached in it go with it); what is not mounted is skipped.
pub fn unmount(dir: &Path) -> Result<(), RuntimeError> {
    let mnt = dir.join("mnt");
    for p in [mnt.join("root"), mnt] {
        ember_sys::fs::unmount_detach(&p)?;
    }
    Ok(())
}

pub(super) fn is_mountpoint(p: &Path) -> bool {
    // One statx, not a scan of the host's mount table.
    ember_sys::fs::mounted(p)
}
