//! Walks a directory tree into manifest entries (without chunks yet).
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::manifest::{Entry, EntryKind};
use crate::SnapshotError;

/// A walked path: its entry and where it is on disk.
pub(crate) struct Walked {
    pub entry: Entry,
    pub source: PathBuf,
}

pub(crate) struct Walk {
    pub items: Vec<Walked>,
    pub warnings: Vec<String>,
    /// Sum of the regular files' sizes at walk time (for progress).
    pub file_bytes: u64,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> SnapshotError + 'a {
    move |source| SnapshotError::Io { op, path: path.to_path_buf(), source }
}

/// Walks `root` depth-first, names sorted, directories before their contents.
/// Does not follow symlinks. Devices, sockets, fifos and non-UTF-8 names are
/// skipped with a warning.
pub(crate) fn walk(root: &Path) -> Result<Walk, SnapshotError> {
    let meta = fs::symlink_metadata(root).map_err(io("stat", root))?;
    if !meta.is_dir() {
        return Err(SnapshotError::NotADirectory { path: root.to_path_buf() });
    }
    let mut w = Walk { items: Vec::new(), warnings: Vec::new(), file_bytes: 0 };
    w.items.push(Walked { entry: entry(".".into(), EntryKind::Dir, &meta), source: root.to_path_buf() });
    descend(root, "", &mut w)?;
    Ok(w)
}

fn descend(dir: &Path, rel: &str, w: &mut Walk) -> Result<(), SnapshotError> {
    let mut names = Vec::new();
    for e in fs::read_dir(dir).map_err(io("read dir", dir))? {
        names.push(e.map_err(io("read dir", dir))?.file_name());
    }
    names.sort();
    for name in names {
        let source = dir.join(&name);
        let Some(name) = name.to_str() else {
            w.warnings.push(format!("skipped {}: name is not UTF-8", source.display()));
            continue;
        };
        let path = if rel.is_empty() { name.to_string() } else { format!("{rel}/{name}") };
        let meta = fs::symlink_metadata(&source).map_err(io("stat", &source))?;
        let ft = meta.file_type();
        let kind = if ft.is_dir() {
            EntryKind::Dir
        } else if ft.is_file() {
            w.file_bytes += meta.len();
            EntryKind::File { size: meta.len(), chunks: Vec::new() }
        } else if ft.is_symlink() {
            let target = fs::read_link(&source).map_err(io("read link", &source))?;
            let Some(target) = target.to_str() else {
                w.warnings.push(format!("skipped symlink {path}: target is not UTF-8"));
                continue;
            };
            EntryKind::Symlink { target: target.to_string() }
        } else {
            let what = if ft.is_block_device() || ft.is_char_device() {
                "device"
            } else if ft.is_socket() {
                "socket"
            } else {
                "fifo"
            };
            w.warnings.push(format!("skipped {what} {path}"));
            continue;
        };
        let is_dir = matches!(kind, EntryKind::Dir);
        w.items.push(Walked { entry: entry(path.clone(), kind, &meta), source: source.clone() });
        if is_dir {
            descend(&source, &path, w)?;
        }
    }
    Ok(())
}

fn entry(path: String, kind: EntryKind, meta: &fs::Metadata) -> Entry {
    Entry {
        path,
        kind,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime_sec: meta.mtime(),
        mtime_nsec: u32::try_from(meta.mtime_nsec()).unwrap_or(0),
    }
}
