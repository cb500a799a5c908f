//! Looking for the host from inside: `/proc` and `/sys` probing, and the
//! privileged syscalls (mount, unshare, ptrace, modules, keyctl, bpf, raw
//! sockets) as the default user and as root inside.
use crate::harness::{Arena, Limits};
use crate::per_class;
use std::process::{Command, Stdio};

/// A host process whose argv and environment carry a marker the sandbox must
/// never see; killed on drop.
struct HostMarker(std::process::Child, String);

impl HostMarker {
    fn start() -> HostMarker {
        let marker = format!("host-secret-{}", std::process::id());
        let child = Command::new("sh")
            .args(["-c", &format!("sleep 300; : {marker}")])
            .env("EMBER_HOSTILE_MARKER", &marker)
            .stdout(Stdio::null())
            .spawn()
            .expect("host marker process");
        HostMarker(child, marker)
    }
}

impl Drop for HostMarker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn proc_and_sys_probing(class: &'static str) {
    let a = Arena::new(class).await;
    let marker = HostMarker::start();
    let s = a.attacker(Limits::default()).await;
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("host name");
    let host_pid = std::process::id();
    for uid in [None, Some(0)] {
        // Host processes: no marker in any visible cmdline or environ, few
        // processes, none with the test runner's pid and name.
        let (_, out, _) =
            a.d.sh(
                &s.id,
                &format!(
                    // The marker goes through a file, in two parts: neither this
                    // shell's argv nor grep's may hold it whole.
                    "printf %s host-secret- > /tmp/.m; printf %s {m} >> /tmp/.m; grep -lasf /tmp/.m /proc/[0-9]*/cmdline /proc/[0-9]*/environ; \
                     set -- /proc/[0-9]*; echo procs=$#; \
                     cat /proc/{host_pid}/comm 2>/dev/null; hostname; cat /proc/sys/kernel/hostname; uname -n",
                    m = marker.1.trim_start_matches("host-secret-")
                ),
                uid,
            )
            .await;
        assert!(!out.contains("/proc/"), "{class} as {uid:?}: a host process is visible: {out}");
        let procs: usize =
            out.lines().find_map(|l| l.strip_prefix("procs=")).and_then(|n| n.parse().ok()).unwrap_or(999);
        assert!(procs < 10, "{class}: {procs} processes visible: {out}");
        let names: Vec<&str> = out.lines().filter(|l| !l.starts_with("procs=")).collect();
        assert_eq!(names.len(), 3, "{class}: {out}");
        for n in names {
            assert_eq!(n, format!("sbx-{}", &s.id[..12]), "{class}: host name {host_name:?} vs {out}");
        }
        // Host mounts: the host's own mount points are not in the sandbox's table.
        let (_, mi, _) = a.d.sh(&s.id, "cat /proc/self/mountinfo", uid).await;
        for host_only in ["/sys/fs/cgroup/hugetlb", " /work ", " /boot "] {
            assert!(!mi.contains(host_only), "{class}: host mount {host_only} visible:\n{mi}");
        }
        // Masked kernel information reads as empty or fails.
        let (_, masked, _) = a
            .d
            .sh(&s.id, "for f in /proc/kcore /proc/keys /proc/timer_list /proc/sched_debug; do head -c 64 $f 2>/dev/null; done; echo end", uid)
            .await;
        assert_eq!(masked, "end\n", "{class}: masked /proc files readable: {masked:?}");
        // Kernel knobs are read-only, even for root inside.
        let (code, _, _) =
            a.d.sh(&s.id, "echo 1 > /proc/sys/kernel/sysrq || echo 1 > /proc/sys/vm/drop_caches", uid).await;
        assert_ne!(code, Some(0), "{class}: a /proc/sys knob was writable as {uid:?}");
        let (code, _, _) = a.d.sh(&s.id, "echo h > /proc/sysrq-trigger", uid).await;
        assert_ne!(code, Some(0), "{class}: sysrq-trigger was writable as {uid:?}");
        // /sys, where it is mounted: only the sandbox's loopback, no writable knob.
        let (_, nets, _) = a.d.sh(&s.id, "ls /sys/class/net 2>/dev/null", uid).await;
        assert!(nets.split_whitespace().all(|n| n == "lo"), "{class}: /sys shows host interfaces: {nets}");
        let (code, _, _) = a.d.sh(&s.id, "echo 1 > /sys/kernel/mm/ksm/run", uid).await;
        assert_ne!(code, Some(0), "{class}: a /sys knob was writable as {uid:?}");
    }
    // The kernel command line: the host's on a shared kernel (as in any
    // container runtime; ember documents that it is not a place for secrets),
    // gVisor's own under runsc.
    let host_cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let (_, cmdline, _) = a.d.sh(&s.id, "cat /proc/cmdline", None).await;
    assert_eq!(cmdline.trim() == host_cmdline.trim(), class != "runsc", "{class}: /proc/cmdline {cmdline:?}");
    drop(marker);
    a.assert_unaffected().await;
    a.remove(&s.id).await;
}
per_class!(proc_and_sys_probing);

async fn privileged_syscalls(class: &'static str) {
    let a = Arena::new(class).await;
    let s = a.attacker(Limits::default()).await;
    let host_pid = std::process::id();
    // A raw syscall printing "ok" or its errno: garbage arguments fail anyway,
    // so what is checked is *why* (EPERM from seccomp or a missing capability,
    // ENOSYS where gVisor does not implement it), not just that it failed.
    let p = |nr: u32, args: &str| format!("perl -e '$r = syscall({nr}, {args}); print $r == -1 ? $! + 0 : \"ok\"'");
    const EPERM_ENOSYS: &[&str] = &["1", "38"];
    let syscalls = [
        (p(101, &format!("16, {host_pid}, 0, 0")), "ptrace attach to a host pid", &["1", "3", "38"][..]),
        (p(101, "16, 1, 0, 0"), "ptrace attach to the agent", EPERM_ENOSYS),
        (p(250, "0, -3, 0, 0"), "keyctl", EPERM_ENOSYS),
        (p(248, "0, 0, 0, 0, -4"), "add_key", EPERM_ENOSYS),
        (p(321, "0, 0, 0"), "bpf", EPERM_ENOSYS),
        (p(313, "0, 0, 0"), "finit_module", EPERM_ENOSYS),
        (p(175, "0, 0, 0"), "init_module", EPERM_ENOSYS),
        (p(169, "0xfee1dead, 672274793, 0x4321fedc, 0"), "reboot", EPERM_ENOSYS),
        (p(298, "0, 0, -1, -1, 0"), "perf_event_open", &["1", "13", "38"][..]),
        (p(272, "0x20000"), "unshare(CLONE_NEWNS)", EPERM_ENOSYS),
        // A bare MS_BIND, which gVisor's filter lets through for the workspace
        // attach: its kernel must still refuse it for want of CAP_SYS_ADMIN.
        (p(165, "($s = \"/tmp\"), ($t = \"/mnt\"), 0, 4096, 0"), "mount(MS_BIND)", &["1"][..]),
    ];
    let commands = [
        ("mount -t tmpfs none /mnt", "mount"),
        ("mount --bind /tmp /mnt", "bind mount"),
        ("unshare -U -r true", "unshare user"),
        ("unshare -m true", "unshare mount"),
        ("unshare -n true", "unshare net"),
        ("perl -e 'socket(S, 2, 3, 1) or exit 1'", "raw IPv4 socket"),
        ("perl -e 'socket(S, 17, 3, 768) or exit 1'", "packet socket"),
    ];
    for uid in [None, Some(0)] {
        for (cmd, what, allowed) in &syscalls {
            let (code, out, err) = a.d.sh(&s.id, cmd, uid).await;
            assert_eq!(code, Some(0), "{class}: {what}: perl failed: {err}");
            assert!(allowed.contains(&out.trim()), "{class}: {what} as {uid:?}: {out:?} (errno allowed: {allowed:?})");
        }
        for (cmd, what) in &commands {
            let (code, out, err) = a.d.sh(&s.id, cmd, uid).await;
            assert!(code.is_some(), "{class}: {what}: no exit code");
            assert_ne!(code, Some(0), "{class}: {what} succeeded as {uid:?}: {out}{err}");
        }
    }
    // The probes do succeed where the syscall is allowed, so they can fail.
    let (code, _, _) = a.d.sh(&s.id, "perl -e 'socket(S, 2, 1, 0) or exit 1'", None).await;
    assert_eq!(code, Some(0), "{class}: a TCP socket is allowed");
    let (_, out, _) = a.d.sh(&s.id, &p(39, "0"), None).await;
    assert_eq!(out, "ok\n", "{class}: getpid through the same perl probe");
    a.assert_unaffected().await;
    a.remove(&s.id).await;
}
per_class!(privileged_syscalls);
