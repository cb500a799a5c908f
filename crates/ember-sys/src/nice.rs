//! Thread priorities: a warm pool's refill runs behind the claims.
//!
//! A refill is background work: a member started now is claimed later. On a
//! loaded node its launch (the cgroup, the writable layer's mount, the clone
//! and its new namespaces, all on the daemon's thread) competed with the
//! claims it exists to serve: `ember bench cluster`'s profile put ~4× the
//! claims' launches of an embedded node into the cluster's claim window, ten
//! nodes refilling at once. Linux keeps a nice value per thread, so a
//! refill's thread is niced for the launch and set back after, and the
//! sandbox it started (which inherited the value at its clone) is set back
//! once it is up: nothing the user runs in it is niced.
use std::io;

/// The nice value of a refill's launch.
pub const BACKGROUND: i32 = 10;

fn gettid() -> libc::pid_t {
    // SAFETY: gettid takes no argument and cannot fail.
    unsafe { libc::gettid() }
}

fn set(tid: libc::pid_t, nice: i32) -> io::Result<()> {
    // SAFETY: setpriority on one thread id; PRIO_PROCESS with a tid names
    // that thread alone on Linux.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The nice value of thread `tid` (0 = the calling thread).
pub fn of(tid: libc::pid_t) -> io::Result<i32> {
    // SAFETY: getpriority on one thread id. -1 is also a valid value: errno,
    // cleared first, tells the two apart.
    unsafe {
        *libc::__errno_location() = 0;
        let v = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
        if v == -1 && *libc::__errno_location() != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(v)
    }
}

/// The calling thread at [`BACKGROUND`] until dropped, then at its value
/// before. `None` when it could not be set (nothing changed).
pub struct Background {
    before: i32,
}

impl Background {
    pub fn enter() -> Option<Background> {
        let before = of(0).ok()?;
        set(gettid(), BACKGROUND).ok()?;
        Some(Background { before })
    }

    /// The value the thread had before (what a sandbox it started is set back to).
    pub fn before(&self) -> i32 {
        self.before
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        // Raising it back needs CAP_SYS_NICE (the daemon runs as root):
        // without it the thread stays niced, which slows later work on it,
        // never anything else.
        let _ = set(gettid(), self.before);
    }
}

/// Sets every thread of process `pid` to `nice`. Twice over: a thread
/// created while the first pass ran inherited the old value.
pub fn set_process(pid: i32, nice: i32) -> io::Result<()> {
    for _ in 0..2 {
        for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let Some(tid) = entry?.file_name().to_str().and_then(|s| s.parse().ok()) else { continue };
            match set(tid, nice) {
                // A thread that ended meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                r => r?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_background_thread_is_niced_then_set_back_and_so_is_what_it_started() {
        std::thread::spawn(|| {
            let before = of(0).unwrap();
            {
                let bg = Background::enter().expect("niced (the tests run as root)");
                assert_eq!(of(0).unwrap(), BACKGROUND);
                assert_eq!(bg.before(), before);
                // A child started now inherits the value; set back, all of its threads are.
                let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
                let pid = child.id() as i32;
                assert_eq!(of(pid).unwrap(), BACKGROUND);
                set_process(pid, before).unwrap();
                assert_eq!(of(pid).unwrap(), before);
                let _ = child.kill();
                let _ = child.wait();
            }
            assert_eq!(of(0).unwrap(), before, "the thread kept the background value");
        })
        .join()
        .unwrap();
    }
}
