//! Starting a command from a multi-threaded process without copying it:
//! `clone(CLONE_VM | CLONE_VFORK)`, as glibc's `posix_spawn` does, with what
//! `posix_spawn` cannot do: a switch of identity before the exec.
//!
//! The sandbox agent started every command with `fork` (std's `Command`
//! forks once a `pre_exec` hook is set, and the identity switch is one):
//! the copy of its page tables and the copy-on-write faults after it were
//! the agent's largest CPU item per exec (docs/performance.md). A `CLONE_VM`
//! child copies nothing; `CLONE_VFORK` keeps the calling thread stopped
//! until the child has exec'd or exited, so the child may write its failure
//! into the caller's memory and the stack is free once the call returns.
//! The child follows vmclone.rs's rules: raw syscalls on memory prepared
//! before the clone, no allocation, no locks.
use crate::process::Credentials;
use crate::vmclone::{clone_vm, SignalsBlocked, Stack};
use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// One command, resolved into what `execve` takes, before the clone.
pub struct Exec {
    /// Where the program is looked for: the program itself when it names a
    /// path (has a `/`), else each directory of the command's `PATH`.
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
    creds: Option<Credentials>,
}

/// The descriptors the command gets as 0, 1 and 2.
#[derive(Clone, Copy, Debug)]
pub struct Stdio {
    pub stdin: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
}

fn cstring(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the command"))
}

impl Exec {
    /// `program` is looked up in `env`'s `PATH` (`default_path` without
    /// one) unless it has a `/`, as `execvp` does with the command's own
    /// environment. With `creds`, the identity switches before `cwd` is
    /// entered, so the directory is checked with the command's permissions.
    pub fn new<'a>(
        program: &Path,
        args: &[String],
        env: impl IntoIterator<Item = (&'a OsStr, &'a OsStr)>,
        cwd: &Path,
        creds: Option<Credentials>,
        default_path: &str,
    ) -> io::Result<Exec> {
        let prog = program.as_os_str().as_bytes();
        let mut envp = Vec::new();
        let mut path = default_path.as_bytes().to_vec();
        for (k, v) in env {
            if k.as_bytes() == b"PATH" {
                path = v.as_bytes().to_vec();
            }
            envp.push(cstring(&[k.as_bytes(), b"=", v.as_bytes()].concat())?);
        }
        let candidates = if prog.contains(&b'/') {
            vec![cstring(prog)?]
        } else {
            // An empty entry is the working directory, as for execvp.
            let dirs = path.split(|b| *b == b':').map(|d| if d.is_empty() { &b"."[..] } else { d });
            dirs.map(|d| cstring(&[d, b"/", prog].concat())).collect::<io::Result<_>>()?
        };
        let mut argv = vec![cstring(prog)?];
        for a in args {
            argv.push(cstring(a.as_bytes())?);
        }
        Ok(Exec { candidates, argv, envp, cwd: cstring(cwd.as_os_str().as_bytes())?, creds })
    }

    /// Starts the command as the leader of a new process group, with
    /// `stdio` as its 0, 1 and 2, every handled signal back at its default
    /// (and SIGPIPE, which Rust programs ignore) and no signal blocked.
    /// Returns its pid. A failure before the exec (identity, directory,
    /// program) is returned as the failing call's error, the child reaped.
    pub fn spawn(&self, stdio: Stdio) -> io::Result<i32> {
        let ptrs = |v: &[CString]| v.iter().map(|c| c.as_ptr()).chain([std::ptr::null()]).collect::<Vec<_>>();
        let argv = ptrs(&self.argv);
        // A file without a `#!` line is run by /bin/sh, as execvp does: the
        // child writes the candidate into slot 1.
        let mut sh_argv = vec![c"/bin/sh".as_ptr(), std::ptr::null()];
        sh_argv.extend(&argv[1..]);
        let groups: Vec<libc::gid_t> = self.creds.as_ref().map(|c| c.groups.clone()).unwrap_or_default();
        let mut job = Job {
            candidates: ptrs(&self.candidates),
            argv,
            sh_argv,
            envp: ptrs(&self.envp),
            cwd: self.cwd.as_ptr(),
            creds: self.creds.as_ref().map(|c| (c.uid, c.gid)),
            groups,
            stdio,
            failed: None,
        };
        let stack = Stack::new(64 * 1024).map_err(|e| e.source)?;
        let blocked = SignalsBlocked::new();
        // SAFETY: `child` follows vmclone.rs's rules (raw syscalls on `job`,
        // prepared above; its only write outside its stack is `job.failed`,
        // while this thread is stopped by CLONE_VFORK); `job` and `stack`
        // outlive the call, which returns once the child has exec'd or exited.
        let pid = unsafe { clone_vm(libc::CLONE_VFORK, 0, &stack, child, (&mut job as *mut Job).cast(), None) };
        drop(blocked);
        let pid = pid.map_err(|e| e.source)?;
        match job.failed {
            None => Ok(pid),
            Some(errno) => {
                let mut status = 0;
                // SAFETY: reaps the child that just exited (_exit(127)), ours
                // and not waited for by anyone else: the caller serializes
                // its reaping with its spawns.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                Err(io::Error::from_raw_os_error(errno))
            }
        }
    }
}

/// What the child reads, in the parent's memory.
struct Job {
    candidates: Vec<*const libc::c_char>,
    argv: Vec<*const libc::c_char>,
    sh_argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: *const libc::c_char,
    creds: Option<(u32, u32)>,
    groups: Vec<libc::gid_t>,
    stdio: Stdio,
    /// The child's errno when it could not exec.
    failed: Option<i32>,
}

fn errno() -> i32 {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
}

extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `Job`, alive and untouched by it while
    // this child runs (CLONE_VFORK).
    let job = unsafe { &mut *arg.cast::<Job>() };
    // SAFETY: raw syscalls and async-signal-safe libc calls on the job's
    // C strings and arrays; the only write outside this stack is
    // `job.failed` (and `sh_argv[1]`), then exit.
    unsafe {
        reset_signals();
        let e = setup(job);
        let e = if e == 0 { exec(job) } else { e };
        job.failed = Some(e);
        libc::_exit(127)
    }
}

/// Every handled signal back at its default, SIGPIPE too, before any is
/// unblocked: a handler of the parent's must not run in its memory here.
unsafe fn reset_signals() {
    // SAFETY: sigaction on this process's (the child's own) table, with
    // structs on this stack.
    unsafe {
        for sig in 1..=libc::SIGRTMAX() {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if sig == libc::SIGPIPE || (old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN) {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
    }
}

/// Process group, stdio, identity, directory, signal mask; 0 or the errno
/// of the step that failed.
unsafe fn setup(job: &Job) -> i32 {
    // SAFETY: raw syscalls on descriptors and arrays the job holds.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            return errno();
        }
        let s = job.stdio;
        for (from, to) in [(s.stdin, 0), (s.stdout, 1), (s.stderr, 2)] {
            // dup2 onto itself would keep close-on-exec: clear it instead.
            let r = if from == to { libc::fcntl(to, libc::F_SETFD, 0) } else { libc::dup2(from, to) };
            if r < 0 {
                return errno();
            }
        }
        if let Some((uid, gid)) = job.creds {
            // Raw syscalls, not glibc's wrappers, which would signal every
            // thread of the parent (setxid); this child is one task of its own.
            let g = &job.groups;
            if libc::syscall(libc::SYS_setgroups, g.len(), g.as_ptr()) != 0 && errno() != libc::EPERM {
                return errno();
            }
            if libc::syscall(libc::SYS_setgid, gid as libc::c_long) != 0
                || libc::syscall(libc::SYS_setuid, uid as libc::c_long) != 0
            {
                return errno();
            }
        }
        if libc::chdir(job.cwd) != 0 {
            return errno();
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        0
    }
}

/// execve of each candidate in turn, as execvp: on to the next while the
/// program is not there; a permission error is remembered and returned if
/// nothing else is found. Returns only on failure, with the errno.
unsafe fn exec(job: &mut Job) -> i32 {
    let mut denied = false;
    let mut last = libc::ENOENT;
    // SAFETY: execve of NUL-terminated strings and NULL-terminated arrays.
    unsafe {
        for &path in job.candidates.iter().take_while(|p| !p.is_null()) {
            libc::execve(path, job.argv.as_ptr(), job.envp.as_ptr());
            last = errno();
            if last == libc::ENOEXEC {
                job.sh_argv[1] = path;
                libc::execve(c"/bin/sh".as_ptr(), job.sh_argv.as_ptr(), job.envp.as_ptr());
                return errno();
            }
            match last {
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => return last,
            }
        }
    }
    if denied {
        libc::EACCES
    } else {
        last
    }
}

#[cfg(test)]
mod tests;
