//! Applies an overlay upper dir to its lower dir, on one filesystem: what
//! committing an attempt layer does. Whiteouts (character devices 0:0) remove
//! the lower entry; an opaque dir (`trusted.overlay.opaque=y`, set by an
//! overlay mounted by root) replaces the lower one whole; a dir present in
//! both is merged entry by entry and takes the upper's mode and owner; every
//! other entry is renamed over the lower one. Each step is idempotent, so a
//! merge cut short by a crash is finished by running it again.
//!
//! Both trees were written by a sandbox: every name is resolved from a
//! pinned dir fd with `O_NOFOLLOW` / `AT_SYMLINK_NOFOLLOW`, and renames move
//! symlinks without following them.
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

const OPAQUE: &CStr = c"trusted.overlay.opaque";

/// Dirs nested deeper than this are refused (the merge recurses).
const MAX_DEPTH: usize = 512;

pub(crate) fn open_dir(at: impl AsFd, name: &CStr) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::openat(at, name, flags, Mode::empty())?)
}

/// Merges the tree under `upper` into `lower`.
pub(crate) fn merge(upper: &OwnedFd, lower: &OwnedFd) -> io::Result<()> {
    merge_at(upper, lower, 0)
}

fn merge_at(upper: &OwnedFd, lower: &OwnedFd, depth: usize) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other(format!("dirs nested deeper than {MAX_DEPTH}")));
    }
    for name in names(upper)? {
        let st = rustix::fs::statat(upper, &name, AtFlags::SYMLINK_NOFOLLOW)?;
        let kind = FileType::from_raw_mode(st.st_mode);
        if kind == FileType::CharacterDevice && st.st_rdev == 0 {
            remove_any(lower, &name)?;
            rustix::fs::unlinkat(upper, &name, AtFlags::empty())?;
            continue;
        }
        if kind == FileType::Directory {
            let up = open_dir(upper, &name)?;
            let mut buf = [0u8; 8];
            let opaque = rustix::fs::fgetxattr(&up, OPAQUE, &mut buf).is_ok_and(|n| buf[..n] == *b"y");
            if !opaque {
                if let Ok(low) = open_dir(lower, &name) {
                    merge_at(&up, &low, depth + 1)?;
                    copy_owner_and_mode(&up, &low)?;
                    rustix::fs::unlinkat(upper, &name, AtFlags::REMOVEDIR)?;
                    continue;
                }
            }
            match rustix::fs::fremovexattr(&up, OPAQUE) {
                Ok(()) | Err(rustix::io::Errno::NODATA) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if kind == FileType::Directory || is_dir(lower, &name) {
            // rename(2) replaces a non-dir, or only an empty dir.
            remove_any(lower, &name)?;
        }
        rustix::fs::renameat(upper, &name, lower, &name)?;
    }
    Ok(())
}

/// The root of `upper` may carry a chmod or chown of the workspace's root.
pub(crate) fn copy_owner_and_mode(from: &OwnedFd, to: &OwnedFd) -> io::Result<()> {
    let st = rustix::fs::fstat(from)?;
    rustix::fs::fchown(to, Some(rustix::fs::Uid::from_raw(st.st_uid)), Some(rustix::fs::Gid::from_raw(st.st_gid)))?;
    rustix::fs::fchmod(to, Mode::from_raw_mode(st.st_mode & 0o7777))?;
    Ok(())
}

fn names(dir: &OwnedFd) -> io::Result<Vec<CString>> {
    let mut out = Vec::new();
    for e in rustix::fs::Dir::read_from(dir)? {
        let n = e?.file_name().to_owned();
        if n.as_bytes() != b"." && n.as_bytes() != b".." {
            out.push(n);
        }
    }
    Ok(out)
}

fn is_dir(at: &OwnedFd, name: &CStr) -> bool {
    rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
}

/// Removes `name` under `at`, whatever it is; absent is fine. A dir goes with
/// its tree: std's `remove_dir_all` opens each level with `O_NOFOLLOW`, and
/// the path starts at the pinned fd (`/proc/self/fd/N`), not at a path the
/// sandbox could redirect.
fn remove_any(at: &OwnedFd, name: &CStr) -> io::Result<()> {
    match rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(rustix::io::Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            use std::os::unix::ffi::OsStrExt;
            let path = std::path::Path::new(&format!("/proc/self/fd/{}", at.as_raw_fd()))
                .join(std::ffi::OsStr::from_bytes(name.to_bytes()));
            std::fs::remove_dir_all(path)
        }
        Ok(_) => Ok(rustix::fs::unlinkat(at, name, AtFlags::empty())?),
    }
}
