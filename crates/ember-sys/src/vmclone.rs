//! `clone(CLONE_VM)` on a stack of its own: a child that shares the daemon's
//! memory instead of getting a copy of it.
//!
//! A plain fork of the daemon (1.6 GB of virtual memory, dozens of threads)
//! copies its page tables (`copy_page_range`, the largest item of its CPU
//! profile) and holds its `mmap_lock` meanwhile, so every runtime worker that
//! page-faults waits (docs/performance.md). A `CLONE_VM` child copies nothing
//! and takes no lock; in exchange it runs in the parent's memory, so:
//! - it must not allocate, take a lock, or write anything but its own stack
//!   (it runs beside the daemon's other threads, on the same heap);
//! - it has the calling thread's TLS, so `errno` is that thread's: the parent
//!   thread stays blocked in plain syscalls while the child runs;
//! - signals are blocked on the calling thread across the clone (the child
//!   inherits the mask), so no handler of the daemon's runs on the child's
//!   stack; the child restores the mask just before `exec`;
//! - its stack may be freed only once the child has exec'd (its memory is
//!   then a new one) or has been reaped.
use crate::SysError;
use std::os::fd::RawFd;

/// An mmap'd stack for one child, with a guard page below it.
pub(crate) struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

impl Stack {
    pub(crate) fn new(len: usize) -> Result<Stack, SysError> {
        // SAFETY: an anonymous private mapping; no pointer of ours is passed.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(SysError::last("mmap", "child stack"));
        }
        let stack = Stack { base, len };
        // SAFETY: the lowest page of the mapping just made: an overflow faults.
        if unsafe { libc::mprotect(base, 4096, libc::PROT_NONE) } != 0 {
            return Err(SysError::last("mprotect", "child stack guard"));
        }
        Ok(stack)
    }

    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of the mapping, which the stack grows down from.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }

    /// Keeps the mapping for good: a child that may still run on it was not reaped.
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once (callers leak it
        // instead while a child may still use it).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// Every signal blocked on this thread until dropped; `old` is the mask before.
pub(crate) struct SignalsBlocked {
    pub(crate) old: libc::sigset_t,
}

impl SignalsBlocked {
    pub(crate) fn new() -> SignalsBlocked {
        // SAFETY: sigset_t is plain data; both sets are live for the calls.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            SignalsBlocked { old }
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new` on this same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// Clones a child that shares this process's memory and runs `entry(arg)`
/// on `stack`, with this thread's effective uid set to `owner` for the clone
/// (the owner of a new user namespace, see [`crate::spawn::LaunchPlan::ns_owner`]).
/// `flags` holds the namespace flags; `CLONE_VM` and `SIGCHLD` are added, and
/// `CLONE_PIDFD` with the pidfd stored in `pidfd` if given. Returns the pid.
///
/// # Safety
/// `entry` must follow the rules of this module (no allocation, no locks,
/// no writes outside its stack, never return into the caller's frames), `arg`
/// must stay valid until the child has exec'd or been reaped, and the caller
/// must hold [`SignalsBlocked`] across the call.
pub(crate) unsafe fn clone_vm(
    flags: libc::c_int,
    owner: u32,
    stack: &Stack,
    entry: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    arg: *mut libc::c_void,
    pidfd: Option<&mut RawFd>,
) -> Result<i32, SysError> {
    let keep = -1 as libc::c_int;
    let with_pidfd = if pidfd.is_some() { libc::CLONE_PIDFD } else { 0 };
    let ptid = pidfd.map_or(std::ptr::null_mut(), |p| p as *mut RawFd);
    // SAFETY: raw setresuid of this thread's effective uid only (glibc's
    // wrapper would change every thread); real and saved stay 0.
    if owner != 0 && unsafe { libc::syscall(libc::SYS_setresuid, keep, owner as libc::c_uint, keep) } < 0 {
        return Err(SysError::last("seteuid", owner.to_string()));
    }
    // SAFETY: glibc's clone runs `entry(arg)` in the child on `stack`'s top
    // and never returns there; the caller upholds the rules above. With
    // CLONE_PIDFD the kernel stores the pidfd through `ptid`.
    let pid =
        unsafe { libc::clone(entry, stack.top(), flags | libc::CLONE_VM | with_pidfd | libc::SIGCHLD, arg, ptid) };
    let clone_err = (pid < 0).then(|| SysError::last("clone", "CLONE_VM child"));
    // SAFETY: as above; back to effective root (the saved uid is 0).
    if owner != 0 && unsafe { libc::syscall(libc::SYS_setresuid, keep, 0 as libc::c_uint, keep) } < 0 {
        return Err(SysError::last("seteuid", "0"));
    }
    clone_err.map_or(Ok(pid), Err)
}
