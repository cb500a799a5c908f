//! A mount injected into a running process's mount namespace is attached by
//! a thread of the caller, not a forked copy of it: a fork of the daemon
//! copied its page tables and left every page of its memory copy-on-write,
//! so each page it wrote next faulted once more. Needs root.
use std::path::PathBuf;
use std::time::{Duration, Instant};

const PAGES: usize = 16 << 10;

/// Minor faults of the calling thread so far.
fn minor_faults() -> i64 {
    // SAFETY: getrusage fills one live struct.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut u), 0);
        u.ru_minflt
    }
}

fn touch(buf: &mut [u8], v: u8) {
    for p in buf.chunks_mut(4096) {
        p[0] = v;
    }
}

#[test]
fn an_injected_mount_leaves_the_callers_memory_as_it_was() {
    let dir = PathBuf::from(format!("/tmp/ember-inject-thread-{}", std::process::id()));
    let (src, target) = (dir.join("src"), dir.join("target"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("f"), b"seen").unwrap();
    // A process in a mount namespace of its own.
    let mut child = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sleep", "60"])
        .spawn()
        .expect("unshare");
    let pid = child.id() as i32;
    let ours = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok().is_none_or(|ns| ns == ours) {
        assert!(Instant::now() < deadline, "unshare never entered its namespace");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));

    // 64 MiB of this thread's memory, in small pages, each written once.
    let mut buf = vec![0u8; PAGES * 4096];
    // SAFETY: advice on the buffer's own pages.
    unsafe { libc::madvise(buf.as_mut_ptr().cast(), buf.len(), libc::MADV_NOHUGEPAGE) };
    touch(&mut buf, 1);

    let res = ember_sys::inject::inject_mount(pid, &src, target.to_str().unwrap(), false, (0, 0), None);
    let before = minor_faults();
    touch(&mut buf, 2);
    let faults = minor_faults() - before;
    let seen = std::fs::read(format!("/proc/{pid}/root{}/f", target.display()));
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);

    res.expect("inject");
    assert_eq!(seen.expect("the file through the mount").as_slice(), b"seen", "mounted in the process's namespace");
    assert!(
        faults < (PAGES / 4) as i64,
        "{faults} faults writing {PAGES} pages after the inject: they were copy-on-write"
    );
}
