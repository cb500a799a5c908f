//! Sandbox snapshots (OpenSandbox's snapshot): the writable rootfs layer and
//! the read-write workspaces of a running sandbox, restored as a new sandbox;
//! the refusals; and a daemon killed mid-snapshot.
mod common;

use common::Daemon;
use ember_types::api::{CreateSandboxRequest, WorkspaceMountSpec};
use std::time::Duration;

fn mount(name: &str) -> WorkspaceMountSpec {
    WorkspaceMountSpec { name: name.into(), ..Default::default() }
}

/// A snapshot of sandbox `id` through a client of its own (a fresh
/// connection, not one an earlier call may be closing), in a task.
fn snapshot_in_background(
    d: &Daemon,
    id: &str,
) -> tokio::task::JoinHandle<Result<ember_types::api::SandboxSnapshotInfo, ember_client::ClientError>> {
    let client = ember_client::Client::new(&d.url, None).expect("client");
    let id = id.to_string();
    tokio::spawn(async move { client.snapshot_sandbox(&id, None).await })
}

/// Run as root in the sandbox: a new file (mode, owner), a template file
/// changed, one deleted, a template dir deleted, a template dir replaced
/// (opaque), a symlink, and a file in the workspace.
const WRITE: &str = "set -e; echo fresh > /tmp/new; chmod 640 /tmp/new; chown 1000:1000 /tmp/new; \
    echo 'extra: files' >> /etc/nsswitch.conf; rm /etc/os-release; rmdir /mnt; \
    rm -rf /etc/ssl; mkdir -p /etc/ssl/certs; echo mine > /etc/ssl/certs/mine; \
    ln -s /tmp/new /tmp/link; echo kept > /workspace/data";

const CHECK: &str = "set -e; cat /tmp/new; stat -c '%a %u %g' /tmp/new; tail -n1 /etc/nsswitch.conf; \
    test ! -e /etc/os-release && echo no-os-release; test ! -e /mnt && echo no-mnt; ls /etc/ssl/certs; \
    readlink /tmp/link; cat /workspace/data";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restores_the_rootfs_changes_and_workspaces_into_a_new_sandbox() {
    let d = Daemon::start();
    d.client.create_workspace("ws", "64Mi").await.expect("workspace");
    let src = d.create(|r| r.workspaces = vec![mount("ws")]).await;
    let (code, _, err) = d.sh(&src.id, WRITE, Some(0)).await;
    assert_eq!(code, Some(0), "{err}");

    let snap = d.client.snapshot_sandbox(&src.id, Some("s1")).await.expect("snapshot");
    assert_eq!((snap.status.state.as_str(), snap.name.as_deref()), ("Ready", Some("s1")));
    assert_eq!(snap.sandbox_id, src.id);
    assert_eq!(snap.workspaces.len(), 1);
    // Its workspace part is an ordinary workspace snapshot; its rootfs layer is not listed as one.
    let ws_snaps: Vec<String> = d.client.list_snapshots(None).await.expect("list").into_iter().map(|s| s.id).collect();
    assert_eq!(ws_snaps, vec![snap.workspaces[0].snapshot_id.clone().expect("rw workspace snapshot")]);
    d.client.delete_sandbox(&src.id).await.expect("delete the source");

    let req = CreateSandboxRequest { snapshot_id: Some(snap.id.clone()), ..Default::default() };
    let (restored, _) = d.client.create_sandbox(&req).await.expect("restore");
    assert_eq!(restored.status.state, "Running");
    // OpenSandbox's `snapshotId`: the restore names its snapshot; a plain
    // sandbox omits the key (the server serialises this same type).
    assert_eq!(restored.snapshot_id.as_deref(), Some(snap.id.as_str()));
    let got = d.client.get_sandbox(&restored.id).await.expect("get restored");
    assert_eq!(got.snapshot_id.as_deref(), Some(snap.id.as_str()));
    assert_eq!(src.snapshot_id, None);
    assert!(serde_json::to_value(&src).expect("json").get("snapshotId").is_none());
    let (code, out, err) = d.sh(&restored.id, CHECK, Some(0)).await;
    assert_eq!(code, Some(0), "{out}\n{err}");
    let want = "fresh\n640 1000 1000\nextra: files\nno-os-release\nno-mnt\nmine\n/tmp/new\nkept\n";
    assert_eq!(out, want);
    // The workspace is a new copy at the same path; the original is untouched.
    let ws = &restored.workspaces;
    assert_eq!(ws.len(), 1, "{ws:?}");
    assert_ne!(ws[0].name, "ws");
    assert_eq!(ws[0].mount_path, "/workspace");
    let (_, out, _) = d.sh(&restored.id, "echo changed > /workspace/data; id -u", None).await;
    assert_eq!(out, "1000\n", "the template's user, as in the source");
    let again = d.create(|r| r.workspaces = vec![mount("ws")]).await;
    assert_eq!(d.sh(&again.id, "cat /workspace/data", None).await.1, "kept\n");

    // Listing and filters; delete answers 204 and the snapshot is gone.
    let by_sb = d.client.list_sandbox_snapshots(&format!("sandboxId={}", src.id)).await.expect("list");
    assert_eq!(by_sb.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), vec![snap.id.as_str()]);
    assert!(d.client.list_sandbox_snapshots("name=nope").await.expect("list").is_empty());
    assert!(d.client.list_sandbox_snapshots("state=Failed").await.expect("list").is_empty());
    assert_eq!(d.client.list_sandbox_snapshots("state=Ready&name=s1").await.expect("list").len(), 1);
    d.client.delete_sandbox_snapshot(&snap.id).await.expect("delete");
    let e = d.client.get_sandbox_snapshot(&snap.id).await.expect_err("gone").to_string();
    assert!(e.contains("SNAPSHOT::NOT_FOUND"), "{e}");
    let manifests = d.data_dir.join("snapshots/manifests");
    let left: Vec<_> = std::fs::read_dir(&manifests).expect("manifests").flatten().map(|e| e.file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().contains(&snap.id)), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_of_ended_sandboxes_and_restores_of_unknown_ones_are_refused() {
    let d = Daemon::start();
    // The entrypoint outlives the agent's readiness ping, then ends the sandbox.
    let ended = d.create(|r| r.entrypoint = Some(vec!["sh".into(), "-c".into(), "sleep 0.3".into()])).await;
    d.wait_state(&ended.id, "Terminated", Duration::from_secs(10)).await;
    let e = d.client.snapshot_sandbox(&ended.id, None).await.expect_err("ended").to_string();
    assert!(e.contains("SNAPSHOT::INVALID_SOURCE_STATE"), "{e}");
    let e = d.client.snapshot_sandbox("no-such-sandbox", None).await.expect_err("unknown").to_string();
    assert!(e.contains("SANDBOX::NOT_FOUND"), "{e}");

    let req = CreateSandboxRequest { snapshot_id: Some("no-such-snapshot".into()), ..Default::default() };
    let e = d.client.create_sandbox(&req).await.expect_err("unknown snapshot").to_string();
    assert!(e.contains("SNAPSHOT::NOT_FOUND"), "{e}");
    assert!(d.client.list_sandbox_snapshots("").await.expect("list").is_empty(), "no record was left");
}

/// A snapshot takes a freeze of its own: a sandbox its user paused is
/// snapshotted and stays paused after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_is_snapshotted_and_stays_paused() {
    let d = Daemon::start();
    let s = d.create(|_| {}).await;
    assert_eq!(d.sh(&s.id, "echo kept > /tmp/k", None).await.0, Some(0));
    d.client.pause_sandbox(&s.id).await.expect("pause");
    let snap = d.client.snapshot_sandbox(&s.id, None).await.expect("a paused sandbox snapshots");
    assert_eq!(snap.status.state, "Ready");
    assert_eq!(
        d.client.get_sandbox(&s.id).await.expect("get").status.state,
        "Paused",
        "the snapshot's thaw undid the pause"
    );
    d.client.resume_sandbox(&s.id).await.expect("resume");
    assert_eq!(d.sh(&s.id, "cat /tmp/k", None).await.1, "kept\n");
}

/// The freeze a snapshot holds and the user's pause compose: the user cannot
/// resume (thaw) a writer the snapshot froze, and a pause the user asks for
/// while the snapshot runs outlives the snapshot's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_resume_cannot_thaw_a_snapshot_and_a_pause_outlives_it() {
    let d = Daemon::start();
    let s = d.big_writer("").await;
    let task = snapshot_in_background(&d, &s.id);
    // The layer's manifest is written while the sandbox is frozen; the
    // workspace's 240 MB follow, still frozen.
    let creating = loop {
        if let Some(x) = d.client.list_sandbox_snapshots("state=Creating").await.expect("list").into_iter().next() {
            break x;
        }
        assert!(!task.is_finished(), "the snapshot ended before it was seen Creating: {:?}", task.await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let layer = d.data_dir.join(format!("snapshots/manifests/sbx-{}-layer.json", creating.id));
    while !layer.exists() {
        assert!(!task.is_finished(), "the snapshot ended before its layer was seen");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(d.client.get_sandbox(&s.id).await.expect("get").status.state, "Running", "not paused by its user");
    let e = d.client.resume_sandbox(&s.id).await.expect_err("a snapshot's freeze is not the user's").to_string();
    assert!(e.contains("NOT_PAUSED"), "{e}");
    d.client.pause_sandbox(&s.id).await.expect("the user pauses during the snapshot");
    let still = d.client.list_sandbox_snapshots("state=Creating").await.expect("list");
    assert!(!still.is_empty(), "the snapshot ended before the pause: this run did not test the overlap");
    let snap = task.await.expect("join").expect("snapshot");
    assert_eq!(snap.status.state, "Ready");
    let st = d.client.get_sandbox(&s.id).await.expect("get").status.state;
    assert_eq!(st, "Paused", "the snapshot's end undid the user's pause");
    d.client.resume_sandbox(&s.id).await.expect("resume");
    assert_eq!(d.sh(&s.id, "ls /workspace | wc -l", None).await.1.trim(), "6");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_mid_snapshot_leaves_no_ready_snapshot_and_thaws_the_sandbox() {
    let mut d = Daemon::start();
    // The layer is small and goes first; the workspace's 240 MB of random
    // bytes keep the snapshot in Creating for seconds.
    let s = d.big_writer("echo layer > /tmp/l; ").await;
    let task = snapshot_in_background(&d, &s.id);
    let creating = loop {
        let l = d.client.list_sandbox_snapshots("state=Creating").await.expect("list");
        if let Some(x) = l.into_iter().next() {
            break x;
        }
        if task.is_finished() {
            panic!("the snapshot ended before it was seen Creating: {:?}", task.await);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Until the layer's manifest is committed, then kill: it must be deleted.
    let layer = d.data_dir.join(format!("snapshots/manifests/sbx-{}-layer.json", creating.id));
    while !layer.exists() && !task.is_finished() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    d.kill9();
    let _ = task.await;
    d.spawn();

    let after = d.client.get_sandbox_snapshot(&creating.id).await.expect("record survives");
    assert_eq!(after.status.state, "Failed", "{after:?}");
    assert!(after.status.message.as_deref().unwrap_or("").contains("restarted"), "{after:?}");
    assert!(!layer.exists(), "the committed layer manifest of a Failed snapshot was deleted");
    let req = CreateSandboxRequest { snapshot_id: Some(creating.id.clone()), ..Default::default() };
    let e = d.client.create_sandbox(&req).await.expect_err("not ready").to_string();
    assert!(e.contains("SNAPSHOT::NOT_READY"), "{e}");

    let st = d.client.get_sandbox(&s.id).await.expect("sandbox").status.state;
    assert_eq!(st, "Running", "the sandbox frozen for the snapshot was thawed");
    assert_eq!(d.sh(&s.id, "cat /tmp/l", None).await.1, "layer\n");
    let snap = d.client.snapshot_sandbox(&s.id, None).await.expect("a snapshot after the restart");
    assert_eq!(snap.status.state, "Ready");
}

/// A snapshot runs to its end whoever waits for it: a caller gone between
/// the sandbox's freeze and its thaw left it frozen for good and the record
/// Creating (`snapshots/mod.rs`, `detached`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_whose_caller_goes_away_is_made_and_thaws_the_sandbox() {
    let d = Daemon::start();
    let s = d.big_writer("").await;
    let task = snapshot_in_background(&d, &s.id);
    d.abort_when_frozen(&s.id, task).await;
    let cg = d.cgroups();
    let frozen = || cg.is_frozen(&s.id).expect("freezer state");
    let mut tries = 0;
    let snap = loop {
        let all = d.client.list_sandbox_snapshots(&format!("sandboxId={}", s.id)).await.expect("list");
        let snap = all.into_iter().next().expect("the snapshot's record");
        if snap.status.state != "Creating" {
            break snap;
        }
        tries += 1;
        assert!(tries < 1200, "the snapshot stayed Creating after its caller went away (frozen: {})", frozen());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(snap.status.state, "Ready", "{snap:?}");
    assert!(!frozen(), "the sandbox was left frozen");
    assert_eq!(d.sh(&s.id, "echo alive", None).await.1, "alive\n");
}

/// The OCI classes write through the host overlay ember assembles, whose upper
/// dir is snapshotted like the native one (with `user.overlay.*` marks). Under
/// gVisor too: a file still held open and a page written through a shared
/// mapping, by a process still running at the snapshot, are both in it.
async fn oci_round_trip(class: &str) {
    let d = Daemon::start();
    let src = d.create(|r| r.runtime_class = Some(class.into())).await;
    let write =
        "set -e; echo fresh > /tmp/new; rm /etc/os-release; rm -rf /etc/ssl; mkdir /etc/ssl; echo mine > /etc/ssl/mine";
    let (code, _, err) = d.sh(&src.id, write, Some(0)).await;
    assert_eq!(code, Some(0), "{class}: {err}");
    // Written, never closed or unmapped while the snapshot is taken.
    let holder = r#"import mmap, time
f = open("/tmp/held", "w+b"); f.write(b"held-open\n"); f.flush()
g = open("/tmp/mapped", "w+b"); g.write(b"." * 4096); g.flush()
m = mmap.mmap(g.fileno(), 4096); m[0:7] = b"mapped\n"
open("/tmp/ready", "w").close()
time.sleep(600)"#;
    let start =
        format!("(python3 -c '{holder}' </dev/null >/dev/null 2>&1 &); while [ ! -e /tmp/ready ]; do sleep 0.05; done");
    let (code, _, err) = d.sh(&src.id, &start, Some(0)).await;
    assert_eq!(code, Some(0), "{class}: {err}");
    let snap = d.client.snapshot_sandbox(&src.id, None).await.unwrap_or_else(|e| panic!("snapshot of {class}: {e}"));
    assert_eq!(snap.runtime_class.as_deref(), Some(class));
    d.client.delete_sandbox(&src.id).await.expect("delete");
    let req = CreateSandboxRequest { snapshot_id: Some(snap.id.clone()), ..Default::default() };
    let (restored, _) = d.client.create_sandbox(&req).await.expect("restore");
    assert_eq!(restored.runtime_class, class);
    // A glob, not `ls`: gVisor's 2022 `statx` answers EINVAL.
    let check = "cat /tmp/new; test ! -e /etc/os-release && echo gone; echo /etc/ssl/*; cat /etc/hostname; \
                 cat /tmp/held; head -c 7 /tmp/mapped";
    let (code, out, err) = d.sh(&restored.id, check, None).await;
    assert_eq!(code, Some(0), "{class}: {out}\n{err}");
    let short: String = restored.id.chars().take(12).collect();
    assert_eq!(out, format!("fresh\ngone\n/etc/ssl/mine\nsbx-{short}\nheld-open\nmapped\n"), "{class}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crun_sandboxes_snapshot_and_restore() {
    oci_round_trip("crun").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runsc_sandboxes_snapshot_and_restore() {
    oci_round_trip("runsc").await;
}

fn ember(d: &Daemon, args: &[&str]) -> String {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .env("EMBER_URL", &d.url)
        .output()
        .expect("ember runs");
    assert!(o.status.success(), "ember {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_snapshots_lists_restores_and_removes() {
    let d = Daemon::start();
    let id = ember(&d, &["sandbox", "create"]);
    ember(&d, &["exec", &id, "--", "sh", "-c", "echo cli > /tmp/c"]);
    let sid = ember(&d, &["sandbox", "snapshot", &id, "--name", "n1"]);
    assert!(ember(&d, &["sandbox", "snapshots", "ls", "--sandbox", &id]).contains(&sid));
    let info: serde_json::Value = serde_json::from_str(&ember(&d, &["sandbox", "snapshots", "inspect", &sid])).unwrap();
    assert_eq!((info["status"]["state"].as_str(), info["name"].as_str()), (Some("Ready"), Some("n1")));
    let new = ember(&d, &["sandbox", "create", "--snapshot", &sid]);
    assert_eq!(ember(&d, &["exec", &new, "--", "cat", "/tmp/c"]), "cli");
    assert_eq!(ember(&d, &["sandbox", "snapshots", "rm", &sid]), sid);
    assert!(ember(&d, &["sandbox", "snapshots", "ls", "--json"]).trim() == "[]");
}

/// Sparse files cost their data, never their apparent size: the largest file
/// the kernel takes (`truncate -s 8E` is one byte past it) in the writable
/// layer and a 200G one in a 1 GiB workspace go through a snapshot, a restore
/// and a fork ×5 with their holes kept as holes. Before, the snapshot read
/// 2^63 bytes of zeros (it never finished).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_files_snapshot_restore_and_fork_within_the_quota() {
    let d = Daemon::start();
    d.client.create_workspace("sp", "1Gi").await.expect("workspace");
    let src = d.create(|r| r.workspaces = vec![mount("sp")]).await;
    let plant = "set -e; truncate -s 9223372036854775807 /huge; truncate -s 200G /workspace/big; \
        echo tail >> /workspace/big";
    let (code, _, err) = d.sh(&src.id, plant, Some(0)).await;
    assert_eq!(code, Some(0), "{err}");
    let snap = d.client.snapshot_sandbox(&src.id, None).await.expect("snapshot");
    let ws_snap = snap.workspaces[0].snapshot_id.clone().expect("rw workspace snapshot");

    let req = CreateSandboxRequest { snapshot_id: Some(snap.id.clone()), ..Default::default() };
    let (restored, _) = d.client.create_sandbox(&req).await.expect("restore");
    // Apparent size, then allocated KiB: a few blocks, not the holes.
    let check = "stat -c '%s %b %B' /huge /workspace/big; tail -c 5 /workspace/big";
    let (code, out, err) = d.sh(&restored.id, check, Some(0)).await;
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    for (line, size) in lines[..2].iter().zip(["9223372036854775807", "214748364805"]) {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[0], size, "{out}");
        let allocated: u64 = f[1].parse::<u64>().unwrap() * f[2].parse::<u64>().unwrap();
        assert!(allocated <= 64 << 10, "{allocated} bytes allocated: holes written as zeros ({out})");
    }
    assert_eq!(lines[2], "tail", "{out}");

    let forks = d.client.fork_snapshot(&ws_snap, 5, "sp-fork").await.expect("fork x5");
    assert_eq!(forks.len(), 5);
    for w in &forks {
        assert_eq!(w.size_bytes, 1 << 30, "the source's quota, not the apparent 200G");
        assert!(w.used_bytes < 256 << 20, "{}: {} bytes used", w.name, w.used_bytes);
    }
}
