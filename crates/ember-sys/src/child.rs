//! The code that runs in the cloned child between clone and exec.
//!
//! It runs in the memory of a multi-threaded process (`CLONE_VM`,
//! vmclone.rs), so it only makes raw system calls on data the parent
//! prepared: no allocation, no locks, no panics, no writes but to its stack. Any
//! failure is reported as `(step, errno)` on the error pipe, then `_exit(127)`.
use crate::spawn::{ChildFds, ExecArgs, FsOp, LaunchPlan};
use std::ffi::CStr;

const STEPS: &[&str] = &[
    "wait for parent",
    "setgroups/setresgid/setresuid",
    "sethostname",
    "make mounts private",
    "mount",
    "bind read-only",
    "bind",
    "mkdir",
    "symlink",
    "write file",
    "chown",
    "pivot_root",
    "bring up lo",
    "unshare cgroup namespace",
    "drop capabilities",
    "set up stdio",
    "seccomp",
    "exec agent",
    "attach idmapped mount",
    "close inherited descriptors",
    "set RLIMIT_NOFILE",
    "enter its cpu cgroup",
];

pub(crate) fn step_name(step: u32) -> &'static str {
    STEPS.get(step as usize).copied().unwrap_or("unknown")
}

fn fail(fds: &ChildFds, step: usize) -> ! {
    // SAFETY: __errno_location returns this thread's errno slot.
    let errno = unsafe { *libc::__errno_location() };
    let mut buf = [0u8; 8];
    buf[..4].copy_from_slice(&(step as u32).to_ne_bytes());
    buf[4..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: writes 8 bytes from a live stack buffer; then exits without running
    // any of the parent's destructors or atexit handlers.
    unsafe {
        libc::write(fds.err_w, buf.as_ptr().cast(), 8);
        libc::_exit(127)
    }
}

macro_rules! check {
    ($fds:expr, $step:expr, $e:expr) => {
        if ($e) < 0 {
            fail($fds, $step)
        }
    };
}

fn opt_ptr(c: &Option<std::ffi::CString>) -> *const libc::c_char {
    c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
}

pub(crate) fn child_main(plan: &LaunchPlan, fds: &ChildFds, args: &ExecArgs) -> ! {
    // SAFETY: every call below is a raw syscall on descriptors and C strings the
    // parent prepared and keeps alive (this is a fork-style copy of its memory).
    unsafe {
        close_inherited(fds, &args.keep_fds);
        let mut b = [0u8; 1];
        if libc::read(fds.sync_r, b.as_mut_ptr().cast(), 1) != 1 {
            libc::_exit(127);
        }
        libc::close(fds.sync_r);
        // Raw syscalls, not glibc's wrappers: glibc broadcasts credential
        // changes to every thread it knows of (setxid), taking a lock that a
        // parent thread may have held at clone time. This copy has one thread.
        check!(fds, 1, libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()));
        check!(fds, 1, libc::syscall(libc::SYS_setresgid, 0, 0, 0));
        check!(fds, 1, libc::syscall(libc::SYS_setresuid, 0, 0, 0));
        let files = libc::rlimit64 { rlim_cur: plan.open_files, rlim_max: plan.open_files };
        check!(
            fds,
            20,
            libc::syscall(libc::SYS_prlimit64, 0, libc::RLIMIT_NOFILE, &files, std::ptr::null_mut::<libc::rlimit64>())
        );
        let h = plan.hostname.as_bytes();
        check!(fds, 2, libc::sethostname(h.as_ptr().cast(), h.len()));
        check!(
            fds,
            3,
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null()
            )
        );
        for op in &plan.fs_ops {
            run_fs_op(fds, op);
        }
        pivot(fds, &plan.new_root);
        if args.lo_up {
            lo_up(fds);
        }
        // Born out of its cpu cgroup (a launch out of a lowered group,
        // `SpawnFrom::cpu_tasks`): in now, its setup done, before the
        // cgroup namespace is rooted at its cgroups. Its own thread moves
        // (`0`): the kernel takes no threadgroup lock for that.
        if fds.cpu_tasks >= 0 {
            if libc::write(fds.cpu_tasks, b"0".as_ptr().cast(), 1) != 1 {
                fail(fds, 21);
            }
            libc::close(fds.cpu_tasks);
        }
        check!(fds, 13, libc::unshare(libc::CLONE_NEWCGROUP));
        drop_caps(fds, plan.keep_caps, args.cap_last);
        stdio(fds);
        for prog in &plan.seccomp {
            if seccompiler::apply_filter(prog).is_err() {
                fail(fds, 16);
            }
        }
        // The mask the spawning thread had before it blocked every signal
        // for the clone (vmclone.rs); exec keeps a mask.
        libc::pthread_sigmask(libc::SIG_SETMASK, &args.sigmask, std::ptr::null_mut());
        libc::syscall(
            libc::SYS_execveat,
            fds.exe,
            c"".as_ptr(),
            args.argv.as_ptr(),
            args.envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
        fail(fds, 17)
    }
}

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// SAFETY (caller): runs in the cloned child; `op` lives in the parent's copied memory.
unsafe fn run_fs_op(fds: &ChildFds, op: &FsOp) {
    // SAFETY: raw syscalls on NUL-terminated strings owned by `op`.
    unsafe {
        match op {
            FsOp::Mount { source, target, fstype, flags, data } => check!(
                fds,
                4,
                libc::mount(
                    opt_ptr(source),
                    target.as_ptr(),
                    opt_ptr(fstype),
                    *flags as libc::c_ulong,
                    opt_ptr(data).cast()
                )
            ),
            FsOp::BindReadOnly { source, target } => {
                check!(
                    fds,
                    5,
                    libc::mount(
                        source.as_ptr(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REC,
                        std::ptr::null()
                    )
                );
                let attr = MountAttr {
                    attr_set: 0x1 | 0x2 | 0x4, // MOUNT_ATTR_RDONLY | NOSUID | NODEV
                    attr_clr: 0,
                    propagation: 0,
                    userns_fd: 0,
                };
                check!(
                    fds,
                    5,
                    libc::syscall(
                        libc::SYS_mount_setattr,
                        libc::AT_FDCWD,
                        target.as_ptr(),
                        libc::AT_RECURSIVE,
                        &attr as *const MountAttr,
                        std::mem::size_of::<MountAttr>()
                    )
                );
            }
            FsOp::Bind { source, target } => check!(
                fds,
                6,
                libc::mount(source.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null())
            ),
            FsOp::Mkdir { path, mode } => {
                if libc::mkdir(path.as_ptr(), *mode) < 0 && *libc::__errno_location() != libc::EEXIST {
                    fail(fds, 7)
                }
            }
            FsOp::Symlink { target, link } => check!(fds, 8, libc::symlink(target.as_ptr(), link.as_ptr())),
            FsOp::WriteFile { path, contents, mode } => write_file(fds, path, contents, *mode),
            FsOp::Chown { path, uid, gid } => check!(fds, 10, libc::lchown(path.as_ptr(), *uid, *gid)),
            FsOp::Attach { tree, target } => check!(
                fds,
                18,
                libc::syscall(
                    libc::SYS_move_mount,
                    *tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    target.as_ptr(),
                    0x4 as libc::c_uint // MOVE_MOUNT_F_EMPTY_PATH
                )
            ),
        }
    }
}

unsafe fn write_file(fds: &ChildFds, path: &CStr, contents: &[u8], mode: u32) {
    // SAFETY: open/write/close on a path and a buffer owned by the plan.
    unsafe {
        let fd = libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            mode,
        );
        check!(fds, 9, fd);
        let mut off = 0;
        while off < contents.len() {
            let n = libc::write(fd, contents[off..].as_ptr().cast(), contents.len() - off);
            check!(fds, 9, n);
            off += n as usize;
        }
        libc::close(fd);
    }
}

/// pivot_root(".", "."): stacks the old root on top of the new one and detaches
/// it, so no directory for the old root is needed in the sandbox tree.
unsafe fn pivot(fds: &ChildFds, new_root: &CStr) {
    // SAFETY: chdir/pivot_root/umount2 on C strings owned by the plan.
    unsafe {
        check!(fds, 11, libc::chdir(new_root.as_ptr()));
        check!(fds, 11, libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()));
        check!(fds, 11, libc::umount2(c".".as_ptr(), libc::MNT_DETACH));
        check!(fds, 11, libc::chdir(c"/".as_ptr()));
    }
}

unsafe fn lo_up(fds: &ChildFds) {
    // SAFETY: ifreq is plain data; the ioctls read and write that one struct.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        check!(fds, 12, s);
        let mut ifr: libc::ifreq = std::mem::zeroed();
        ifr.ifr_name[0] = b'l' as libc::c_char;
        ifr.ifr_name[1] = b'o' as libc::c_char;
        check!(fds, 12, libc::ioctl(s, libc::SIOCGIFFLAGS, &mut ifr));
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        check!(fds, 12, libc::ioctl(s, libc::SIOCSIFFLAGS, &mut ifr));
        libc::close(s);
    }
}

unsafe fn drop_caps(fds: &ChildFds, keep: u64, last: u32) {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        for cap in 0..=last.min(63) {
            if keep & (1u64 << cap) == 0 {
                check!(fds, 14, libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0));
            }
        }
        check!(fds, 14, libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0));
    }
}

/// Closes every descriptor from 3 up but `keep` (ascending), before
/// the child blocks on its sync pipe. Without `CLONE_FILES` the clone copied
/// the daemon's whole table, close-on-exec or not, including the pipe ends of
/// launches in flight on other threads: a child holding another launch's sync
/// write end keeps that launch's init from seeing EOF when the daemon dies
/// (two inits each holding the other's were left blocked forever by a daemon
/// killed mid-launch), and one holding its error write end delays that
/// launch's exec report until this child execs. 0-2 stay until `stdio`
/// replaces them.
unsafe fn close_inherited(fds: &ChildFds, keep: &[libc::c_int]) {
    let mut from = 3u32;
    // SAFETY: close_range on this process's own table; `keep` was built by
    // the parent and is only read.
    unsafe {
        for &k in keep {
            let k = k as u32;
            if k > from {
                check!(fds, 19, libc::syscall(libc::SYS_close_range, from, k - 1, 0u32));
            }
            from = from.max(k + 1);
        }
        check!(fds, 19, libc::syscall(libc::SYS_close_range, from, u32::MAX, 0u32));
    }
}

/// fd 0 = /dev/null, 1 and 2 = the agent log, 3 = the listening socket; every
/// other descriptor is marked close-on-exec.
unsafe fn stdio(fds: &ChildFds) {
    // SAFETY: open/dup2/close_range on descriptors this process owns.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        check!(fds, 15, null);
        check!(fds, 15, libc::dup2(null, 0));
        check!(fds, 15, libc::dup2(fds.log, 1));
        check!(fds, 15, libc::dup2(fds.log, 2));
        check!(fds, 15, libc::dup2(fds.listen, 3));
        check!(fds, 15, libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC));
    }
}
