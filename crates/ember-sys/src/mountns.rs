//! The mount namespace sandboxes are cloned from.
//!
//! A clone with `CLONE_NEWNS` copies the calling thread's whole mount table
//! (`copy_mnt_ns` → `copy_tree`, under the kernel's global `namespace_sem`),
//! and the host's table holds one tmpfs per sandbox (its writable layer), the
//! workspaces' loop and bind mounts and the egress network's namespace files.
//! Measured on this machine (`unshare -m true`, 200 runs each): 2.0 ms with
//! 36 mounts, 3.9 ms with 1,036, 16.7 ms with 4,036, 33.9 ms with 10,036:
//! every launch paid ~3 µs for each sandbox already on the host, and held the
//! lock every mount of the host waits on meanwhile.
//!
//! A [`LaunchNs`] is a private copy of the host's table made once, at start,
//! that keeps only what a launch reads by path: the mounts at or below the
//! `keep` dirs (`/proc`, `/dev`, `/sys`, `/usr`, the data dir), the mounts
//! holding them (`/`), nothing below the `drop_under` dirs (the data dir's
//! own mounts). Its table does not grow with the sandboxes, and it holds no
//! other host filesystem busy (an unmount on the host frees it as before). A
//! launch enters it on a short-lived thread and clones from there; what the
//! child needs of the host's later mounts (its writable layer, its volumes) it
//! gets as detached trees, opened in the host's table by the parent and
//! attached by the child (`spawn.rs`, `FsOp::Attach`).
use crate::SysError;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// A mount namespace kept open by its descriptor.
#[derive(Debug)]
pub struct LaunchNs {
    fd: OwnedFd,
}

impl LaunchNs {
    /// A private copy of the host's mount table with only the mounts at,
    /// below or holding one of `keep`, less those strictly below one of
    /// `drop_under`. Paths as the mount table shows them (canonical).
    pub fn new(keep: &[PathBuf], drop_under: &[PathBuf]) -> Result<LaunchNs, SysError> {
        on_thread("launch mount namespace", || make(keep, drop_under)).map(|fd| LaunchNs { fd })
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// One for work under `dir` (the daemon's data dir, a store's root):
    /// `/`, `/proc`, `/dev`, `/usr`, the `also` dirs and `dir`'s own mount
    /// kept, nothing mounted below `dir` but the mounts at its `own` subdirs
    /// (`sandboxes`, the native runtime's tmpfs), each without what is
    /// mounted below it.
    pub fn for_dir(dir: &Path, also: &[&str], own: &[&str]) -> Result<LaunchNs, SysError> {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let mut keep: Vec<PathBuf> = ["/proc", "/dev", "/usr"].iter().chain(also).map(PathBuf::from).collect();
        keep.push(dir.clone());
        keep.extend(own.iter().map(|o| dir.join(o)));
        LaunchNs::new(&keep, &[dir])
    }

    /// Runs `f` on a short-lived thread inside this namespace: what it
    /// starts (a `Command`) starts in it too, and reads this small table,
    /// not the host's.
    pub fn run<T: Send>(&self, what: &'static str, f: impl FnOnce() -> T + Send) -> Result<T, SysError> {
        on_thread(what, || {
            enter(self.fd.as_fd())?;
            Ok(f())
        })
    }

    /// The mount points of this namespace, as `/proc/thread-self/mountinfo`
    /// shows them from inside.
    pub fn mount_points(&self) -> Result<Vec<PathBuf>, SysError> {
        on_thread("launch mount namespace", || {
            enter(self.fd.as_fd())?;
            own_mount_points()
        })
    }
}

/// Moves the calling thread into the mount namespace `fd`. Only for a
/// thread that ends with the work (its root and cwd become the namespace's).
pub(crate) fn enter(fd: BorrowedFd<'_>) -> Result<(), SysError> {
    // SAFETY: unshare and setns change only this thread; `fd` is open for the
    // call. setns into a mount namespace needs a thread that does not share
    // its root and cwd with others: CLONE_FS first.
    unsafe {
        if libc::unshare(libc::CLONE_FS) < 0 {
            return Err(SysError::last("unshare CLONE_FS", "launch mount namespace"));
        }
        if libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNS) < 0 {
            return Err(SysError::last("setns", format!("mount namespace fd {}", fd.as_raw_fd())));
        }
    }
    Ok(())
}

fn make(keep: &[PathBuf], drop_under: &[PathBuf]) -> Result<OwnedFd, SysError> {
    // SAFETY: unshare changes only this thread (CLONE_NEWNS implies
    // CLONE_FS); mount with a null source and type only changes the
    // propagation of "/" and everything below it, in the new namespace.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) < 0 {
            return Err(SysError::last("unshare CLONE_NEWNS", "launch mount namespace"));
        }
        // Private first: an unmount below must not propagate to the host's
        // shared mounts, and the host's new mounts must not reach here.
        let r = libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        );
        if r < 0 {
            return Err(SysError::last("make / private", "launch mount namespace"));
        }
    }
    let points = own_mount_points()?;
    for p in outermost_dropped(&points, keep, drop_under) {
        let c = crate::fs::cpath("umount", &p)?;
        // SAFETY: a NUL-terminated path; a lazy unmount of this namespace's
        // mount, which takes its submounts along.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } < 0 {
            return Err(SysError::last("umount", p.display().to_string()));
        }
    }
    // SAFETY: a NUL-terminated path; a non-negative result is a new fd we own.
    let fd = unsafe { libc::open(c"/proc/thread-self/ns/mnt".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(SysError::last("open", "/proc/thread-self/ns/mnt"));
    }
    // SAFETY: fd is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The mounts a launch namespace drops (see [`LaunchNs::new`]), outermost
/// only: detaching them detaches the rest. A mount is kept when it is at or
/// below a `keep` dir or holds one, unless it is strictly below a
/// `drop_under` dir and not itself at a `keep` dir; so no kept mount is
/// below a dropped one.
fn outermost_dropped(points: &[PathBuf], keep: &[PathBuf], drop_under: &[PathBuf]) -> Vec<PathBuf> {
    let dropped = |p: &Path| {
        let kept = keep.iter().any(|k| p.starts_with(k) || k.starts_with(p));
        let named = keep.iter().any(|k| k == p);
        !kept || (!named && drop_under.iter().any(|d| p != d && p.starts_with(d)))
    };
    let mut hit: Vec<&PathBuf> = points.iter().filter(|p| dropped(p)).collect();
    hit.sort_by_key(|p| p.components().count());
    let mut out: Vec<PathBuf> = Vec::new();
    for p in hit {
        if !out.iter().any(|o| p.starts_with(o)) {
            out.push(p.clone());
        }
    }
    out
}

/// The calling thread's mount points (octal escapes of mountinfo undone).
fn own_mount_points() -> Result<Vec<PathBuf>, SysError> {
    let path = "/proc/thread-self/mountinfo";
    let text = std::fs::read_to_string(path).map_err(|e| SysError::new("read", path, e))?;
    Ok(text.lines().filter_map(|l| l.split(' ').nth(4)).map(|p| PathBuf::from(unescape(p))).collect())
}

/// mountinfo writes a space, tab, newline and backslash in a path as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn on_thread<T: Send>(what: &'static str, f: impl FnOnce() -> Result<T, SysError> + Send) -> Result<T, SysError> {
    std::thread::scope(|s| {
        s.spawn(f).join().unwrap_or_else(|_| Err(SysError::new("thread", what, std::io::Error::other("panicked"))))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &[&str]) -> Vec<PathBuf> {
        v.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn a_launch_namespace_keeps_what_holds_or_is_below_its_dirs_and_drops_the_rest() {
        let points = p(&[
            "/",
            "/proc",
            "/proc/sys/fs/binfmt_misc",
            "/dev",
            "/sys/fs/cgroup",
            "/run",
            "/run/netns/ember-0",
            "/run/user/0",
            "/tmp",
            "/tmp/data",
            "/tmp/data/sandboxes/a/mnt",
            "/tmp/data/workspaces/w/fs",
            "/tmp/other",
            "/home",
            "/database",
        ]);
        let keep = p(&["/proc", "/dev", "/sys", "/usr", "/tmp/data"]);
        assert_eq!(
            outermost_dropped(&points, &keep, &p(&["/tmp/data"])),
            p(&["/run", "/home", "/database", "/tmp/other", "/tmp/data/sandboxes/a/mnt", "/tmp/data/workspaces/w/fs"])
        );
        // A mount of the data dir's own that is named is kept, not what is below it.
        let named = p(&["/proc", "/dev", "/sys", "/usr", "/tmp/data", "/tmp/data/sandboxes"]);
        assert_eq!(
            outermost_dropped(&points_with_sandboxes(&points), &named, &p(&["/tmp/data"])),
            p(&["/run", "/home", "/database", "/tmp/other", "/tmp/data/sandboxes/a/mnt", "/tmp/data/workspaces/w/fs"])
        );
        // Nothing to keep but what holds `/proc`: only `/`.
        assert_eq!(outermost_dropped(&p(&["/", "/proc", "/a"]), &p(&["/proc"]), &[]), p(&["/a"]));
    }

    /// `points` with a mount at `/tmp/data/sandboxes` (the native runtime's tmpfs).
    fn points_with_sandboxes(points: &[PathBuf]) -> Vec<PathBuf> {
        let mut out = points.to_vec();
        out.push(PathBuf::from("/tmp/data/sandboxes"));
        out
    }

    #[test]
    fn escapes_in_mount_points_are_undone() {
        assert_eq!(unescape(r"/a\040b\134c"), r"/a b\c");
        assert_eq!(unescape(r"/plain\x"), r"/plain\x");
    }
}
