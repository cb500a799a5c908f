//! Mounting a host directory into a running sandbox without restarting it:
//! `open_tree(OPEN_TREE_CLONE)` takes a detached copy of the host mount, and a
//! short-lived thread enters the sandbox's mount namespace and attaches it
//! with `move_mount`.
use crate::SysError;
use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

pub(crate) fn cstr(s: &str, what: &str) -> Result<CString, SysError> {
    CString::new(s).map_err(|_| SysError::new("path", what.to_string(), std::io::ErrorKind::InvalidInput.into()))
}

/// Mounts `source` (a host path) at `target` (an absolute path inside the
/// sandbox whose init is `pid`), creating the target directory if needed.
/// `readonly` applies to the whole attached tree; nosuid and nodev always do.
/// `root_ids` are the host uid/gid of the sandbox's root: missing directories
/// are created as that user (the sandbox's filesystem does not accept files
/// from ids outside its user namespace).
pub fn inject_mount(
    pid: i32,
    source: &Path,
    target: &str,
    readonly: bool,
    root_ids: (u32, u32),
    idmap: Option<BorrowedFd<'_>>,
) -> Result<(), SysError> {
    if !target.starts_with('/') || target.split('/').any(|c| c == "..") {
        return Err(SysError::new("inject mount", target, std::io::ErrorKind::InvalidInput.into()));
    }
    let tree = detached_copy(source, readonly, idmap)?;
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(|e| SysError::new("open mount namespace", pid.to_string(), e))?;
    // Every prefix of the target, created in order inside the sandbox.
    let mut prefixes = Vec::new();
    let mut acc = String::new();
    for part in target.split('/').filter(|p| !p.is_empty()) {
        acc.push('/');
        acc.push_str(part);
        prefixes.push(cstr(&acc, target)?);
    }
    let tgt = cstr(target, target)?;
    attach_on_thread(ns.as_raw_fd(), tree.as_raw_fd(), &prefixes, &tgt, root_ids)
        .map_err(|e| SysError::new("attach mount", format!("{target} in pid {pid}"), e))
}

/// A detached recursive copy of the host mount at `source` (`open_tree` with
/// `OPEN_TREE_CLONE`), nosuid and nodev, read-only if asked, idmapped with
/// the user namespace `idmap` if given ([`crate::idmap`]). Attached nowhere
/// until `move_mount`; dropping the fd unmounts it.
pub(crate) fn detached_copy(source: &Path, readonly: bool, idmap: Option<BorrowedFd<'_>>) -> Result<OwnedFd, SysError> {
    let src = cstr(&source.to_string_lossy(), "source")?;
    // SAFETY: src is NUL-terminated; a non-negative result is a new fd we own.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint,
        )
    };
    if tree < 0 {
        return Err(SysError::last("open_tree", source.display().to_string()));
    }
    // SAFETY: tree is a fresh descriptor owned by nobody else.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_NOSUID
            | MOUNT_ATTR_NODEV
            | if readonly { MOUNT_ATTR_RDONLY } else { 0 }
            | if idmap.is_some() { MOUNT_ATTR_IDMAP } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: idmap.map_or(0, |fd| fd.as_raw_fd() as u64),
    };
    // SAFETY: attr is a live struct of the size passed; "" with AT_EMPTY_PATH names the fd itself.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(SysError::last("mount_setattr", source.display().to_string()));
    }
    Ok(tree)
}

/// Joins the mount namespace, creates the target and moves the detached
/// tree there, on a short-lived thread of its own: setns into a mount
/// namespace changes only the calling thread once it has its own root and
/// cwd (`CLONE_FS`), and this thread ends with the work. A forked child did
/// this before: a fork of the daemon copies its page tables and holds its
/// `mmap_lock` meanwhile, stalling every runtime thread that page-faults,
/// then makes each page it writes fault once more (copy on write). In the
/// 300-session drill's rebinds, one such fork per workspace mounted put
/// `copy_page_range` and `do_wp_page` at the top of the daemon's profile
/// (docs/performance.md, "A workspace mount forked the daemon").
fn attach_on_thread(
    ns: i32,
    tree: i32,
    prefixes: &[CString],
    target: &CString,
    ids: (u32, u32),
) -> std::io::Result<()> {
    std::thread::scope(|s| {
        let t = s.spawn(|| attach_here(ns, tree, prefixes, target, ids));
        t.join().unwrap_or_else(|_| Err(std::io::Error::other("the mount thread panicked")))
    })
}

/// [`attach_on_thread`]'s thread.
fn attach_here(ns: i32, tree: i32, prefixes: &[CString], target: &CString, ids: (u32, u32)) -> std::io::Result<()> {
    let last = std::io::Error::last_os_error;
    // SAFETY: unshare, setns and the fsuid calls change only this thread,
    // which ends after this function; the paths are NUL-terminated strings
    // owned by the caller.
    unsafe {
        if libc::unshare(libc::CLONE_FS) != 0 || libc::setns(ns, libc::CLONE_NEWNS) != 0 {
            return Err(last());
        }
        // Raw syscalls: glibc's wrappers would change every thread's.
        libc::syscall(libc::SYS_setfsgid, ids.1);
        libc::syscall(libc::SYS_setfsuid, ids.0);
        let made = prefixes.iter().try_for_each(|p| {
            let r = libc::mkdir(p.as_ptr(), 0o755);
            let e = last();
            if r != 0 && e.raw_os_error() != Some(libc::EEXIST) {
                return Err(e);
            }
            Ok(())
        });
        libc::syscall(libc::SYS_setfsuid, 0);
        libc::syscall(libc::SYS_setfsgid, 0);
        made?;
        let r = libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        );
        if r != 0 {
            return Err(last());
        }
    }
    Ok(())
}
