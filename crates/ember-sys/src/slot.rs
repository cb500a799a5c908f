//! Workspace slots, for sandboxes whose kernel keeps its own mount table
//! (gVisor): a host `setns` cannot reach the Sentry's mounts, so a workspace
//! goes in two steps. On the host, a detached copy of its mount is attached in
//! a fresh directory of the sandbox's slot, a shared host mount of which the
//! sandbox's file server holds a slave copy ([`attach_in_slot`]). Inside the
//! sandbox, a one-shot helper binds that directory at the requested path
//! ([`bind_mount`]).
//!
//! The slot is visible inside the sandbox, so every host-side step works from
//! a directory fd with `O_NOFOLLOW` and never walks a path the sandbox could
//! have changed into a symlink.
use crate::inject::{cstr, detached_copy};
use crate::SysError;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

fn open_dir_at(dir: libc::c_int, name: &std::ffi::CStr, what: &str) -> Result<OwnedFd, SysError> {
    let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: name is NUL-terminated; a non-negative result is a new fd we own.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(SysError::last("open slot dir", what.to_string()));
    }
    // SAFETY: fd is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes the directory `slot/name` (which must not exist: `name` is fresh and
/// unguessable, so the sandbox cannot have planted it) and attaches a detached
/// copy of the host mount `source` there: nosuid, nodev, read-only if asked.
/// The slot is opened `O_NOFOLLOW` and the
/// new directory through the slot's fd, never by a path walked afresh.
pub fn attach_in_slot(slot: &Path, name: &str, source: &Path, readonly: bool) -> Result<(), SysError> {
    let what = format!("{}/{name}", slot.display());
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(SysError::new("slot name", what, std::io::ErrorKind::InvalidInput.into()));
    }
    let slot_c = cstr(&slot.to_string_lossy(), "slot")?;
    let slot_fd = open_dir_at(libc::AT_FDCWD, &slot_c, &what)?;
    let name_c = cstr(name, "slot name")?;
    // SAFETY: name_c is NUL-terminated; slot_fd is a live directory fd.
    if unsafe { libc::mkdirat(slot_fd.as_raw_fd(), name_c.as_ptr(), 0o755) } != 0 {
        return Err(SysError::last("mkdir in slot", what));
    }
    let target = open_dir_at(slot_fd.as_raw_fd(), &name_c, &what)?;
    let tree = detached_copy(source, readonly, None)?;
    // SAFETY: both fds are live; "" with the EMPTY_PATH flags names the fds themselves.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(SysError::last("move_mount into slot", what));
    }
    Ok(())
}

/// Detaches whatever is mounted at `slot/name` (lazily; not following a
/// symlink the sandbox may have put there) and removes the directory. For a
/// failed in-sandbox step; a sandbox's whole slot goes with its destroy.
pub fn detach_from_slot(slot: &Path, name: &str) -> Result<(), SysError> {
    let path = slot.join(name);
    let c = cstr(&path.to_string_lossy(), "slot entry")?;
    // SAFETY: c is NUL-terminated.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) } != 0 {
        return Err(SysError::last("umount slot entry", path.display().to_string()));
    }
    std::fs::remove_dir(&path).map_err(|e| SysError::new("rmdir slot entry", path.display().to_string(), e))
}

/// Bind-mounts `source` at `target` (run inside the sandbox, by the helper that
/// holds `CAP_SYS_ADMIN` there for this one call). Not recursive: gVisor
/// refuses `MS_REC` with EINVAL, and a slot entry has no submounts.
pub fn bind_mount(source: &Path, target: &Path) -> Result<(), SysError> {
    let s = cstr(&source.to_string_lossy(), "source")?;
    let t = cstr(&target.to_string_lossy(), "target")?;
    // SAFETY: both strings are NUL-terminated; null fstype and data are allowed with MS_BIND.
    let r = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
    if r != 0 {
        return Err(SysError::last("bind mount", format!("{} at {}", source.display(), target.display())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn a_slot_entry_is_mounted_read_only_and_a_planted_name_is_refused() {
        if !root() {
            panic!("this test mounts and must run as root (as the whole suite does)");
        }
        let base = std::env::temp_dir().join(format!("ember-slot-test-{}", std::process::id()));
        let (src, slot) = (base.join("src"), base.join("slot"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(&slot).unwrap();
        std::fs::write(src.join("f"), b"f").unwrap();
        attach_in_slot(&slot, "a", &src, true).expect("attach");
        assert_eq!(std::fs::read(slot.join("a/f")).unwrap(), b"f");
        let e = std::fs::write(slot.join("a/x"), b"x").expect_err("read-only");
        assert_eq!(e.raw_os_error(), Some(libc::EROFS));
        std::os::unix::fs::symlink("/etc", slot.join("planted")).unwrap();
        assert!(attach_in_slot(&slot, "planted", &src, false).is_err(), "an existing name is refused");
        assert!(attach_in_slot(&slot, "../x", &src, false).is_err());
        detach_from_slot(&slot, "a").expect("detach");
        assert!(!slot.join("a").exists());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
