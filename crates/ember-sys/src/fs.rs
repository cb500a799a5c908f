//! File-system calls std does not offer: overlay whiteouts and extended
//! attributes, used when OCI layers are unpacked into overlay lower dirs and
//! when a sandbox's writable layer is snapshotted or restored; the host-side
//! mounts of a sandbox's writable layer, an OCI sandbox's root and a gVisor
//! sandbox's workspace slot (tmpfs, overlay, propagation, lazy unmount).
use crate::SysError;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub(crate) fn cpath(op: &'static str, p: &Path) -> Result<CString, SysError> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| SysError::new(op, p.display().to_string(), std::io::ErrorKind::InvalidInput.into()))
}

/// Creates an overlayfs whiteout at `path`: a character device 0/0, which
/// overlayfs reads as "this name is deleted in the layers below". Needs
/// CAP_MKNOD in the initial user namespace (the daemon runs as root).
pub fn mknod_whiteout(path: &Path) -> Result<(), SysError> {
    let c = cpath("mknod whiteout", path)?;
    // A whiteout is a 0/0 character device; its permission bits are 0 too.
    // SAFETY: c is a NUL-terminated path that lives across the call; mknod takes
    // no other pointers.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR, libc::makedev(0, 0)) };
    if r != 0 {
        return Err(SysError::last("mknod whiteout", path.display().to_string()));
    }
    Ok(())
}

/// Sets the extended attribute `name` on `path` itself (never a symlink's target).
pub fn lsetxattr(path: &Path, name: &str, value: &[u8]) -> Result<(), SysError> {
    let c = cpath("lsetxattr", path)?;
    let n =
        CString::new(name).map_err(|_| SysError::new("lsetxattr", name, std::io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: both strings are NUL-terminated and live across the call; value
    // points to value.len() readable bytes.
    let r = unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r != 0 {
        return Err(SysError::last("lsetxattr", format!("{} {name}", path.display())));
    }
    Ok(())
}

/// Reads the extended attribute `name` of `path` itself; `None` if it has none.
pub fn lgetxattr(path: &Path, name: &str) -> Result<Option<Vec<u8>>, SysError> {
    let c = cpath("lgetxattr", path)?;
    let n =
        CString::new(name).map_err(|_| SysError::new("lgetxattr", name, std::io::ErrorKind::InvalidInput.into()))?;
    let mut buf = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated; buf has buf.len() writable bytes.
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENODATA) {
            return Ok(None);
        }
        return Err(SysError::new("lgetxattr", format!("{} {name}", path.display()), e));
    }
    buf.truncate(r as usize);
    Ok(Some(buf))
}

/// Mounts a fresh tmpfs at `target` (nosuid, nodev) with the given options
/// (`size=...,mode=...`). Used for a sandbox's writable layer, which the
/// daemon keeps on the host so it can snapshot it; a syscall rather than
/// mount(8) because it is on every cold create's path.
pub fn mount_tmpfs(target: &Path, options: &str) -> Result<(), SysError> {
    mount_fs(c"tmpfs", "mount tmpfs", target, libc::MS_NOSUID | libc::MS_NODEV, options)
}

/// [`mount_tmpfs`], `noexec` too: a tmpfs that holds only directories and
/// mount points (a gVisor sandbox's workspace slot).
pub fn mount_tmpfs_noexec(target: &Path, options: &str) -> Result<(), SysError> {
    mount_fs(c"tmpfs", "mount tmpfs", target, libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC, options)
}

/// Mounts an overlayfs at `target` with the given options (`lowerdir=...,
/// upperdir=...,workdir=...`): a workspace's attempt layer, on every task's
/// path, where mount(8) was a process that read the host's mount table.
pub fn mount_overlay(target: &Path, options: &str) -> Result<(), SysError> {
    mount_fs(c"overlay", "mount overlay", target, 0, options)
}

/// [`mount_overlay`], `nosuid`: an OCI sandbox's root, whose upper layer the
/// sandbox writes.
pub fn mount_overlay_nosuid(target: &Path, options: &str) -> Result<(), SysError> {
    mount_fs(c"overlay", "mount overlay", target, libc::MS_NOSUID, options)
}

/// mount(2) of a fresh `fstype` at `target`; `options` is the filesystem's
/// own data (mount flags go in `flags`: tmpfs refuses `nosuid` there).
fn mount_fs(
    fstype: &std::ffi::CStr,
    op: &'static str,
    target: &Path,
    flags: libc::c_ulong,
    options: &str,
) -> Result<(), SysError> {
    let t = cpath(op, target)?;
    let data =
        CString::new(options).map_err(|_| SysError::new(op, options, std::io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: every pointer is a NUL-terminated string that lives across the
    // call (`fstype` is borrowed for it).
    let r = unsafe { libc::mount(fstype.as_ptr(), t.as_ptr(), fstype.as_ptr(), flags, data.as_ptr().cast()) };
    if r != 0 {
        return Err(SysError::last(op, target.display().to_string()));
    }
    Ok(())
}

/// Makes the mount at `target` shared (`mount --make-shared`): mounts made
/// under it later propagate to its copies (a gVisor gofer's bind of it).
pub fn make_shared(target: &Path) -> Result<(), SysError> {
    let t = cpath("make shared", target)?;
    // SAFETY: t is a NUL-terminated path alive across the call; a propagation
    // change reads no source, type or data (null).
    let r = unsafe { libc::mount(std::ptr::null(), t.as_ptr(), std::ptr::null(), libc::MS_SHARED, std::ptr::null()) };
    if r != 0 {
        return Err(SysError::last("make shared", target.display().to_string()));
    }
    Ok(())
}

/// Lazily unmounts `target` (`MNT_DETACH`; a symlink there is not followed).
/// Returns `false` when nothing was mounted there (or the path does not
/// exist), so callers can run it on every removal without checking first.
pub fn unmount_detach(target: &Path) -> Result<bool, SysError> {
    let t = cpath("umount", target)?;
    // SAFETY: t is a NUL-terminated path that lives across the call.
    let r = unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::ENOENT) => Ok(false),
            _ => Err(SysError::new("umount", target.display().to_string(), e)),
        };
    }
    Ok(true)
}

/// Whether `path` is the root of, or lies on, a tmpfs (memory only: what
/// is written there never reaches a disk, a layer or a snapshot).
pub fn is_tmpfs(path: &Path) -> Result<bool, SysError> {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let st = rustix::fs::statfs(path).map_err(|e| SysError::new("statfs", path.display().to_string(), e.into()))?;
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    Ok(st.f_type as i64 == TMPFS_MAGIC)
}

/// Whether something is mounted on `path` (it is the root of a mount), from
/// `statx`'s `STATX_ATTR_MOUNT_ROOT`: one syscall, where a scan of
/// `/proc/self/mountinfo` costs time in the host's mounts (1,000+ on the
/// 10-node drill, where those scans took 17 % of the machine's CPU;
/// docs/performance.md). A symlink at `path` is not followed (it is no mount
/// point). `None` when the kernel does not report the attribute (before
/// Linux 5.8); a missing path is not mounted.
pub fn is_mount_root(path: &Path) -> Result<Option<bool>, SysError> {
    use rustix::fs::{AtFlags, StatxAttributes, StatxFlags, CWD};
    match rustix::fs::statx(CWD, path, AtFlags::SYMLINK_NOFOLLOW, StatxFlags::BASIC_STATS) {
        Ok(st) => Ok(st
            .stx_attributes_mask
            .contains(StatxAttributes::MOUNT_ROOT)
            .then(|| st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT))),
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR) => Ok(Some(false)),
        Err(e) => Err(SysError::new("statx", path.display().to_string(), e.into())),
    }
}

/// Whether something is mounted on `path`: [`is_mount_root`], or on a
/// kernel without that attribute a scan of `/proc/self/mountinfo` for the
/// path as a mount point. An error reads as not mounted.
pub fn mounted(path: &Path) -> bool {
    if let Ok(Some(root)) = is_mount_root(path) {
        return root;
    }
    let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mi.lines().any(|l| l.split_whitespace().nth(4).is_some_and(|m| Path::new(m) == path))
}

/// Swaps the names `a` and `b` in one atomic step (`renameat2` with
/// `RENAME_EXCHANGE`): each keeps its inode, neither is freed. `Ok(false)`,
/// nothing done, when `b` does not exist yet or the filesystem cannot
/// exchange (`EINVAL`): the caller renames instead.
pub fn exchange(a: &Path, b: &Path) -> std::io::Result<bool> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    match renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE) {
        Ok(()) => Ok(true),
        Err(e) if e == rustix::io::Errno::NOENT || e == rustix::io::Errno::INVAL => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Renames `a` to `b` unless `b` exists (`renameat2` with
/// `RENAME_NOREPLACE`): `Ok(false)`, nothing done, when it does.
pub fn rename_noreplace(a: &Path, b: &Path) -> std::io::Result<bool> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    match renameat_with(CWD, a, CWD, b, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(true),
        Err(e) if e == rustix::io::Errno::EXIST => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use std::path::PathBuf;

    #[test]
    fn a_mount_root_is_told_by_statx() {
        let d = std::env::temp_dir().join(format!("ember-sys-mountroot-{}", std::process::id()));
        let inner = d.join("inner");
        std::fs::create_dir_all(&inner).unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert_eq!(is_mount_root(&d).unwrap(), Some(false), "a plain dir");
        assert_eq!(is_mount_root(&d.join("missing")).unwrap(), Some(false));
        assert_eq!(is_mount_root(Path::new("/")).unwrap(), Some(true), "the root");
        mount_tmpfs(&d, "size=1048576,mode=0700").expect("mount (the tests run as root)");
        assert_eq!(is_mount_root(&d).unwrap(), Some(true), "a tmpfs mounted on it");
        assert!(mounted(&d) && !mounted(&inner.join("x")));
        std::fs::create_dir(d.join("sub")).unwrap();
        assert_eq!(is_mount_root(&d.join("sub")).unwrap(), Some(false), "a dir on the tmpfs");
        assert!(unmount_detach(&d).unwrap());
        // A symlink to a mount point is not one (not followed).
        mount_tmpfs(&inner, "size=1048576,mode=0700").unwrap();
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&inner, &link).unwrap();
        assert_eq!(is_mount_root(&inner).unwrap(), Some(true));
        assert_eq!(is_mount_root(&link).unwrap(), Some(false), "the symlink itself");
        assert!(unmount_detach(&inner).unwrap());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn whiteout_and_xattr() {
        let d = std::env::temp_dir().join(format!("ember-sys-fs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let wh = d.join("gone");
        mknod_whiteout(&wh).expect("mknod (the tests run as root)");
        let m = std::fs::symlink_metadata(&wh).unwrap();
        assert!(m.file_type().is_char_device());
        assert_eq!(m.rdev(), 0);
        assert_eq!(lgetxattr(&d, "user.overlay.opaque").unwrap(), None);
        lsetxattr(&d, "user.overlay.opaque", b"y").unwrap();
        assert_eq!(lgetxattr(&d, "user.overlay.opaque").unwrap().as_deref(), Some(&b"y"[..]));
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// The mounts of an OCI sandbox (its root's tmpfs and overlay, a gVisor
    /// slot) made with these calls carry the flags and propagation mount(8)
    /// gave them; a lazy unmount does not follow a symlink to a mount.
    #[test]
    fn oci_mounts_carry_their_flags_and_an_unmount_follows_no_symlink() {
        use rustix::fs::{statvfs, StatVfsMountFlags as F};
        let d = std::env::temp_dir().join(format!("ember-sys-ocimounts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let (slot, mnt) = (d.join("ws"), d.join("mnt"));
        for p in [&slot, &mnt] {
            std::fs::create_dir_all(p).unwrap();
        }
        // A failed assertion leaves no mount behind either.
        struct Gone(PathBuf);
        impl Drop for Gone {
            fn drop(&mut self) {
                for p in ["mnt/root", "mnt", "ws"] {
                    let _ = unmount_detach(&self.0.join(p));
                }
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _gone = Gone(d.clone());
        mount_tmpfs_noexec(&slot, "size=1m,nr_inodes=1024,mode=0755").expect("mount (the tests run as root)");
        make_shared(&slot).unwrap();
        let flags = statvfs(&slot).unwrap().f_flag;
        assert!(flags.contains(F::NOEXEC | F::NOSUID | F::NODEV), "slot flags {flags:?}");
        let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mi.lines().find(|l| l.split(' ').nth(4) == Some(slot.to_str().unwrap())).expect("slot in mountinfo");
        assert!(line.split(" - ").next().unwrap().contains(" shared:"), "slot not shared: {line}");

        mount_tmpfs(&mnt, "size=4m,mode=0755").unwrap();
        for sub in ["lower", "upper", "work", "root"] {
            std::fs::create_dir(mnt.join(sub)).unwrap();
        }
        std::fs::write(mnt.join("lower/f"), b"1").unwrap();
        let root = mnt.join("root");
        let m = mnt.display();
        mount_overlay_nosuid(&root, &format!("lowerdir={m}/lower,upperdir={m}/upper,workdir={m}/work")).unwrap();
        assert_eq!(std::fs::read(root.join("f")).unwrap(), b"1", "the lower shows through");
        let flags = statvfs(&root).unwrap().f_flag;
        assert!(flags.contains(F::NOSUID) && !flags.contains(F::NOEXEC), "root flags {flags:?}");

        let link = d.join("link");
        std::os::unix::fs::symlink(&root, &link).unwrap();
        assert!(!unmount_detach(&link).unwrap(), "a symlink is no mount point");
        assert!(mounted(&root), "the overlay behind the symlink stays");
        for p in [&root, &mnt, &slot] {
            assert!(unmount_detach(p).unwrap(), "{} was mounted", p.display());
        }
    }

    #[test]
    fn tmpfs_mount_and_detach() {
        let d = std::env::temp_dir().join(format!("ember-sys-tmpfs-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        mount_tmpfs(&d, "size=1048576,mode=0700").expect("mount (the tests run as root)");
        std::fs::write(d.join("x"), b"1").unwrap();
        assert!(unmount_detach(&d).unwrap());
        assert!(!d.join("x").exists(), "the file lived on the tmpfs");
        assert!(!unmount_detach(&d).unwrap(), "nothing is mounted any more");
        std::fs::remove_dir(&d).unwrap();
    }
}
