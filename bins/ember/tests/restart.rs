//! `kill -9` of the daemon, then a restart on the same data dir: running
//! sandboxes are re-adopted, dead ones are reaped with a reason, expiries that
//! passed while it was down are applied, and resources without a record go.
mod common;

use common::Daemon;
use ember_cgroups::Limits;
use std::time::Duration;

fn kill9(pid: i32) {
    let ok = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill runs");
    assert!(ok.success(), "kill -9 {pid}");
}

/// The filesystem types mounted at `<data>/sandboxes`, in mount order.
fn sandbox_dir_mounts(d: &Daemon) -> Vec<String> {
    let at = d.data_dir.join("sandboxes").canonicalize().expect("sandboxes dir");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    mountinfo
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| std::path::Path::new(m) == at))
        .filter_map(|l| l.split(" - ").nth(1)?.split(' ').next().map(String::from))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_of_the_daemon_then_restart_converges() {
    let mut d = Daemon::start();
    let keep = d.create(|r| r.metadata = Some([("owner".to_string(), "t".to_string())].into())).await;
    let doomed = d.create(|_| {}).await;
    let expiring = d.create(|r| r.timeout = Some(2)).await;
    let (code, _, _) = d.sh(&keep.id, "echo kept > /tmp/marker", None).await;
    assert_eq!(code, Some(0));
    let keep_pids = d.procs(&keep.id);
    // In memory: on a tmpfs of their own, or the data dir's (the v2 guest's).
    let kept_dir = d.data_dir.join("sandboxes").join(&keep.id);
    assert!(ember_sys::fs::is_tmpfs(&kept_dir).expect("statfs"), "the sandbox's host dir is in memory");
    let own: &[&str] = match ember_sys::fs::is_tmpfs(&d.data_dir).expect("statfs") {
        true => &[],
        false => &["tmpfs"],
    };
    assert_eq!(sandbox_dir_mounts(&d), own, "the sandboxes' dirs have a tmpfs of their own");

    d.kill9();
    // While the daemon is down: one sandbox dies, one expires, and an orphan
    // cgroup appears (as if a create crashed before its record was written).
    for p in d.procs(&doomed.id) {
        kill9(p);
    }
    let cg = d.cgroups();
    cg.create("orphan-0001", &Limits { memory_bytes: 64 << 20, cpu_millis: 100, pids: 8 }).expect("orphan cgroup");
    let mut orphan = std::process::Command::new("sleep").arg("600").spawn().expect("sleep");
    cg.attach("orphan-0001", orphan.id() as i32).expect("attach orphan");
    tokio::time::sleep(Duration::from_millis(2500)).await;

    d.spawn();
    assert_eq!(sandbox_dir_mounts(&d), own, "the restart found the tmpfs, and stacked no second one");
    let k = d.client.get_sandbox(&keep.id).await.expect("kept sandbox is known");
    assert_eq!(k.status.state, "Running");
    assert_eq!(k.metadata.get("owner").map(String::as_str), Some("t"), "acknowledged metadata survived");
    assert_eq!(d.procs(&keep.id), keep_pids, "the same processes, not a new sandbox");
    let (code, out, _) = d.sh(&keep.id, "cat /tmp/marker", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "kept\n"));

    let g = d.client.get_sandbox(&doomed.id).await.expect("dead sandbox is still listed");
    assert_eq!((g.status.state.as_str(), g.status.reason.as_deref()), ("Terminated", Some("Killed")));
    assert!(!cg.exists(&doomed.id), "the dead sandbox's cgroup was reaped");
    assert!(!d.data_dir.join("sandboxes").join(&doomed.id).exists());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mountinfo.contains(&doomed.id), "the dead sandbox's writable layer (a host tmpfs) was unmounted");
    assert!(mountinfo.contains(&keep.id), "the live sandbox's writable layer stays mounted");

    let e = d.wait_state(&expiring.id, "Terminated", Duration::from_secs(10)).await;
    assert_eq!(e.status.reason.as_deref(), Some("Expired"));
    assert!(!cg.exists(&expiring.id));

    assert!(!cg.exists("orphan-0001"), "a cgroup with no record was reaped");
    let status = orphan.wait().expect("orphan reaped");
    assert!(!status.success(), "the orphan's process was killed");

    // A second restart finds nothing to change.
    d.kill9();
    d.spawn();
    let list = d.client.list_sandboxes("").await.expect("list");
    assert_eq!(list.len(), 3);
    assert_eq!(d.client.get_sandbox(&keep.id).await.expect("kept").status.state, "Running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_leaves_sandboxes_running_for_the_next_daemon() {
    let mut d = Daemon::start();
    let s = d.create(|_| {}).await;
    d.kill9();
    d.spawn();
    let (code, out, _) = d.sh(&s.id, "echo still-here", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "still-here\n"));
    d.client.delete_sandbox(&s.id).await.expect("delete after restart");
    assert!(!d.cgroups().exists(&s.id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_the_same_data_dir_is_refused_naming_the_first() {
    let d = Daemon::start();
    let sbx = d.create(|_| {}).await;
    let pids = d.procs(&sbx.id);
    let first = d.pid();
    let err = common::serve_refused(&d.data_dir, &d.group);
    assert!(err.contains(&format!("pid {first}")), "the refusal names the holder's pid: {err}");
    assert!(err.contains("--data-dir"), "and says what to change: {err}");
    // It stopped before recovery: the first daemon's sandbox is untouched.
    let s = d.client.get_sandbox(&sbx.id).await.expect("still known");
    assert_eq!(s.status.state, "Running");
    assert_eq!(d.procs(&sbx.id), pids);
}

#[test]
fn a_data_dir_the_sandbox_range_cannot_traverse_is_refused_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let parent = std::env::temp_dir().join(format!("ember-test-private-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&parent);
    std::fs::create_dir(&parent).expect("mkdir");
    // What `mktemp -d` makes.
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    let err = common::serve_refused(&parent.join("data"), &format!("ember-test-private-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&parent);
    assert!(err.contains(&format!("chmod o+x {}", parent.display())), "names the directory and the fix: {err}");
}

/// The record of a create is written twice: Pending before the launch,
/// Running after it. Here the state dir has room for one record page and no
/// more (a 2-page tmpfs, one page taken), so the Pending record fits and the
/// Running one cannot be written: the sandbox is up but unrecorded. The
/// create must fail with a structured 5xx (507: the disk is full) and leave
/// nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_record_cannot_be_written_fails_and_leaves_nothing() {
    let mut d = Daemon::start();
    let probe = d.create(|_| {}).await;
    let state = d.data_dir.join("state/sandboxes");
    let running_len = std::fs::metadata(state.join(format!("{}.json", probe.id))).expect("record").len();
    assert!(running_len < 4096, "a Running record fits one page ({running_len} bytes), so a Pending one does too");
    d.client.delete_sandbox(&probe.id).await.expect("delete probe");
    d.kill9();

    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8k", "tmpfs"])
        .arg(&state)
        .status()
        .expect("mount runs");
    assert!(mounted.success(), "mount a 2-page tmpfs on {}", state.display());
    std::fs::write(state.join("filler"), vec![0u8; 4096]).expect("take one page");
    d.spawn();

    let err = d.client.create_sandbox(&Default::default()).await.expect_err("the create cannot be recorded");
    let listed = d.client.list_sandboxes("").await.expect("list");
    let cgroups = d.cgroups().list().expect("cgroups");
    // Not counted: a removed record's files kept, zeroed, for the next
    // records (`.spare-<n>`, engine store/spares.rs).
    let records: Vec<_> = std::fs::read_dir(&state)
        .expect("state")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| !n.to_string_lossy().starts_with(".spare-"))
        .collect();
    let dirs: Vec<_> = std::fs::read_dir(d.data_dir.join("sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    // Below the sandboxes' dir, which is a tmpfs of its own.
    let sandbox_mounts = format!("{}/", d.data_dir.join("sandboxes").display());
    d.kill9();
    let _ = std::process::Command::new("umount").arg(&state).status();

    match err {
        ember_client::ClientError::Api { status, code, .. } => {
            // The full disk said as such (docs/api/openapi.yaml, InsufficientStorage).
            assert_eq!((status, code.as_str()), (507, "STORE::NO_SPACE"))
        }
        other => panic!("expected a structured API error, got {other}"),
    }
    assert!(listed.is_empty(), "no sandbox is listed: {listed:?}");
    assert!(cgroups.is_empty(), "no cgroup (so no process) is left: {cgroups:?}");
    assert_eq!(records, vec![std::ffi::OsString::from("filler")], "no record is left");
    assert!(dirs.is_empty(), "no sandbox dir is left: {dirs:?}");
    assert!(!mountinfo.contains(&sandbox_mounts), "no writable layer stays mounted");
}
