//! `ember uninstall`: after a daemon and its sandboxes were SIGKILLed (what a
//! crash or `kill -9` leaves: mounts, cgroups, an OCI container's state, the
//! egress network's table, namespaces and resolver address), it removes all
//! of it, and it refuses to run while a daemon holds the data dir.
mod common;

use common::Daemon;
use ember_types::api::WorkspaceMountSpec;
use std::path::Path;
use std::process::Command;

fn uninstall(d: &Daemon, tag: &str, range: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .arg("uninstall")
        .arg("--data-dir")
        .arg(&d.data_dir)
        .args(["--cgroup-parent", &d.group, "--network-tag", tag, "--network-range", range])
        .output()
        .expect("ember uninstall runs")
}

/// Everything of this daemon the host still has.
fn left_on_host(d: &Daemon, tag: &str, resolver: &str) -> Vec<String> {
    let mut left = Vec::new();
    let data = d.data_dir.to_string_lossy().into_owned();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    left.extend(mountinfo.lines().filter(|l| l.contains(&data)).map(|l| format!("mount: {l}")));
    for h in std::fs::read_dir("/sys/fs/cgroup").expect("cgroup fs").flatten() {
        for e in std::fs::read_dir(h.path()).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&d.group) {
                left.push(format!("cgroup: {}", e.path().display()));
            }
        }
    }
    if Path::new("/sys/fs/cgroup").join(&d.group).exists() {
        left.push(format!("cgroup: /sys/fs/cgroup/{}", d.group));
    }
    for dir in ["/run/netns", "/sys/class/net"] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&format!("{tag}-")) {
                left.push(format!("netns or link: {}", e.path().display()));
            }
        }
    }
    if Command::new("nft").args(["list", "table", "inet", tag]).output().expect("nft").status.success() {
        left.push(format!("nft table inet {tag}"));
    }
    let lo = Command::new("ip").args(["-4", "-o", "addr", "show", "dev", "lo"]).output().expect("ip");
    if String::from_utf8_lossy(&lo.stdout).contains(&format!(" {resolver}/32 ")) {
        left.push(format!("{resolver}/32 on lo"));
    }
    for p in std::fs::read_dir("/proc").expect("proc").flatten() {
        let cg = std::fs::read_to_string(p.path().join("cgroup")).unwrap_or_default();
        let cmd = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let status = std::fs::read_to_string(p.path().join("status")).unwrap_or_default();
        // A killed sandbox process reparented to the host's init is a zombie
        // until init reaps it: it holds nothing but its pid, and is not ours to reap.
        let zombie = status.lines().any(|l| l.starts_with("State:") && l.contains("zombie"));
        if !zombie && (cg.contains(&format!("/{}", d.group)) || String::from_utf8_lossy(&cmd).contains(&data)) {
            left.push(format!("process {} ({})", p.file_name().to_string_lossy(), String::from_utf8_lossy(&cmd)));
        }
    }
    if d.data_dir.exists() {
        left.push(format!("data dir {}", d.data_dir.display()));
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_removes_what_a_killed_daemon_and_its_sandboxes_left() {
    let pid = std::process::id() % 100_000;
    let (tag, range) = (format!("u{pid}"), format!("10.215.{}.0/24", pid % 250));
    let group = (9000 + pid % 400).to_string();
    let resolver = ember_net::AddrPlan::parse(&range).expect("range").resolver().to_string();
    let flags = [
        ("--network-range", range.as_str()),
        ("--network-tag", &tag),
        ("--nflog-group", &group),
        ("--dns-upstream", "127.0.0.1:53"),
        ("--network-slots", "1"),
    ];
    let mut d = Daemon::start_with(&flags.iter().flat_map(|(k, v)| [*k, *v]).collect::<Vec<_>>());
    d.client.create_workspace("ws", "16Mi").await.expect("workspace");
    let native = d
        .create(|r| {
            r.network = Some("egress".into());
            r.workspaces = vec![WorkspaceMountSpec { name: "ws".into(), ..Default::default() }];
        })
        .await;
    let crun = d.create(|r| r.runtime_class = Some("crun".into())).await;
    assert!(!d.procs(&native.id).is_empty(), "the native sandbox runs");

    let refused = uninstall(&d, &tag, &range);
    assert!(!refused.status.success(), "uninstall ran beside a live daemon");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("in use"), "{refused:?}");
    assert!(d.data_dir.exists() && !d.procs(&native.id).is_empty(), "a refused uninstall removed something");

    // What a crash leaves: the daemon and every sandbox process SIGKILLed.
    d.kill9();
    let crun_cg = ember_cgroups::detect("/sys/fs/cgroup".as_ref(), &format!("{}-crun", d.group)).expect("cgroups");
    let pids = [d.procs(&native.id), crun_cg.procs(&crun.id).unwrap_or_default()].concat();
    assert!(pids.len() >= 2, "sandbox processes: {pids:?}");
    for p in &pids {
        let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
    }
    assert!(!left_on_host(&d, &tag, &resolver).is_empty(), "nothing was left to remove: the test proves nothing");

    let out = uninstall(&d, &tag, &range);
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    let left = left_on_host(&d, &tag, &resolver);
    assert!(left.is_empty(), "left after ember uninstall:\n{}\nit said:\n{said}", left.join("\n"));
}
