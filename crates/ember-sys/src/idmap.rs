//! Idmapped mounts: the shared layers (the `host` template, image layers) and
//! workspaces are stored once, owned by the storage id range; each sandbox sees
//! them through a mount whose idmap shifts that range onto the sandbox's own.
//! An idmap is given as a user namespace: on-disk id `x` reads as the host id
//! that namespace maps `x` to. Writes through the mount map back the same way.
use crate::SysError;
use std::os::fd::{BorrowedFd, OwnedFd};
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
    // SAFETY: a raw clone with a null stack has fork semantics; the child
    // only waits for its SIGKILL (no allocation, no locks).
    let pid =
        unsafe { libc::syscall(libc::SYS_clone, (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong, 0, 0, 0, 0) };
    if pid < 0 {
        return Err(SysError::last("clone", "idmap user namespace"));
    }
    if pid == 0 {
        loop {
            // SAFETY: see above.
            unsafe { libc::pause() };
        }
    }
    let pid = pid as i32;
    let opened = write_maps(pid, map);
    let mut status = 0;
    // SAFETY: signals and reaps the child cloned above (not yet reaped, so
    // its pid cannot name another process); status is a live int.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
    opened
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
