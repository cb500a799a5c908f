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
    let with_pidfd = if pidfd.is_some() { libc::CLONE_PIDFD } else { 0 };
    let ptid = pidfd.map_or(std::ptr::null_mut(), |p| p as *mut RawFd);
    let pid = as_owner(owner, false, || {
        // SAFETY: glibc's clone runs `entry(arg)` in the child on `stack`'s
        // top and never returns there; the caller upholds the rules above.
        // With CLONE_PIDFD the kernel stores the pidfd through `ptid`.
        unsafe { libc::clone(entry, stack.top(), flags | libc::CLONE_VM | with_pidfd | libc::SIGCHLD, arg, ptid) }
    })?;
    if pid < 0 {
        return Err(SysError::last("clone", "CLONE_VM child"));
    }
    Ok(pid)
}

/// Runs `f` with this thread's effective uid at `owner` (the owner of the
/// user namespace a clone in `f` makes), then back at root's; with
/// `fs_root`, its fsuid stays root's meanwhile (for file permission checks
/// the kernel makes in the clone). Raw syscalls: glibc's wrappers would
/// change every thread; real and saved uids stay 0. `f`'s own failure is
/// its value's to report: the calls after it succeed or return an error of
/// their own, so errno is still `f`'s when this returns `Ok`.
fn as_owner<T>(owner: u32, fs_root: bool, f: impl FnOnce() -> T) -> Result<T, SysError> {
    if owner == 0 {
        return Ok(f());
    }
    let keep = -1 as libc::c_int;
    // SAFETY: setresuid of this thread's effective uid only.
    if unsafe { libc::syscall(libc::SYS_setresuid, keep, owner as libc::c_uint, keep) } < 0 {
        return Err(SysError::last("seteuid", owner.to_string()));
    }
    // SAFETY: setfsuid of this thread only, to its real uid (0).
    if fs_root && unsafe { libc::syscall(libc::SYS_setfsuid, 0 as libc::c_uint) } < 0 {
        return Err(SysError::last("setfsuid", "0"));
    }
    let value = f();
    // SAFETY: as above; back to effective root (the saved uid is 0), which
    // sets the fsuid back to 0 too.
    if unsafe { libc::syscall(libc::SYS_setresuid, keep, 0 as libc::c_uint, keep) } < 0 {
        return Err(SysError::last("seteuid", "0"));
    }
    Ok(value)
}

/// `clone3`'s arguments (`struct clone_args`, linux/sched.h), up to `cgroup`.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `CLONE_INTO_CGROUP` (Linux 5.7): the child starts in the cgroup `cgroup` names.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `clone3(args, size)`; the child, on the stack `args` names, calls
/// `entry(arg)` and exits with its value. Returns the child's pid, or
/// `-errno`. In assembly: after a `clone3` that switches stacks, the child
/// must not touch the parent's frame, which a Rust body would.
///
/// # Safety
/// As [`clone_vm`]; `args` must name a stack of this process, 16-byte
/// aligned at its top.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
unsafe extern "C" fn clone3_on_stack(
    args: *mut CloneArgs,
    size: usize,
    entry: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    arg: *mut libc::c_void,
) -> libc::c_long {
    // rdi = args, rsi = size (clone3's own), rdx = entry, rcx = arg. The
    // syscall clobbers rcx and r11 only: entry and arg ride in r8 and r9.
    core::arch::naked_asm!(
        "mov r8, rdx",
        "mov r9, rcx",
        "mov eax, 435", // SYS_clone3
        "syscall",
        "test rax, rax",
        "jnz 2f",
        // The child, on its new stack (16-byte aligned: `call` leaves the
        // callee the usual 8 below it).
        "xor ebp, ebp",
        "mov rdi, r9",
        "call r8",
        "mov edi, eax",
        "mov eax, 60", // SYS_exit: this thread only, as a clone child's return
        "syscall",
        "ud2",
        "2:",
        "ret",
    )
}

/// [`clone_vm`] with `CLONE_INTO_CGROUP`: the child is born in the cgroup
/// whose directory `cgroup` is, and no one moves it there after (a move
/// takes the kernel's global threadgroup lock, an RCU grace period when
/// idle). `Ok(None)`, nothing done, where `clone3` or `CLONE_INTO_CGROUP`
/// is missing (a kernel before 5.7, another architecture): the caller
/// clones with [`clone_vm`] and moves the child. `cgroup` must be a cgroup
/// v2 directory (`Cgroups::open_dir` gives one only there).
///
/// # Safety
/// As [`clone_vm`].
pub(crate) unsafe fn clone_vm_into(
    flags: libc::c_int,
    owner: u32,
    stack: &Stack,
    entry: extern "C" fn(*mut libc::c_void) -> libc::c_int,
    arg: *mut libc::c_void,
    pidfd: &mut RawFd,
    cgroup: RawFd,
) -> Result<Option<i32>, SysError> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut args = CloneArgs {
            flags: (flags as u32 as u64) | libc::CLONE_VM as u64 | libc::CLONE_PIDFD as u64 | CLONE_INTO_CGROUP,
            pidfd: pidfd as *mut RawFd as u64,
            exit_signal: libc::SIGCHLD as u64,
            stack: stack.base as u64,
            stack_size: stack.len as u64,
            cgroup: cgroup as u64,
            ..CloneArgs::default()
        };
        // The kernel checks the move into the cgroup as a write of its
        // `cgroup.procs` by this thread's fsuid: root's (the real uid), while
        // the euid alone owns the new user namespace. The child's own
        // setresuid in it resets its fsuid before it touches a file.
        let ret = as_owner(owner, true, || {
            // SAFETY: `args` is a live clone_args of the size given; the
            // child runs `entry(arg)` on `stack` (the caller upholds
            // clone_vm's rules) and exits; the kernel stores the pidfd
            // through `args.pidfd`.
            unsafe { clone3_on_stack(&mut args, std::mem::size_of::<CloneArgs>(), entry, arg) }
        })?;
        match ret {
            pid if pid > 0 => Ok(Some(pid as i32)),
            e if [libc::ENOSYS, libc::E2BIG, libc::EOPNOTSUPP].contains(&(-e as i32)) => Ok(None),
            e => Err(SysError::new(
                "clone3",
                "CLONE_VM child into its cgroup",
                std::io::Error::from_raw_os_error(-e as i32),
            )),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (flags, owner, stack, entry, arg, pidfd, cgroup);
        Ok(None)
    }
}
