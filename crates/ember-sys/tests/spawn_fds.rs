//! A sandbox init held between clone and release keeps none of the daemon's
//! descriptors but its own. Its clone copied the daemon's whole table, which
//! includes the pipe ends of launches in flight on other threads: a daemon
//! SIGKILLed during two launches once left both inits blocked forever, each
//! holding the write end of the other's sync pipe. Needs root.
use ember_sys::spawn::{spawn_sandbox_from, LaunchFds, LaunchPlan, SpawnError, SpawnFrom};
use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

fn plan() -> LaunchPlan {
    let c = |s: &str| CString::new(s).unwrap();
    LaunchPlan {
        hostname: c("fds"),
        fs_ops: Vec::new(),
        new_root: c("/nonexistent"),
        keep_caps: 0,
        seccomp: Vec::new(),
        argv: vec![c("/bin/true")],
        env: Vec::new(),
        uid_map: "0 1900000000 65536\n".into(),
        gid_map: "0 1900000000 65536\n".into(),
        ns_owner: 1_900_000_000,
        exec_timeout: Duration::from_secs(10),
        open_files: 1024,
    }
}

/// Whether `r` reaches EOF within `within` (it cannot while any process
/// holds the write end).
fn eof_within(r: &std::io::PipeReader, within: Duration) -> bool {
    let mut pfd = libc::pollfd { fd: r.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one live pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, within.as_millis() as i32) };
    n == 1 && (&*r).read(&mut [0u8; 1]).ok() == Some(0)
}

#[test]
fn a_held_sandbox_init_keeps_no_descriptor_of_another_launch() {
    // Stands for another launch's sync pipe: close-on-exec, open in the
    // daemon when this launch clones.
    let (other_r, other_w) = std::io::pipe().expect("pipe");
    let exe = std::fs::File::open("/bin/true").expect("/bin/true");
    let null = std::fs::File::options().read(true).write(true).open("/dev/null").expect("/dev/null");
    let fds = LaunchFds { exe: exe.as_fd(), listen: null.as_fd(), log: null.as_fd() };
    let res = spawn_sandbox_from(SpawnFrom::default(), &plan(), fds, move |pid, _| {
        // The other launch's write end goes away in the daemon; only a copy
        // in this child can keep it open now.
        drop(other_w);
        let eof = eof_within(&other_r, Duration::from_secs(20));
        let held = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>())
            .unwrap_or_default();
        // Abort the launch: the test is about the time before the release.
        Err(format!("eof={eof} child fds={held:?}"))
    });
    match res {
        Err(SpawnError::ParentSetup { message, .. }) => {
            assert!(message.starts_with("eof=true"), "the held child kept the other launch's pipe open: {message}")
        }
        other => panic!("expected the test's own abort, got {other:?}"),
    }
}
