//! Pseudo-terminals for the agent's interactive sessions (execd `/pty`):
//! allocate a pair, make a spawned command the session leader with the pty
//! as its controlling terminal, and resize it.
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// Both ends of a new pseudo-terminal.
#[derive(Debug)]
pub struct PtyPair {
    /// The side the agent reads output from and writes input to;
    /// non-blocking, close-on-exec.
    pub master: OwnedFd,
    /// The terminal the command gets as stdin, stdout and stderr; close-on-exec
    /// (the command receives its own dup'ed copies).
    pub slave: OwnedFd,
}

/// Opens a pseudo-terminal pair of `cols`×`rows` from `/dev/ptmx`.
pub fn open_pty(cols: u16, rows: u16) -> io::Result<PtyPair> {
    let (mut master, mut slave): (libc::c_int, libc::c_int) = (-1, -1);
    let ws = winsize(cols, rows);
    // SAFETY: the out-pointers are valid writable c_ints; the name and termios
    // pointers may be null (documented); `ws` outlives the call.
    let r = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &ws) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openpty succeeded, so both fds are open and owned by nobody else.
    let pair = unsafe { PtyPair { master: OwnedFd::from_raw_fd(master), slave: OwnedFd::from_raw_fd(slave) } };
    set_flags(pair.master.as_raw_fd(), true)?;
    set_flags(pair.slave.as_raw_fd(), false)?;
    Ok(pair)
}

/// Close-on-exec always; O_NONBLOCK when asked (the master is polled by tokio).
fn set_flags(fd: libc::c_int, nonblocking: bool) -> io::Result<()> {
    // SAFETY: `fd` is an open descriptor owned by the caller; F_SETFD/F_GETFL/
    // F_SETFL take and return plain integers.
    unsafe {
        if libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) == -1 {
            return Err(io::Error::last_os_error());
        }
        if nonblocking {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            if fl == -1 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == -1 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

fn winsize(cols: u16, rows: u16) -> libc::winsize {
    libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 }
}

/// Sets the window size of the terminal behind `fd` (either end); the
/// foreground process group gets SIGWINCH from the kernel.
pub fn set_window_size(fd: BorrowedFd<'_>, cols: u16, rows: u16) -> io::Result<()> {
    let ws = winsize(cols, rows);
    // SAFETY: `fd` is borrowed, hence open; TIOCSWINSZ reads one winsize from
    // the pointer, which outlives the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if r == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Configures `cmd` to start a new session (so it leads its own process
/// group, like `process_group(0)`, which must not be combined with this: a
/// session leader cannot setpgid) and to take its stdin, a terminal, as
/// its controlling terminal, so ^C, job control and SIGHUP work.
pub fn set_controlling_terminal(cmd: &mut Command) {
    let hook = || -> io::Result<()> {
        // SAFETY: raw syscalls only (async-signal-safe, no allocation), in the
        // single-threaded child between fork and exec; stdin is already the
        // pty slave (std sets up stdio before running pre_exec hooks).
        unsafe {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the hook only makes raw syscalls and touches no captured memory.
    unsafe {
        cmd.pre_exec(hook);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn a_pair_carries_bytes_and_sizes() {
        let pair = open_pty(100, 30).expect("openpty");
        let mut slave = std::fs::File::from(pair.slave.try_clone().unwrap());
        slave.write_all(b"hi\n").unwrap();
        let mut master = std::fs::File::from(pair.master);
        let mut buf = [0u8; 16];
        let mut got = Vec::new();
        // Non-blocking: the bytes reach the master through the line discipline.
        for _ in 0..1000 {
            match master.read(&mut buf) {
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
            if got.ends_with(b"\r\n") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(got, b"hi\r\n", "the line discipline maps \\n to \\r\\n");
        set_window_size(master.as_fd(), 132, 43).unwrap();
        let mut ws = winsize(0, 0);
        // SAFETY: TIOCGWINSZ writes one winsize into `ws`.
        let r = unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
        assert_eq!(r, 0);
        assert_eq!((ws.ws_col, ws.ws_row), (132, 43));
    }
}
