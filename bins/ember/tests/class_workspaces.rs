//! Workspaces in every runtime class, cold and warm: a read-write and a
//! read-only workspace mounted at create and at a pool claim (which stays
//! warm), writes landing on the host as the same ids in every class, a
//! read-only mount refusing writes, the data seen by the next sandbox, the
//! lease released on removal and nothing left behind. `crun`, `runc` and
//! `runsc` fail, not skip, when their runtime is not installed (see classes.rs).
mod common;

use common::Daemon;
use ember_types::api::{CreatePoolRequest, CreateSandboxRequest, SandboxInfo, WorkspaceMountSpec};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

/// `ember serve`'s default `--uid-base`: sandbox id n is host id UID_BASE + n.
const UID_BASE: u32 = 1_000_000_000;

fn rw(name: &str) -> WorkspaceMountSpec {
    WorkspaceMountSpec { name: name.into(), ..Default::default() }
}

fn ro(name: &str, path: &str) -> WorkspaceMountSpec {
    WorkspaceMountSpec { name: name.into(), mount_path: Some(path.into()), read_only: true, ..Default::default() }
}

async fn create(d: &Daemon, class: &str, mounts: Vec<WorkspaceMountSpec>) -> SandboxInfo {
    let req = CreateSandboxRequest {
        template: Some("host".into()),
        runtime_class: Some(class.into()),
        workspaces: mounts,
        ..Default::default()
    };
    match d.client.create_sandbox(&req).await {
        Ok((info, _)) => info,
        Err(e) => panic!("creating a {class} sandbox with workspaces: {e}"),
    }
}

/// The host-side file of workspace `ws`.
fn host_file(d: &Daemon, ws: &str, rel: &str) -> std::path::PathBuf {
    d.data_dir.join("workspaces").join(ws).join("mnt").join(rel)
}

/// Writes as the sandbox user and as root, reads back, checks the host ids,
/// and checks that the read-only mount at /ref refuses a write.
async fn write_read_refuse(d: &Daemon, class: &str, s: &SandboxInfo, file: &str) {
    let line = format!("{file} from {class} {}", s.id);
    let (code, out, err) =
        d.sh(&s.id, &format!("echo '{line}' > /workspace/{file} && cat /workspace/{file}"), None).await;
    assert_eq!((code, out.trim()), (Some(0), line.as_str()), "{class}: write/read in the rw workspace: {err}");
    let (code, _, err) = d.sh(&s.id, &format!("mkdir /workspace/{file}.d"), Some(0)).await;
    assert_eq!(code, Some(0), "{class}: root mkdir in the rw workspace: {err}");
    let m = std::fs::metadata(host_file(d, "data", file)).expect("the file is on the host");
    assert_eq!((m.uid(), m.gid()), (UID_BASE + 1000, UID_BASE + 1000), "{class}: host ids of the user's file");
    let m = std::fs::metadata(host_file(d, "data", &format!("{file}.d"))).expect("the dir is on the host");
    assert_eq!((m.uid(), m.gid()), (UID_BASE, UID_BASE), "{class}: host ids of root's dir");

    let (code, out, _) = d.sh(&s.id, "test -d /ref && echo ok > /ref/x 2>&1; echo rc=$?", Some(0)).await;
    assert_eq!(code, Some(0));
    assert!(out.contains("rc=") && !out.contains("rc=0"), "{class}: root wrote into a read-only workspace: {out}");
    let (code, out, err) = d.sh(&s.id, "echo no > /ref/x", None).await;
    assert_ne!(code, Some(0), "{class}: the user wrote into a read-only workspace");
    assert!(format!("{out}{err}").contains("Read-only file system"), "{class}: the refusal is EROFS: {out}{err}");
    assert!(!host_file(d, "ref", "x").exists(), "{class}: a read-only write reached the host");
    // Mounting took CAP_SYS_ADMIN under gVisor (a one-shot helper's only): no
    // command, even root's, holds it, and a mount is still refused.
    let (_, out, _) =
        d.sh(&s.id, "grep CapBnd /proc/self/status; mount -t tmpfs t /tmp 2>&1; echo rc=$?", Some(0)).await;
    let bnd = out.lines().find_map(|l| l.strip_prefix("CapBnd:")).map(str::trim).unwrap_or_default();
    let bnd = u64::from_str_radix(bnd, 16).unwrap_or_else(|e| panic!("{class}: CapBnd in {out:?}: {e}"));
    assert_eq!(bnd & (1 << 21), 0, "{class}: a command holds CAP_SYS_ADMIN: {out}");
    assert!(!out.contains("rc=0"), "{class}: root inside mounted a tmpfs: {out}");
    if class == "runsc" {
        // The slot the workspaces came through is not the sandbox's to change
        // (the host attaches there; see oci/slot.rs).
        let script = "mkdir /.ember/ws/x; echo mkdir=$?; ln -s /etc /.ember/ws/y; echo ln=$?";
        let (_, out, _) = d.sh(&s.id, script, Some(0)).await;
        assert!(out.contains("mkdir=1") && out.contains("ln=1"), "runsc: root wrote into the workspace slot: {out}");
    }
}

/// Removes `s` and waits until its lease is released and nothing is left.
async fn remove(d: &Daemon, class: &str, s: &SandboxInfo) {
    d.client.delete_sandbox(&s.id).await.expect("delete");
    let lease = d.client.get_workspace("data").await.expect("workspace").lease;
    assert!(lease.is_none_or(|l| l.holder != s.id), "{class}: the removed sandbox still holds the lease");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut left = d.leftovers(class, &s.id);
    while !left.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        left = d.leftovers(class, &s.id);
    }
    assert!(left.is_empty(), "{class} sandbox {} left: {left:?}", s.id);
}

async fn wait_idle(d: &Daemon, class: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while d.client.get_pool("host").await.expect("pool").idle < 1 {
        assert!(Instant::now() < deadline, "{class}: the pool never had an idle sandbox");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn workspaces_in(class: &str) {
    let d = Daemon::start();
    d.client.create_workspace("data", "32Mi").await.expect("workspace data");
    d.client.create_workspace("ref", "32Mi").await.expect("workspace ref");

    // Cold: a read-write and a read-only workspace at create.
    let t0 = Instant::now();
    let a = create(&d, class, vec![rw("data"), ro("ref", "/ref")]).await;
    println!("{class}: cold create with two workspaces: {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
    assert_eq!(a.launch.as_ref().map(|l| l.kind.as_str()), Some("cold"));
    // Where a slow create spent its time: up to the launch, the launch's
    // steps, then the workspaces' mounts, all inside the total.
    let l = a.launch.as_ref().expect("launch info");
    let keys: Vec<&str> = l.phases.keys().map(|k| k.as_str()).collect();
    assert_eq!(keys, ["agentReady", "cgroup", "spawn", "start", "workspaces"], "{class}: launch phases");
    assert!(l.phases["start"] + l.phases["workspaces"] <= l.micros, "{class}: phases outside the total: {l:?}");
    assert_eq!(d.client.get_workspace("data").await.expect("data").lease.map(|l| l.holder), Some(a.id.clone()));
    write_read_refuse(&d, class, &a, "cold").await;
    remove(&d, class, &a).await;

    // The next sandbox of the class, cold, takes the released lease and sees the data.
    let b = create(&d, class, vec![rw("data")]).await;
    let (code, out, _) = d.sh(&b.id, "cat /workspace/cold", None).await;
    assert_eq!((code, out.trim()), (Some(0), format!("cold from {class} {}", a.id).as_str()));
    remove(&d, class, &b).await;

    // Warm: a pool of the class, claimed with both workspaces.
    let req = CreatePoolRequest {
        template: "host".into(),
        runtime_class: Some(class.into()),
        min: 1,
        max: 1,
        target: Some(1.into()),
        ..Default::default()
    };
    d.client.create_pool(&req).await.expect("pool");
    wait_idle(&d, class).await;
    let t0 = Instant::now();
    let c = create(&d, class, vec![rw("data"), ro("ref", "/ref")]).await;
    println!("{class}: warm claim with two workspaces: {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
    assert_eq!(c.launch.as_ref().map(|l| l.kind.as_str()), Some("warm"), "{class}: the claim was not warm");
    let (code, out, _) = d.sh(&c.id, "cat /workspace/cold", None).await;
    assert_eq!((code, out.trim()), (Some(0), format!("cold from {class} {}", a.id).as_str()), "{class}: warm");
    write_read_refuse(&d, class, &c, "warm").await;
    remove(&d, class, &c).await;

    // And the data written through the warm claim outlives it.
    let e = create(&d, class, vec![ro("data", "/workspace")]).await;
    let (code, out, _) = d.sh(&e.id, "cat /workspace/warm", None).await;
    assert_eq!((code, out.trim()), (Some(0), format!("warm from {class} {}", c.id).as_str()));
    remove(&d, class, &e).await;
    d.client.delete_pool("host").await.expect("delete pool");

    // A sandbox snapshot carries the workspace; its restore mounts the copy the same way.
    let f = create(&d, class, vec![rw("data")]).await;
    let snap = d.client.snapshot_sandbox(&f.id, None).await.unwrap_or_else(|e| panic!("{class}: snapshot: {e}"));
    remove(&d, class, &f).await;
    let req = CreateSandboxRequest { snapshot_id: Some(snap.id.clone()), ..Default::default() };
    let (r, _) = d.client.create_sandbox(&req).await.unwrap_or_else(|e| panic!("{class}: restore: {e}"));
    assert_eq!(r.workspaces.len(), 1, "{class}: {:?}", r.workspaces);
    let (code, out, _) = d.sh(&r.id, "cat /workspace/warm && echo restored > /workspace/r", None).await;
    assert_eq!((code, out.trim()), (Some(0), format!("warm from {class} {}", c.id).as_str()), "{class}: restore");
    remove(&d, class, &r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspaces_native() {
    workspaces_in("native").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspaces_crun() {
    workspaces_in("crun").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspaces_runc() {
    workspaces_in("runc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspaces_runsc() {
    workspaces_in("runsc").await;
}

/// The runsc slot is host state beside the container: after `kill -9` of the
/// daemon and a restart, the re-adopted sandbox still writes its workspace,
/// keeps its lease, and its removal still leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runsc_workspace_survives_a_daemon_restart() {
    let mut d = Daemon::start();
    d.client.create_workspace("data", "32Mi").await.expect("workspace data");
    let s = create(&d, "runsc", vec![rw("data")]).await;
    let (code, _, err) = d.sh(&s.id, "echo before > /workspace/f", None).await;
    assert_eq!(code, Some(0), "{err}");
    d.kill9();
    d.spawn();
    assert_eq!(d.client.get_sandbox(&s.id).await.expect("re-adopted").status.state, "Running");
    let (code, out, err) = d.sh(&s.id, "echo after >> /workspace/f && cat /workspace/f", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "before\nafter\n"), "{err}");
    let lease = d.client.get_workspace("data").await.expect("data").lease.map(|l| l.holder);
    assert_eq!(lease, Some(s.id.clone()), "the lease stands across the restart");
    remove(&d, "runsc", &s).await;
}
