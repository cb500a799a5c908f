//! Orphans the daemon adopts as a child subreaper, reaped the moment they exit.
//!
//! An OCI runtime's `create` forks the container's processes (runsc: the
//! Sentry and its gofer; crun and runc: the container's init) and exits; they
//! are then reparented to the nearest subreaper, else to PID 1. A PID 1 that
//! reaps late (a container's or this VM's `process_api`) leaves them zombies,
//! and `runsc delete` polls `kill(pid, 0)` every 100 ms until the zombie is
//! gone: 1.4 s of a 1.5 s removal (docs/performance.md). With the daemon as
//! subreaper they become its children, and this module reaps them.
//!
//! Reaped are the pids handed to [`adopt_child`], and, once one of them has
//! ended, the children of this process in another session than its own (what
//! the ended one left: the Sentry's ptrace stubs), each through its own pidfd,
//! never by `waitpid(-1)`: the exit statuses of the daemon's commands
//! (`Command::output`) and of its native inits (the monitor's pidfd wait),
//! which all keep the daemon's session, stay with their own waiters.
use crate::pidfd::{pidfd_open, pidfd_try_wait};
use crate::SysError;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

/// Makes this process the subreaper of its descendants' orphans
/// (`PR_SET_CHILD_SUBREAPER`); the daemon calls it once at start.
pub fn become_subreaper() -> Result<(), SysError> {
    crate::process::set_child_subreaper().map_err(|e| SysError::new("prctl", "PR_SET_CHILD_SUBREAPER", e))
}

/// The parent pid of `pid` (field 4 of `/proc/<pid>/stat`), if it exists.
pub fn parent_of(pid: i32) -> Option<i32> {
    stat_fields(pid).map(|(ppid, _)| ppid)
}

/// Hands `pid` to the reaper thread if it is a child of this process; returns
/// whether it did. A pid that is not our child, or that is gone, is left
/// alone. The caller names only processes this one did not spawn itself (an
/// OCI container's, found in the container's cgroup): the reaper takes the
/// exit status that a `wait` of the spawner would have wanted.
pub fn adopt_child(pid: i32) -> Result<bool, SysError> {
    if pid <= 0 {
        return Ok(false);
    }
    // The pidfd first: from here on it names this one process whatever
    // happens to the pid, and the parent read below is checked to be its.
    let fd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) if e.source.raw_os_error() == Some(libc::ESRCH) => return Ok(false),
        Err(e) => return Err(e),
    };
    if parent_of(pid) != Some(std::process::id() as i32) || crate::pidfd::pid_of(&fd) != Some(pid) {
        return Ok(false);
    }
    reaper()?.add(fd);
    Ok(true)
}

struct Reaper {
    new: Mutex<Vec<OwnedFd>>,
    wake: OwnedFd,
}

static REAPER: OnceLock<Reaper> = OnceLock::new();

fn reaper() -> Result<&'static Reaper, SysError> {
    if let Some(r) = REAPER.get() {
        return Ok(r);
    }
    let wake = crate::fd::eventfd()?;
    let mut started = false;
    let r = REAPER.get_or_init(|| {
        started = true;
        Reaper { new: Mutex::new(Vec::new()), wake }
    });
    if started {
        std::thread::Builder::new()
            .name("ember-reaper".into())
            .spawn(move || r.run())
            .map_err(|e| SysError::new("spawn thread", "ember-reaper", e))?;
    }
    Ok(r)
}

impl Reaper {
    fn add(&self, fd: OwnedFd) {
        self.new.lock().unwrap_or_else(|e| e.into_inner()).push(fd);
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
        unsafe { libc::write(self.wake.as_raw_fd(), (&1u64 as *const u64).cast(), 8) };
    }

    /// Waits on every adopted pidfd at once (each polls readable when its
    /// process exits) and reaps each as it ends. When one ends, what it
    /// leaves is adopted in turn ([`orphans`]): runsc's Sentry leaves its
    /// ptrace stubs, which the kernel hands to the subreaper.
    fn run(&self) {
        let mut fds: Vec<(i32, OwnedFd)> = Vec::new();
        loop {
            for fd in self.new.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                fds.extend(crate::pidfd::pid_of(&fd).map(|pid| (pid, fd)));
            }
            let mut polled: Vec<libc::pollfd> = std::iter::once(self.wake.as_raw_fd())
                .chain(fds.iter().map(|(_, f)| f.as_raw_fd()))
                .map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 })
                .collect();
            // SAFETY: `polled` is a live array of pollfds and its length is passed with it.
            if unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, -1) } <= 0 {
                continue;
            }
            if polled[0].revents != 0 {
                crate::fd::drain(&self.wake);
            }
            let ended: Vec<bool> = polled[1..].iter().map(|p| p.revents != 0).collect();
            let mut i = 0;
            // Readable: the process is gone or a zombie; reaped if ours, else
            // its own parent reaps it (the monitor may have been first).
            fds.retain(|(_, fd)| {
                let done = ended[i];
                i += 1;
                if done {
                    let _ = pidfd_try_wait(fd);
                }
                !done
            });
            if ended.contains(&true) {
                let known: Vec<i32> = fds.iter().map(|(p, _)| *p).collect();
                fds.extend(orphans(&known));
            }
        }
    }
}

/// This process's children that it did not spawn: those in another session
/// than its own (runsc's Sentry and its ptrace stubs each call `setsid`; the
/// daemon starts no command that does, and a native init keeps the daemon's
/// session), not in `known`, each with its pidfd.
fn orphans(known: &[i32]) -> Vec<(i32, OwnedFd)> {
    let me = std::process::id() as i32;
    // SAFETY: getsid(0) takes an integer and touches no memory.
    let sid = unsafe { libc::getsid(0) };
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let adopted = |pid: i32| stat_fields(pid).is_some_and(|(ppid, s)| ppid == me && s != sid);
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| !known.contains(pid) && adopted(*pid))
        .filter_map(|pid| {
            let fd = pidfd_open(pid).ok()?;
            // Read again through the pinned process: the pid may have been reused.
            (adopted(pid) && crate::pidfd::pid_of(&fd) == Some(pid)).then_some((pid, fd))
        })
        .collect()
}

/// The parent pid and session id of `pid` (fields 4 and 6 of its `stat`).
fn stat_fields(pid: i32) -> Option<(i32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields follow the last ')'.
    let mut f = stat[stat.rfind(')')? + 1..].split_whitespace().skip(1);
    let ppid = f.next()?.parse().ok()?;
    let session = f.nth(1)?.parse().ok()?;
    Some((ppid, session))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn parent_of_reads_a_childs_parent() {
        let me = std::process::id() as i32;
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        assert_eq!(parent_of(child.id() as i32), Some(me));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(parent_of(i32::MAX), None);
    }

    /// An orphan reparented to this process (the subreaper) is reaped once
    /// adopted; without the reaper it would stay a zombie child of ours.
    #[test]
    fn an_adopted_orphan_is_reaped_when_it_exits() {
        become_subreaper().unwrap();
        let out = Command::new("sh").args(["-c", "sleep 0.5 >/dev/null 2>&1 & echo $!"]).output().unwrap();
        let pid: i32 = String::from_utf8(out.stdout).unwrap().trim().parse().unwrap();
        assert_eq!(parent_of(pid), Some(std::process::id() as i32), "the orphan was not reparented to us");
        assert!(adopt_child(pid).unwrap());
        let gone = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            parent_of(pid).is_none()
        });
        assert!(gone, "pid {pid} is still there 5 s after a 0.5 s sleep: not reaped");
    }

    #[test]
    fn a_process_that_is_not_our_child_is_not_adopted() {
        // PID 1 exists and is nobody's child here.
        assert!(!adopt_child(1).unwrap());
        assert!(!adopt_child(0).unwrap());
    }
}
