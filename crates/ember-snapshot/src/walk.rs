//! Walks a directory tree into manifest entries (without chunks yet), by fd.
//!
//! The tree may be one a sandbox, or a fenced former holder of a workspace,
//! can still change: a directory swapped for `-> /etc` must never be read
//! through. So the walk starts from a pinned root fd and never resolves a
//! path: each name is `statat`ed with `AT_SYMLINK_NOFOLLOW` in its parent's
//! fd, each directory opened beneath it without following symlinks (its
//! metadata then read from that fd), and each file later opened for reading
//! from the root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//! ([`PinnedDir::open_file`]): a swap between the listing and the read makes
//! the snapshot fail, naming the path, instead of storing the link's target.
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use ember_sys::beneath::{FileType, PinnedDir};
use rustix::fs::{AtFlags, Stat};
use rustix::io::Errno;

use crate::manifest::{Entry, EntryKind};
use crate::{LayerMarks, SnapshotError};

/// A walked path: its entry (the path, relative to the root, is also how the
/// upload reopens a file beneath the root).
pub(crate) struct Walked {
    pub entry: Entry,
}

pub(crate) struct Walk {
    pub root: PinnedDir,
    pub items: Vec<Walked>,
    pub warnings: Vec<String>,
    /// Bytes the regular files occupy at walk time, holes not counted (for progress).
    pub file_bytes: u64,
    /// An overlay upper dir's whiteouts and opaque dirs (when walked with an xattr).
    pub marks: LayerMarks,
}

fn sys(e: ember_sys::SysError) -> SnapshotError {
    SnapshotError::Io { op: e.op, path: e.target.into(), source: e.source }
}

fn at<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(rustix::io::Errno) -> SnapshotError + 'a {
    move |e| SnapshotError::Io { op, path: path.to_path_buf(), source: e.into() }
}

/// Walks `root` depth-first, names sorted, directories before their contents.
/// Never follows a symlink. Devices, sockets, fifos and non-UTF-8 names are
/// skipped with a warning. With `opaque_xattr` (an overlay upper dir), whiteouts
/// (character devices 0/0) and directories whose `opaque_xattr` is `y` are
/// collected as [`LayerMarks`] instead, the xattr read from the dir's own fd.
pub(crate) fn walk(root: &Path, opaque_xattr: Option<&str>) -> Result<Walk, SnapshotError> {
    let dir = PinnedDir::open(root).map_err(|e| {
        let code = e.source.raw_os_error();
        // O_DIRECTORY | O_NOFOLLOW: a file is ENOTDIR, a symlink ELOOP.
        if code == Some(Errno::NOTDIR.raw_os_error()) || code == Some(Errno::LOOP.raw_os_error()) {
            SnapshotError::NotADirectory { path: root.to_path_buf() }
        } else {
            sys(e)
        }
    })?;
    let st = rustix::fs::fstat(&dir).map_err(at("stat", root))?;
    let mut w = Found { items: Vec::new(), warnings: Vec::new(), file_bytes: 0, marks: None };
    w.marks = opaque_xattr.map(|x| (x.to_string(), LayerMarks::default()));
    w.items.push(Walked { entry: entry(".".into(), EntryKind::Dir, &st) });
    descend(&dir, "", &mut w)?;
    let marks = w.marks.map(|(_, m)| m).unwrap_or_default();
    Ok(Walk { root: dir, items: w.items, warnings: w.warnings, file_bytes: w.file_bytes, marks })
}

/// What the walk collects on its way down.
struct Found {
    items: Vec<Walked>,
    warnings: Vec<String>,
    file_bytes: u64,
    /// The opaque xattr and the marks found, for an overlay upper dir.
    marks: Option<(String, LayerMarks)>,
}

/// Whether the directory `dir` carries the opaque xattr `name` with value `y`.
fn is_opaque(dir: &PinnedDir, name: &str) -> Result<bool, SnapshotError> {
    let mut buf = [0u8; 8];
    match rustix::fs::fgetxattr(dir, name, &mut buf[..]) {
        Ok(n) => Ok(&buf[..n] == b"y"),
        Err(Errno::NODATA | Errno::NOTSUP | Errno::RANGE) => Ok(false),
        Err(e) => Err(at("read xattr", dir.path())(e)),
    }
}

fn descend(dir: &PinnedDir, rel: &str, w: &mut Found) -> Result<(), SnapshotError> {
    let path = dir.path().to_path_buf();
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(dir).map_err(at("read dir", &path))? {
        let name = e.map_err(at("read dir", &path))?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(name);
        }
    }
    names.sort();
    for raw in names {
        let Ok(name) = std::str::from_utf8(&raw) else {
            w.warnings.push(format!("skipped {}: name is not UTF-8", path.join(OsStr::from_bytes(&raw)).display()));
            continue;
        };
        let relp = if rel.is_empty() { name.to_string() } else { format!("{rel}/{name}") };
        let source = path.join(name);
        let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(at("stat", &source))?;
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                // Opened beneath without following: a dir swapped for a link since the stat is an error.
                let sub = dir.open_dir(name).map_err(sys)?;
                let st = rustix::fs::fstat(&sub).map_err(at("stat", &source))?;
                if let Some((xattr, marks)) = &mut w.marks {
                    if is_opaque(&sub, xattr)? {
                        marks.opaque_dirs.push(relp.clone());
                    }
                }
                w.items.push(Walked { entry: entry(relp.clone(), EntryKind::Dir, &st) });
                descend(&sub, &relp, w)?;
                continue;
            }
            FileType::RegularFile => {
                w.file_bytes += (st.st_size as u64).min(st.st_blocks as u64 * 512);
                EntryKind::File { size: st.st_size as u64, chunks: Vec::new(), data: None }
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(dir, name, Vec::new()).map_err(at("read link", &source))?;
                let Ok(target) = target.into_string() else {
                    w.warnings.push(format!("skipped symlink {relp}: target is not UTF-8"));
                    continue;
                };
                EntryKind::Symlink { target }
            }
            FileType::CharacterDevice if st.st_rdev == 0 && w.marks.is_some() => {
                if let Some((_, marks)) = &mut w.marks {
                    marks.whiteouts.push(relp);
                }
                continue;
            }
            FileType::BlockDevice | FileType::CharacterDevice => {
                w.warnings.push(format!("skipped device {relp}"));
                continue;
            }
            FileType::Socket => {
                w.warnings.push(format!("skipped socket {relp}"));
                continue;
            }
            _ => {
                w.warnings.push(format!("skipped fifo {relp}"));
                continue;
            }
        };
        w.items.push(Walked { entry: entry(relp, kind, &st) });
    }
    Ok(())
}

fn entry(path: String, kind: EntryKind, st: &Stat) -> Entry {
    Entry {
        path,
        kind,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime_sec: st.st_mtime,
        mtime_nsec: u32::try_from(st.st_mtime_nsec).unwrap_or(0),
    }
}
