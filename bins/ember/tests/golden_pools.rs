//! Golden pools (`fromSnapshot`): members start from a sandbox snapshot's
//! writable layer and workspaces, a create restoring that snapshot claims one
//! warm, and a plain create of the same template never does. And `autoPause`
//! on a pool: claimed members inherit it, a claim's own wins.
mod common;

use common::Daemon;
use ember_types::api::{AutoPause, CreatePoolRequest, CreateSandboxRequest, WorkspaceMountSpec};
use std::time::Duration;

/// A source sandbox primed as root (a file made, a template file changed,
/// one deleted), snapshotted and removed: the snapshot's id.
async fn primed_snapshot(d: &Daemon) -> String {
    let src = d.create(|_| {}).await;
    let prime = "set -e; echo primed > /opt/model; chmod 640 /opt/model; echo 'extra: x' >> /etc/nsswitch.conf; \
        rm /etc/os-release";
    let (code, _, err) = d.sh(&src.id, prime, Some(0)).await;
    assert_eq!(code, Some(0), "{err}");
    let snap = d.client.snapshot_sandbox(&src.id, Some("primed")).await.expect("snapshot");
    assert_eq!(snap.status.state, "Ready");
    d.client.delete_sandbox(&src.id).await.expect("delete the source");
    snap.id
}

const CHECK: &str = "cat /opt/model; stat -c %a /opt/model; tail -n1 /etc/nsswitch.conf; \
    test -e /etc/os-release && echo has-os-release || echo no-os-release";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_golden_pools_claimed_member_sees_the_snapshots_files() {
    let d = Daemon::start();
    let sid = primed_snapshot(&d).await;
    let req = CreatePoolRequest {
        name: Some("golden".into()),
        from_snapshot: Some(sid.clone()),
        min: 1,
        max: 3,
        target: Some(1.into()),
        ..Default::default()
    };
    let p = d.client.create_pool(&req).await.expect("golden pool");
    assert_eq!((p.template.as_str(), p.from_snapshot.as_deref()), ("host", Some(sid.as_str())));
    assert_eq!(d.pool_idle("golden", 1).await, 1);

    // A plain create of the same template is not served by the golden pool.
    let plain = d.create(|_| {}).await;
    assert_eq!(plain.launch.as_ref().expect("launch").kind, "cold");
    let plain_check = "test -e /opt/model || echo no-model; test -e /etc/os-release && echo has-os-release";
    let got = d.sh(&plain.id, plain_check, None).await.1;
    assert_eq!(got, "no-model\nhas-os-release\n", "a plain sandbox got the snapshot's files");
    assert_eq!(d.client.get_pool("golden").await.expect("pool").idle, 1);

    // A restore of the snapshot claims the member: warm, with its files and
    // the request's env bound at claim.
    let mut env = std::collections::BTreeMap::new();
    env.insert("GREETING".to_string(), Some("hi".to_string()));
    let restore = CreateSandboxRequest { snapshot_id: Some(sid.clone()), env: Some(env), ..Default::default() };
    let (s, _) = d.client.create_sandbox(&restore).await.expect("restore");
    assert_eq!(s.launch.as_ref().expect("launch").kind, "warm");
    assert_eq!(s.snapshot_id.as_deref(), Some(sid.as_str()));
    let (code, out, err) = d.sh(&s.id, &format!("{CHECK}; echo $GREETING"), Some(0)).await;
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "primed\n640\nextra: x\nno-os-release\nhi\n");
    assert_eq!(d.client.get_pool("golden").await.expect("pool").claims_total, 1);

    // The pool refills from the snapshot, which stays while the pool does.
    assert_eq!(d.pool_idle("golden", 1).await, 1);
    let e = d.client.delete_sandbox_snapshot(&sid).await.expect_err("a golden pool's snapshot").to_string();
    assert!(e.contains("SNAPSHOT::IN_USE") && e.contains("golden"), "{e}");
    d.client.delete_pool("golden").await.expect("remove the pool");
    d.client.delete_sandbox_snapshot(&sid).await.expect("no pool starts from it now");
}

/// The names of the workspaces that exist, sorted.
async fn workspace_names(d: &Daemon) -> Vec<String> {
    let mut names: Vec<String> =
        d.client.list_workspaces().await.expect("workspaces").into_iter().map(|w| w.name).collect();
    names.sort();
    names
}

/// A snapshot with a read-write workspace (`data` at /workspace) and a
/// read-only one (`ref` at /ref): every golden member gets a copy of `data`
/// as the snapshot has it, of its own, and `ref` itself; a claim hands the
/// copy to the caller (it outlives the sandbox, as a restore's does); the
/// end of an idle member removes its copy. The snapshot cannot be deleted
/// while the pool starts from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_members_get_their_own_copies_of_the_snapshots_workspaces() {
    let d = Daemon::start();
    for ws in ["data", "ref"] {
        d.client.create_workspace(ws, "16Mi").await.expect("workspace");
    }
    let writer =
        d.create(|r| r.workspaces = vec![WorkspaceMountSpec { name: "ref".into(), ..Default::default() }]).await;
    d.sh(&writer.id, "echo shared > /workspace/r", None).await;
    d.client.delete_sandbox(&writer.id).await.expect("delete the writer");
    let mounts = vec![
        WorkspaceMountSpec { name: "data".into(), ..Default::default() },
        WorkspaceMountSpec {
            name: "ref".into(),
            mount_path: Some("/ref".into()),
            read_only: true,
            ..Default::default()
        },
    ];
    let src = d.create(|r| r.workspaces = mounts).await;
    let (code, _, err) = d.sh(&src.id, "echo primed > /workspace/model", None).await;
    assert_eq!(code, Some(0), "{err}");
    let sid = d.client.snapshot_sandbox(&src.id, None).await.expect("snapshot").id;
    // Changed after the snapshot: members must have the snapshot's content.
    d.sh(&src.id, "echo later > /workspace/model", None).await;
    d.client.delete_sandbox(&src.id).await.expect("delete the source");

    let req = CreatePoolRequest {
        name: Some("golden".into()),
        from_snapshot: Some(sid.clone()),
        min: 2,
        max: 2,
        target: Some(2.into()),
        ..Default::default()
    };
    d.client.create_pool(&req).await.expect("a golden pool of a snapshot with workspaces");
    assert_eq!(d.pool_idle("golden", 2).await, 2);
    let copies = |names: &[String]| names.iter().filter(|n| n.starts_with("data-")).cloned().collect::<Vec<_>>();
    assert_eq!(copies(&workspace_names(&d).await).len(), 2, "one copy per idle member");

    let restore = CreateSandboxRequest { snapshot_id: Some(sid.clone()), ..Default::default() };
    let (s, _) = d.client.create_sandbox(&restore).await.expect("restore");
    assert_eq!(s.launch.as_ref().expect("launch").kind, "warm");
    let mine = format!("data-{}", &s.id[..8]);
    let got: Vec<_> = s.workspaces.iter().map(|w| (w.name.as_str(), w.mount_path.as_str(), w.read_only)).collect();
    assert_eq!(got, [(mine.as_str(), "/workspace", false), ("ref", "/ref", true)]);
    let (code, out, err) = d.sh(&s.id, "cat /workspace/model /ref/r; echo mine > /workspace/model", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "primed\nshared\n"), "{err}");
    assert_eq!(d.read_ws("data", "model").await, "later\n", "the source's workspace is untouched");

    // The snapshot stays while the pool starts from it.
    let e = d.client.delete_sandbox_snapshot(&sid).await.expect_err("in use").to_string();
    assert!(e.contains("SNAPSHOT::IN_USE") && e.contains("golden"), "{e}");

    // The claimed copy is the caller's: it outlives the sandbox.
    d.client.delete_sandbox(&s.id).await.expect("delete the claim");
    assert_eq!(d.read_ws(&mine, "model").await, "mine\n");
    assert_eq!(d.pool_idle("golden", 2).await, 2, "the pool refills");
    assert_eq!(copies(&workspace_names(&d).await).len(), 3, "two idle members' copies and the caller's");

    // Idle members' copies go with them.
    d.client.delete_pool("golden").await.expect("remove the pool");
    let want = vec!["data".to_string(), mine, "ref".to_string()];
    assert_eq!(workspace_names(&d).await, want, "an idle member's copy was left behind");
    d.client.delete_sandbox_snapshot(&sid).await.expect("no pool starts from it now");
}

/// A change to a valid golden pool request.
type Edit = fn(&mut CreatePoolRequest);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_pools_refuse_what_they_cannot_serve() {
    let d = Daemon::start();
    let sid = primed_snapshot(&d).await;
    let golden = |f: Edit| {
        let mut r = CreatePoolRequest {
            name: Some("g".into()),
            from_snapshot: Some(sid.clone()),
            max: 2,
            ..Default::default()
        };
        f(&mut r);
        r
    };
    let cases: [(Edit, &str); 6] = [
        (|r| r.name = None, "a golden pool needs a name"),
        (|r| r.from_checkpoint = Some("any".into()), "give fromSnapshot or fromCheckpoint"),
        (|r| r.template = "nope".into(), "is of template host"),
        (|r| r.network = Some("egress".into()), "network are its snapshot's"),
        (|r| r.from_snapshot = Some("no-such-snapshot".into()), "SNAPSHOT::NOT_FOUND"),
        (|r| r.auto_pause = Some(AutoPause { after_seconds: 0, ..Default::default() }), "autoPause"),
    ];
    for (f, want) in cases {
        let e = d.client.create_pool(&golden(f)).await.expect_err(want).to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
    d.client.create_pool(&golden(|_| {})).await.expect("the golden pool");
    // A plain create naming the golden pool is refused, not served.
    let named = CreateSandboxRequest {
        template: Some("host".into()),
        extensions: Some([("poolRef".to_string(), "g".to_string())].into()),
        ..Default::default()
    };
    let e = d.client.create_sandbox(&named).await.expect_err("poolRef of a golden pool").to_string();
    assert!(e.contains("is golden"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_inherit_the_pools_auto_pause_unless_they_ask_for_their_own() {
    let d = Daemon::start();
    let req = CreatePoolRequest {
        name: Some("host".into()),
        template: "host".into(),
        min: 2,
        max: 4,
        target: Some(2.into()),
        auto_pause: Some(AutoPause { after_seconds: 1, ..Default::default() }),
        ..Default::default()
    };
    let p = d.client.create_pool(&req).await.expect("pool");
    assert_eq!(p.auto_pause, Some(AutoPause { after_seconds: 1, ..Default::default() }));
    assert_eq!(d.pool_idle("host", 2).await, 2);
    let inherits = d.create(|_| {}).await;
    let own = d.create(|r| r.auto_pause = Some(AutoPause { after_seconds: 3600, ..Default::default() })).await;
    for s in [&inherits, &own] {
        assert_eq!(s.launch.as_ref().expect("launch").kind, "warm");
    }
    let s = d.wait_state(&inherits.id, "Paused", Duration::from_secs(20)).await;
    assert_eq!(s.status.state, "Paused", "no auto-pause within 20 s of the pool's 1 s");
    // The other claim, idle as long, keeps running under its own hour.
    assert_eq!(d.client.get_sandbox(&own.id).await.expect("get").status.state, "Running");
    let (code, out, _) = d.sh(&inherits.id, "echo thawed", None).await;
    assert_eq!((code, out.as_str()), (Some(0), "thawed\n"));
}

/// The ids of the idle golden members holding a copy of workspace `ws`
/// (`<ws>-<first 8 of the id>`), read from the daemon's records.
fn members_with_copies(d: &Daemon, names: &[String], ws: &str) -> Vec<String> {
    let ids: Vec<String> = std::fs::read_dir(d.data_dir.join("state/sandboxes"))
        .expect("records")
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".json").map(String::from))
        .collect();
    let copies: Vec<&str> = names.iter().filter_map(|n| n.strip_prefix(&format!("{ws}-"))).collect();
    ids.into_iter().filter(|id| copies.contains(&&id[..8])).collect()
}

/// The one idle member holding a copy of `data`, once there is one (a dead
/// member may still count as idle for a moment after its copy went).
async fn member(d: &Daemon) -> String {
    let mut names = Vec::new();
    for _ in 0..400 {
        names = workspace_names(d).await;
        let m = members_with_copies(d, &names, "data");
        if m.len() == 1 {
            return m[0].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no single idle member with a copy: {names:?}");
}

/// Waits until workspace `name` is gone; returns whether it went.
async fn gone(d: &Daemon, name: &str) -> bool {
    for _ in 0..400 {
        if !workspace_names(d).await.iter().any(|n| n == name) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Kills every process of sandbox `id` and waits until they are reaped (a
/// zombie left to the host's init would still be adopted by a restart).
async fn kill_all(d: &Daemon, id: &str) {
    let pids: Vec<String> = d.procs(id).iter().map(|p| p.to_string()).collect();
    assert!(!pids.is_empty(), "member {id} has no process");
    assert!(std::process::Command::new("kill").arg("-9").args(&pids).status().expect("kill").success());
    for _ in 0..200 {
        if pids.iter().all(|p| !std::path::Path::new("/proc").join(p).exists()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("member {id}'s processes {pids:?} were not reaped within 10 s");
}

/// An idle golden member's copies go with it however it ends: its processes
/// killed (its monitor's end), found dead by a restarted daemon (recovery),
/// or re-adopted after a restart and removed with its pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_members_copies_go_when_it_dies_or_after_a_restart() {
    let mut d = Daemon::start();
    d.client.create_workspace("data", "16Mi").await.expect("workspace");
    let src = d.create(|r| r.workspaces = vec![WorkspaceMountSpec { name: "data".into(), ..Default::default() }]).await;
    d.sh(&src.id, "echo primed > /workspace/model", None).await;
    let sid = d.client.snapshot_sandbox(&src.id, None).await.expect("snapshot").id;
    d.client.delete_sandbox(&src.id).await.expect("delete the source");
    let req = CreatePoolRequest {
        name: Some("golden".into()),
        from_snapshot: Some(sid),
        min: 1,
        max: 1,
        target: Some(1.into()),
        ..Default::default()
    };
    d.client.create_pool(&req).await.expect("pool");
    assert_eq!(d.pool_idle("golden", 1).await, 1);
    let m1 = member(&d).await;
    kill_all(&d, &m1).await;
    assert!(gone(&d, &format!("data-{}", &m1[..8])).await, "a dead idle member's copy stayed");
    assert_eq!(d.pool_idle("golden", 1).await, 1, "the pool refills");

    let m2 = member(&d).await;
    d.kill9();
    kill_all(&d, &m2).await;
    d.spawn();
    assert!(gone(&d, &format!("data-{}", &m2[..8])).await, "a member found dead at the restart kept its copy");
    assert_eq!(d.pool_idle("golden", 1).await, 1, "the pool refills after the restart");

    d.kill9();
    d.spawn();
    assert_eq!(d.pool_idle("golden", 1).await, 1, "the member is re-adopted");
    d.client.delete_pool("golden").await.expect("remove the pool");
    assert_eq!(workspace_names(&d).await, ["data"], "a re-adopted member's copy stayed");
}

/// A golden pool removed while its members are being made leaves no
/// workspace copy behind once the removal has answered: a refill under way
/// finishes with its member removed before the answer. Before, the member
/// (hidden, as idle members are) and its copy went after it: `ember bench
/// claim --from-snapshot` once left `data-<id>` behind in CI's run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_golden_pool_removed_while_it_refills_leaves_no_copy() {
    let d = Daemon::start();
    d.client.create_workspace("data", "16Mi").await.expect("workspace");
    let mounts = vec![WorkspaceMountSpec { name: "data".into(), ..Default::default() }];
    let src = d.create(|r| r.workspaces = mounts).await;
    let sid = d.client.snapshot_sandbox(&src.id, None).await.expect("snapshot").id;
    d.client.delete_sandbox(&src.id).await.expect("delete the source");
    for round in 0..3 {
        let req = CreatePoolRequest {
            name: Some(format!("busy{round}")),
            from_snapshot: Some(sid.clone()),
            min: 4,
            max: 4,
            target: Some(4.into()),
            ..Default::default()
        };
        d.client.create_pool(&req).await.expect("a golden pool");
        // Its refills start at once; a few ms in, some are under way.
        tokio::time::sleep(Duration::from_millis(30 * round)).await;
        d.client.delete_pool(&format!("busy{round}")).await.expect("remove the pool");
        assert_eq!(workspace_names(&d).await, ["data"], "round {round}: a copy outlived the pool's removal");
    }
    d.client.delete_sandbox_snapshot(&sid).await.expect("no pool starts from it now");
}
