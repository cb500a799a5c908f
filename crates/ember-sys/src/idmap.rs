//! Idmapped mounts: the shared layers (the `host` template, image layers) and
//! workspaces are stored once, owned by the storage id range; each sandbox sees
//! them through a mount whose idmap shifts that range onto the sandbox's own.
//! An idmap is given as a user namespace: on-disk id `x` reads as the host id
//! that namespace maps `x` to. Writes through the mount map back the same way.
use crate::SysError;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

/// A user namespace with `map` as both its uid and gid map (e.g.
/// "1000000000 1000065536 65536": storage ids onto a sandbox's range), held
/// by the returned fd. A child made for it waits until it is killed; the
/// namespace lives on as long as the fd (and mounts idmapped with it).
///
/// The child is killed, not told to exit through a pipe: every other fork or
/// clone of the daemon running meanwhile (another launch's helper, a sandbox
/// init) inherits a copy of a pipe's write end, and its EOF never comes.
pub fn userns_fd(map: &str) -> Result<OwnedFd, SysError> {
    userns_fd_owned(map, 0)
}

/// [`userns_fd`] for a namespace owned by host uid `owner`, the euid of its
/// creator: the per-uid kernel counts (inotify instances, processes, user
/// namespaces) of whatever runs in it are charged, in the host's namespace,
/// to `owner`, not to host root. An OCI runtime is handed it to join
/// (`linux.namespaces[].path`): the one it would make would be root's.
pub fn userns_fd_owned(map: &str, owner: u32) -> Result<OwnedFd, SysError> {
    use crate::vmclone::{clone_vm, SignalsBlocked, Stack};
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // A CLONE_VM child: no copy of the daemon's page tables (vmclone.rs).
    let stack = Stack::new(64 << 10)?;
    let blocked = SignalsBlocked::new();
    // SAFETY: `pause_entry` makes raw syscalls on its own stack only and
    // never returns; its argument is a plain integer.
    let pid = unsafe {
        clone_vm(libc::CLONE_NEWUSER, owner, &stack, pause_entry, parent as usize as *mut libc::c_void, None)
    };
    drop(blocked);
    let pid = pid?;
    let opened = write_maps(pid, map);
    let mut status = 0;
    // SAFETY: signals and reaps the child cloned above (not yet reaped, so
    // its pid cannot name another process); status is a live int.
    let reaped = unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0) == pid
    };
    if !reaped {
        stack.leak();
    }
    opened
}

/// The namespace holder: waits for its SIGKILL. Killed with the thread that
/// cloned it, should the daemon die before it kills the child (a SIGKILLed
/// node left one pausing forever, reparented to init); a parent already gone
/// is seen by the pid check. Every signal but SIGKILL is blocked (inherited).
/// It holds no descriptor: its copy of the daemon's table would keep the pipe
/// ends of launches in flight open while it lives (child.rs).
extern "C" fn pause_entry(parent: *mut libc::c_void) -> libc::c_int {
    // SAFETY: raw syscalls with integer arguments only.
    unsafe {
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != parent as usize as libc::pid_t {
            libc::_exit(0);
        }
        loop {
            libc::pause();
        }
    }
}

fn write_maps(pid: i32, map: &str) -> Result<OwnedFd, SysError> {
    for f in ["uid_map", "gid_map"] {
        let path = format!("/proc/{pid}/{f}");
        std::fs::write(&path, map).map_err(|e| SysError::new("write", path, e))?;
    }
    let path = format!("/proc/{pid}/ns/user");
    let f = std::fs::File::open(&path).map_err(|e| SysError::new("open", path, e))?;
    Ok(f.into())
}

/// A detached recursive copy of `source`, nosuid and nodev, read-only if
/// asked, its ids shifted by `userns`: attach it with [`crate::spawn::FsOp::Attach`]
/// or `move_mount`. Dropping the fd before that unmounts it.
pub fn idmapped_tree(source: &Path, readonly: bool, userns: BorrowedFd<'_>) -> Result<OwnedFd, SysError> {
    crate::inject::detached_copy(source, readonly, Some(userns))
}

/// A detached copy of the mount tree at `source` (recursive; nosuid, nodev,
/// read-only if asked), ids as they are: for a child cloned from a
/// [`crate::mountns::LaunchNs`], where the host's later mounts are not.
pub fn plain_tree(source: &Path, readonly: bool) -> Result<OwnedFd, SysError> {
    crate::inject::detached_copy(source, readonly, None)
}

/// Whether `path` is on an overlay, which cannot be idmapped (overlayfs does
/// not set `FS_ALLOW_IDMAP`: `mount_setattr` is EINVAL).
pub fn is_overlay(path: &Path) -> Result<bool, SysError> {
    const OVERLAYFS_SUPER_MAGIC: u64 = 0x794c_7630;
    let st = rustix::fs::statfs(path).map_err(|e| SysError::new("statfs", path.display().to_string(), e.into()))?;
    Ok(st.f_type as u64 == OVERLAYFS_SUPER_MAGIC)
}

/// Attaches a detached tree (from [`idmapped_tree`]) on the directory `dir`
/// of the host's mount table, given by its fd: for a layer the host mounts an
/// overlay over, or a volume an OCI runtime binds from a host path (it takes
/// paths, not fds). `dir` is the daemon's own, opened without following a
/// symlink, and is not walked again.
pub fn attach_tree(tree: BorrowedFd<'_>, dir: BorrowedFd<'_>, what: &Path) -> Result<(), SysError> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    // SAFETY: both fds are live for the call; "" with the EMPTY_PATH flags
    // names the fds themselves.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            dir.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(SysError::last("move_mount idmapped tree", what.display().to_string()));
    }
    Ok(())
}
