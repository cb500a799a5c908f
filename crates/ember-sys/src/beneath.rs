//! Host-side file work inside directories a sandbox (or a snapshot store) can
//! write: an overlay's upper layer, an OCI sandbox's socket dir, a restored
//! tree. Host root must never follow a path there, so every operation starts
//! from a [`PinnedDir`] (a directory fd) and resolves beneath it with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`:
//! a symlink anywhere in the path, `..` out of the dir or a `/proc` magic link
//! is refused (ELOOP / EXDEV), never followed. Files are created `O_EXCL`
//! (a planted name, even a dangling symlink, is EEXIST), owners set with
//! `AT_SYMLINK_NOFOLLOW` on the node's own `O_PATH` fd, modes through that fd.
//!
//! No `unsafe` here (rustix wraps the calls); it lives in ember-sys so the
//! runtime, the engine and the snapshot code share one implementation.
use crate::SysError;
use rustix::fs::{AtFlags, Gid, Mode, OFlags, ResolveFlags, Uid};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

pub use rustix::fs::FileType;

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS).union(ResolveFlags::NO_MAGICLINKS);

/// A directory held by an fd; paths below it never follow a symlink.
#[derive(Debug)]
pub struct PinnedDir {
    fd: OwnedFd,
    /// For error messages only: never resolved again.
    path: PathBuf,
}

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(rustix::io::Errno) -> SysError + 'a {
    move |e| SysError::new(op, path.display().to_string(), e.into())
}

impl PinnedDir {
    /// Pins a directory whose path the daemon made (its parents are host-only
    /// dirs); only its last component could be a planted symlink, and that is
    /// refused (`O_NOFOLLOW`).
    pub fn open(path: &Path) -> Result<PinnedDir, SysError> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(err("open dir (no symlinks)", path))?;
        Ok(PinnedDir { fd, path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn open_beneath(&self, rel: &str, flags: OFlags, mode: u32) -> Result<OwnedFd, SysError> {
        let path = self.path.join(rel);
        rustix::fs::openat2(&self.fd, rel, flags | OFlags::CLOEXEC, Mode::from_raw_mode(mode), RESOLVE)
            .map_err(err("open beneath (no symlinks)", &path))
    }

    /// The directory `rel` below this one (ELOOP if any part is a symlink).
    pub fn open_dir(&self, rel: &str) -> Result<PinnedDir, SysError> {
        let fd = self.open_beneath(rel, OFlags::RDONLY | OFlags::DIRECTORY, 0)?;
        Ok(PinnedDir { fd, path: self.path.join(rel) })
    }

    /// Opens the regular file `rel` below this one for reading: no symlink on
    /// the way or at the end, and anything but a regular file (a fifo swapped
    /// in would block the reader) is refused.
    pub fn open_file(&self, rel: &str) -> Result<std::fs::File, SysError> {
        let fd = self.open_beneath(rel, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK, 0)?;
        let path = self.path.join(rel);
        let st = rustix::fs::fstat(&fd).map_err(err("stat beneath", &path))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
            return Err(SysError::new("open file beneath", path.display().to_string(), e));
        }
        Ok(fd.into())
    }

    /// Makes the directory `name` here unless it exists, and opens it: an
    /// existing symlink or file there is an error, never followed.
    pub fn ensure_dir(&self, name: &str, mode: u32) -> Result<PinnedDir, SysError> {
        check_name(name, &self.path)?;
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(mode)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => self.open_dir(name),
            Err(e) => Err(err("mkdir beneath", &self.path.join(name))(e)),
        }
    }

    /// Creates the new regular file `rel` (`O_EXCL`: whatever is already there,
    /// a symlink included, is EEXIST).
    pub fn create_file(&self, rel: &str, mode: u32) -> Result<std::fs::File, SysError> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        Ok(self.open_beneath(rel, flags, mode)?.into())
    }

    /// Replaces the file `name` here with one holding `bytes`: the old entry
    /// is unlinked (not followed) and a new file created `O_EXCL`.
    pub fn replace_file(&self, name: &str, bytes: &[u8], mode: u32) -> Result<(), SysError> {
        self.remove_file(name)?;
        let mut f = self.create_file(name, mode)?;
        f.write_all(bytes).map_err(|e| SysError::new("write", self.path.join(name).display().to_string(), e))
    }

    /// Unlinks the non-directory `name` here; absent is fine.
    pub fn remove_file(&self, name: &str) -> Result<(), SysError> {
        check_name(name, &self.path)?;
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(err("unlink beneath", &self.path.join(name))(e)),
        }
    }

    /// The node `rel` itself (`O_PATH`): a symlink there is the link, not its target.
    fn node(&self, rel: &str) -> Result<OwnedFd, SysError> {
        self.open_beneath(rel, OFlags::PATH | OFlags::NOFOLLOW, 0)
    }

    /// What `rel` is, not following it: `None` if absent; an error (ELOOP) if
    /// a symlink is on the way to it.
    pub fn kind(&self, rel: &str) -> Result<Option<FileType>, SysError> {
        let node = match self.node(rel) {
            Ok(n) => n,
            Err(e) if e.source.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        let st = rustix::fs::fstat(&node).map_err(err("stat beneath", &self.path.join(rel)))?;
        Ok(Some(FileType::from_raw_mode(st.st_mode)))
    }

    /// Whether `rel` is a symlink or a symlink is on the way to it (absent: false).
    pub fn has_symlink(&self, rel: &str) -> Result<bool, SysError> {
        match self.kind(rel) {
            Ok(k) => Ok(k == Some(FileType::Symlink)),
            Err(e) if e.source.raw_os_error() == Some(libc::ELOOP) => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Sets the owner of `rel` (`""` for this dir); a symlink's own owner at most.
    pub fn chown(&self, rel: &str, uid: u32, gid: u32) -> Result<(), SysError> {
        let path = self.path.join(rel);
        let node = if rel.is_empty() { None } else { Some(self.node(rel)?) };
        let fd = node.as_ref().map_or(self.fd.as_fd(), |n| n.as_fd());
        // -1 means "leave as is" to the kernel: never pass it on as an id.
        let (u, g) = ((uid != u32::MAX).then(|| Uid::from_raw(uid)), (gid != u32::MAX).then(|| Gid::from_raw(gid)));
        rustix::fs::chownat(fd, "", u, g, AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW)
            .map_err(err("chown beneath", &path))
    }

    /// Sets the mode of `rel` (`""` for this dir); refused on a symlink.
    pub fn chmod(&self, rel: &str, mode: u32) -> Result<(), SysError> {
        let path = self.path.join(rel);
        let node = if rel.is_empty() { None } else { Some(self.node(rel)?) };
        let fd = node.as_ref().map_or(self.fd.as_fd(), |n| n.as_fd());
        let st = rustix::fs::fstat(fd).map_err(err("stat beneath", &path))?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            return Err(err("chmod beneath", &path)(rustix::io::Errno::LOOP));
        }
        // fchmod does not take an O_PATH fd; its /proc magic link names exactly this node.
        let proc = format!("/proc/self/fd/{}", fd.as_raw_fd());
        rustix::fs::chmod(proc.as_str(), Mode::from_raw_mode(mode)).map_err(err("chmod beneath", &path))
    }
}

/// For the `*at` calls done on a plain name directly below (`statat`,
/// `readlinkat` with `AT_SYMLINK_NOFOLLOW`, a directory listing).
impl AsFd for PinnedDir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// One plain name: `unlinkat` and `mkdirat` would follow symlinks in a longer path.
fn check_name(name: &str, dir: &Path) -> Result<(), SysError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a plain name");
        return Err(SysError::new("name beneath", dir.join(name).display().to_string(), e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, MetadataExt};

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ember-beneath-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn symlinks_and_dotdot_are_refused_never_followed() {
        let base = scratch("refuse");
        let (inner, outside) = (base.join("inner"), base.join("outside"));
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::create_dir_all(inner.join("real")).unwrap();
        symlink(&outside, inner.join("etc")).unwrap();
        symlink(outside.join("f"), inner.join("dangling")).unwrap();
        let d = PinnedDir::open(&inner).unwrap();
        let loops = |e: SysError| e.source.raw_os_error() == Some(libc::ELOOP);
        assert!(loops(d.open_dir("etc").unwrap_err()));
        assert!(loops(d.ensure_dir("etc", 0o755).unwrap_err()));
        assert!(loops(d.create_file("etc/hosts", 0o644).unwrap_err()));
        assert_eq!(d.create_file("dangling", 0o644).unwrap_err().source.raw_os_error(), Some(libc::EEXIST));
        assert!(d.open_dir("../outside").is_err(), "`..` out of the dir");
        assert!(loops(d.chmod("etc", 0o777).unwrap_err()));
        d.chown("etc", 4242, 4242).unwrap();
        assert_eq!(std::fs::symlink_metadata(inner.join("etc")).unwrap().uid(), 4242, "the link itself");
        assert_ne!(std::fs::metadata(&outside).unwrap().uid(), 4242, "not its target");
        assert!(!outside.join("f").exists() && std::fs::read_dir(&outside).unwrap().next().is_none());
        assert!(PinnedDir::open(&inner.join("etc")).is_err(), "the pinned dir itself is not a symlink");
        // Replacing a planted symlink unlinks the link and writes a new file.
        d.replace_file("dangling", b"1\n", 0o600).unwrap();
        assert_eq!(std::fs::read(inner.join("dangling")).unwrap(), b"1\n");
        assert!(!outside.join("f").exists());
        let real = d.ensure_dir("real", 0o755).unwrap();
        real.replace_file("x", b"x", 0o640).unwrap();
        real.chmod("x", 0o600).unwrap();
        assert_eq!(std::fs::metadata(inner.join("real/x")).unwrap().mode() & 0o7777, 0o600);
        assert!(d.open_file("real/x").is_ok());
        std::fs::write(outside.join("f"), b"host").unwrap();
        assert!(loops(d.open_file("etc/f").unwrap_err()), "not read through a symlinked dir");
        assert!(d.open_file("real").is_err(), "a directory is not a file");
        let _ = std::fs::remove_dir_all(&base);
    }
}
