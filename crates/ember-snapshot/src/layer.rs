//! Snapshots of an overlayfs upper dir: a sandbox's writable layer.
//!
//! An upper dir holds two things a plain tree walk cannot carry: whiteouts
//! (character devices 0/0: "this name is deleted in the layers below") and
//! opaque directories (an xattr, `user.overlay.opaque` or
//! `trusted.overlay.opaque` = `y`: "hide everything below"). The tree itself
//! (files, dirs, symlinks, modes, owners, mtimes) goes through the ordinary
//! [`snapshot`](crate::snapshot) path, whose walk by fd also collects the
//! marks (the opaque xattr read from each dir's own fd); they ride in the
//! manifest's [`LAYER_LABEL`] label, so they are covered by its checksum and
//! MAC and committed with it, last. Other xattrs (file capabilities, ACLs) are
//! not carried.
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::manifest::EntryKind;
use crate::{restore, snapshot, ObjectStore, RestoreInfo, RestoreOptions, SnapshotError, SnapshotInfo};
use crate::{SnapshotOptions, SnapshotSummary};

/// The manifest label that holds a layer snapshot's [`LayerMarks`] (JSON).
pub const LAYER_LABEL: &str = "overlay.layer";

/// The overlay marks of an upper dir, by relative `/`-separated path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerMarks {
    pub whiteouts: Vec<String>,
    pub opaque_dirs: Vec<String>,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io { op, path: path.to_path_buf(), source }
}

/// Finds the whiteouts and opaque directories under `root` (names sorted),
/// walking by fd as a snapshot does.
pub fn scan_marks(root: &Path, opaque_xattr: &str) -> Result<LayerMarks, SnapshotError> {
    Ok(crate::walk::walk(root, Some(opaque_xattr))?.marks)
}

/// Snapshots the upper dir `upper` (frozen by the caller) with its overlay
/// marks, found by the same walk; `opaque_xattr` is the xattr the overlay
/// mount uses.
pub fn snapshot_layer(
    upper: &Path,
    opaque_xattr: &str,
    store: &dyn ObjectStore,
    mut opts: SnapshotOptions<'_>,
) -> Result<SnapshotInfo, SnapshotError> {
    opts.layer_xattr = Some(opaque_xattr.to_string());
    snapshot(upper, store, opts)
}

/// The overlay marks recorded in a layer snapshot's summary (`None`: not a layer snapshot).
pub fn layer_marks(summary: &SnapshotSummary) -> Option<LayerMarks> {
    summary.labels.get(LAYER_LABEL).and_then(|j| serde_json::from_str(j).ok())
}

/// Restores layer snapshot `id` as the new upper dir `into` (every chunk
/// verified, see [`restore`]), then recreates its whiteouts and opaque
/// directories with `opaque_xattr` (the xattr of the overlay it will serve).
/// A mark is applied only where its parent is a directory the manifest
/// restored, so no mark is ever written through a symlink.
pub fn restore_layer(
    store: &dyn ObjectStore,
    id: &str,
    into: &Path,
    opaque_xattr: &str,
    opts: RestoreOptions<'_>,
) -> Result<RestoreInfo, SnapshotError> {
    let manifest = crate::restore::load(store, id)?;
    let marks: LayerMarks = match manifest.labels.get(LAYER_LABEL) {
        Some(j) => serde_json::from_str(j).map_err(|e| SnapshotError::CorruptManifest {
            key: crate::manifest::manifest_key(id),
            reason: format!("label {LAYER_LABEL}: {e}"),
        })?,
        None => LayerMarks::default(),
    };
    let dirs: std::collections::HashSet<&str> =
        manifest.entries.iter().filter(|e| e.kind == EntryKind::Dir).map(|e| e.path.as_str()).collect();
    let unsafe_entry = |path: &str, reason| SnapshotError::UnsafeEntry { id: id.into(), path: path.into(), reason };
    for w in &marks.whiteouts {
        let parent = checked_parent(w).ok_or_else(|| unsafe_entry(w, "not a relative path of plain names"))?;
        if !dirs.contains(parent) || dirs.contains(w.as_str()) {
            return Err(unsafe_entry(w, "whiteout outside a restored directory"));
        }
    }
    for d in &marks.opaque_dirs {
        if checked_parent(d).is_none() || !dirs.contains(d.as_str()) {
            return Err(unsafe_entry(d, "opaque mark on something that is not a restored directory"));
        }
    }
    let info = restore(store, id, into, opts)?;
    for w in &marks.whiteouts {
        let p = into.join(w);
        let dev = rustix::fs::makedev(0, 0);
        rustix::fs::mknodat(rustix::fs::CWD, &p, rustix::fs::FileType::CharacterDevice, rustix::fs::Mode::empty(), dev)
            .map_err(|e| io("mknod whiteout", &p)(e.into()))?;
    }
    for d in &marks.opaque_dirs {
        let p = into.join(d);
        rustix::fs::lsetxattr(&p, opaque_xattr, b"y", rustix::fs::XattrFlags::empty())
            .map_err(|e| io("set opaque xattr", &p)(e.into()))?;
    }
    Ok(info)
}

/// The parent of a relative path of plain names (`.` for a top-level name).
fn checked_parent(path: &str) -> Option<&str> {
    if path.split('/').any(|p| p.is_empty() || p == "." || p == ".." || p.contains('\0')) {
        return None;
    }
    Some(path.rfind('/').map(|i| &path[..i]).unwrap_or("."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalStore;
    use std::fs;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    fn is_opaque(path: &Path, name: &str) -> Result<bool, SnapshotError> {
        let mut buf = [0u8; 8];
        match rustix::fs::lgetxattr(path, name, &mut buf[..]) {
            Ok(n) => Ok(&buf[..n] == b"y"),
            Err(e) if e == rustix::io::Errno::NODATA || e == rustix::io::Errno::NOTSUP => Ok(false),
            Err(e) => Err(io("read xattr", path)(e.into())),
        }
    }

    const XATTR: &str = "user.overlay.opaque";

    #[test]
    fn whiteouts_and_opaque_dirs_survive_a_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let upper = tmp.path().join("upper");
        fs::create_dir_all(upper.join("etc")).unwrap();
        fs::create_dir_all(upper.join("home/gone")).unwrap();
        fs::write(upper.join("etc/new"), b"new").unwrap();
        std::os::unix::fs::symlink("/etc/new", upper.join("link")).unwrap();
        let wh = upper.join("etc/passwd");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &wh,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::empty(),
            rustix::fs::makedev(0, 0),
        )
        .expect("mknod (the tests run as root)");
        // tmpfs and ext4 both take user.* xattrs on directories.
        rustix::fs::lsetxattr(upper.join("home/gone"), XATTR, b"y", rustix::fs::XattrFlags::empty()).unwrap();
        let marks = scan_marks(&upper, XATTR).unwrap();
        assert_eq!(marks.whiteouts, vec!["etc/passwd".to_string()]);
        assert_eq!(marks.opaque_dirs, vec!["home/gone".to_string()]);

        let store = LocalStore::open(tmp.path().join("store"), crate::ManifestKey::ephemeral()).unwrap();
        snapshot_layer(&upper, XATTR, &store, SnapshotOptions::new("l1")).unwrap();
        let into = tmp.path().join("restored");
        restore_layer(&store, "l1", &into, XATTR, RestoreOptions::default()).unwrap();
        let m = fs::symlink_metadata(into.join("etc/passwd")).unwrap();
        assert!(m.file_type().is_char_device() && m.rdev() == 0);
        assert!(is_opaque(&into.join("home/gone"), XATTR).unwrap());
        assert!(!is_opaque(&into.join("etc"), XATTR).unwrap());
        assert_eq!(fs::read(into.join("etc/new")).unwrap(), b"new");
        assert_eq!(fs::read_link(into.join("link")).unwrap(), Path::new("/etc/new"));
    }

    #[test]
    fn marks_outside_restored_dirs_are_refused() {
        assert_eq!(checked_parent("a/b"), Some("a"));
        assert_eq!(checked_parent("a"), Some("."));
        for bad in ["", "/a", "a//b", "../a", "a/.."] {
            assert!(checked_parent(bad).is_none(), "{bad:?}");
        }
    }
}
