//! Workspaces that survive their node and sessions that rebind: the nodes
//! share one snapshot store (a directory) and its manifest key; a sandbox
//! created with `extensions.restartPolicy = "rebind"` comes back on another
//! node under the same id, its workspace at its last checkpoint, when its
//! node is SIGKILLed (from the standby the survivor kept for it); two nodes creating one workspace name at once: one
//! wins; a node cut off from NATS freezes its copy, and a checkpoint asked
//! of it goes to the new holder once the sandbox was rebound elsewhere;
//! every node SIGKILLed and started again at once: the cluster converges.
use super::common::Daemon;
use super::{eventually, ids, nats, runtime};
use ember_client::ClientError;
use ember_types::api::{CreateSandboxRequest, WorkspaceMountSpec};
use ember_types::execd::RunCommandRequest;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The streams every node opens as it joins (with a directory snapshot
/// store): the task queue's four streams and three buckets, the registry's
/// six buckets, the tenants' four.
pub(super) const EVERY_STREAM: usize = 17;

/// A snapshot store and manifest key every node of one test shares.
pub(super) struct SharedStore {
    dir: PathBuf,
}

impl SharedStore {
    pub(super) fn new(test: &str) -> SharedStore {
        let dir = std::env::temp_dir().join(format!("ember-rebind-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("store")).expect("store dir");
        ember_snapshot::ManifestKey::load_or_create(&dir.join("snapshot.key")).expect("shared key");
        SharedStore { dir }
    }

    /// A node on `servers` (a subset of the cluster's URLs) using this store.
    pub(super) fn node(&self, servers: &[String], name: &str) -> Daemon {
        self.node_with(servers, name, &[])
    }

    /// [`node`](Self::node) with more `ember serve` arguments.
    pub(super) fn node_with(&self, servers: &[String], name: &str, more: &[&str]) -> Daemon {
        let urls = servers.join(",");
        let store = self.dir.join("store");
        let key = self.dir.join("snapshot.key");
        let mut args = vec![
            "--cluster",
            urls.as_str(),
            "--node",
            name,
            "--snapshot-store",
            store.to_str().expect("utf-8"),
            "--snapshot-key-file",
            key.to_str().expect("utf-8"),
        ];
        args.extend_from_slice(more);
        // EMBER_TEST_LOGS=DIR: each node's log, at info, in DIR/<test>-<node>.log.
        match std::env::var_os("EMBER_TEST_LOGS") {
            Some(dir) => {
                let test = self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                Daemon::start_logged(&args, &PathBuf::from(dir).join(format!("{test}-{name}.log")))
            }
            None => Daemon::start_with(&args),
        }
    }
}

impl Drop for SharedStore {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A rebind sandbox mounting workspace `ws` at /workspace.
pub(super) fn rebind_request(ws: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: Some("host".into()),
        extensions: Some(BTreeMap::from([("restartPolicy".to_string(), "rebind".to_string())])),
        workspaces: vec![WorkspaceMountSpec {
            name: ws.into(),
            mount_path: Some("/workspace".into()),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// `cat` of a workspace file in sandbox `id` through `d`, once it answers
/// (a 503 is retried, as the documented client policy does).
async fn read_through(d: &Daemon, id: &str, file: &str) -> String {
    let (code, out, err) = sh_through(d, id, &format!("cat /workspace/{file}"), true).await;
    assert_eq!(code, Some(0), "cat /workspace/{file} in {id}: {out} {err}");
    out
}

/// `sh -c script` in sandbox `id` through `d` once it is Running, retrying
/// the 503s (and 404s) of a sandbox moving between nodes, as the documented
/// client policy does; with `until_ok`, a non-zero exit is retried too.
/// What it last saw is printed as it changes (a timeout says why).
pub(super) async fn sh_through(d: &Daemon, id: &str, script: &str, until_ok: bool) -> (Option<i32>, String, String) {
    let last = std::sync::Mutex::new(String::new());
    // Not yet: prints what was seen if it changed, and retries.
    let seen = |what: String| -> Option<(Option<i32>, String, String)> {
        let mut l = last.lock().unwrap_or_else(|p| p.into_inner());
        if *l != what {
            eprintln!("sh through {}: {what}", d.url);
            *l = what;
        }
        None
    };
    eventually(Duration::from_secs(60), "the sandbox answers", || async {
        match d.client.get_sandbox(id).await {
            Ok(s) if s.status.state == "Running" => {}
            Ok(s) => return seen(format!("state {}", s.status.state)),
            Err(e @ ClientError::Api { status: 503 | 404, .. }) => return seen(format!("get: {e}")),
            Err(e) => panic!("get {id}: {e}"),
        }
        let req = RunCommandRequest { command: Some(script.into()), ..Default::default() };
        let (mut out, mut err) = (String::new(), String::new());
        let res = d.client.exec(id, &req, |ev| {
            let t = ev.text.as_deref().filter(|t| *t != "\n").unwrap_or("");
            match ev.kind.as_str() {
                "stdout" => out.extend([t, "\n"]),
                "stderr" => err.extend([t, "\n"]),
                _ => {}
            }
        });
        match res.await {
            Ok(r) if until_ok && r.exit_code != Some(0) => seen(format!("exit {:?}: {out} {err}", r.exit_code)),
            Ok(r) => Some((r.exit_code, out, err)),
            Err(e @ ClientError::Api { status: 503 | 404, .. }) => seen(format!("exec: {e}")),
            Err(e) => panic!("exec in {id}: {e}"),
        }
    })
    .await
}

#[test]
fn a_sigkilled_nodes_rebind_sandbox_comes_back_elsewhere_with_its_last_checkpoint() {
    let nats = nats::NatsCluster::start("rebind-kill", 3);
    let store = SharedStore::new("kill");
    let urls = nats.urls();
    let mut a = store.node(&urls, "a");
    let b = store.node(&urls, "b");
    runtime().block_on(async {
        a.client.create_workspace("rb-kill", "64Mi").await.expect("workspace on a");
        let id = a.client.create_sandbox(&rebind_request("rb-kill")).await.expect("rebind sandbox on a").0.id;
        let (code, _, _) = a.sh(&id, "echo before-checkpoint > /workspace/kept", None).await;
        assert_eq!(code, Some(0));
        let c = a.client.checkpoint_workspace("rb-kill").await.expect("checkpoint");
        assert!(!c.snapshot_id.is_empty() && c.epoch >= 1, "{c:?}");
        a.sh(&id, "echo after-checkpoint > /workspace/lost", None).await;
        // B sees A before the kill: its sandbox is routed to A.
        eventually(Duration::from_secs(60), "b routes to a", || async {
            b.client.get_sandbox(&id).await.map_err(|e| eprintln!("get {id} through b: {e}")).ok()
        })
        .await;
        // B, the survivor that would re-create it, keeps its launch ahead.
        let standbys = || async { super::metric(&b, "ember_cluster_rebind_standbys").await };
        eventually(Duration::from_secs(60), "b keeps a standby for a's sandbox", || async {
            (standbys().await.as_deref() == Some("1")).then_some(())
        })
        .await;
        assert!(
            b.client.get_sandbox(&id).await.is_ok_and(|s| s.launch.is_some_and(|l| l.kind == "cold")),
            "the standby is no caller's: calls for {id} still reach a's sandbox"
        );

        a.kill9();
        let killed = Instant::now();
        let kept = read_through(&b, &id, "kept").await;
        eprintln!("MTTR: sandbox {id} answered on b {:?} after a's SIGKILL", killed.elapsed());
        assert_eq!(kept, "before-checkpoint\n");
        // The rebind claimed the standby rather than starting cold.
        let launch = b.client.get_sandbox(&id).await.expect("rebound").launch.expect("its launch");
        assert_eq!(launch.kind, "standby", "{launch:?}");
        eventually(Duration::from_secs(30), "the standby claimed, b keeps none", || async {
            (standbys().await.as_deref() == Some("0")).then_some(())
        })
        .await;
        // The restored files are the sandbox user's to write (the drill's
        // sessions appended to theirs after a rebind: "Permission denied").
        let (code, out, err) = b.sh(&id, "echo appended >> /workspace/kept && id && ls -ln /workspace", None).await;
        assert_eq!(code, Some(0), "append after the rebind: {out} {err}");
        let (code, _, _) = b.sh(&id, "test -e /workspace/lost", None).await;
        assert_eq!(code, Some(1), "bytes after the checkpoint are not there (the snapshot is the checkpoint)");
        // B holds the workspace at the next epoch and checkpoints it.
        let again = b.client.checkpoint_workspace("rb-kill").await.expect("checkpoint on b");
        assert_eq!(again.epoch, c.epoch + 1, "{again:?}");
    });
}

#[test]
fn two_nodes_creating_one_workspace_name_at_once_one_wins() {
    let nats = nats::NatsCluster::start("ws-claim", 3);
    let store = SharedStore::new("claim");
    let urls = nats.urls();
    let a = store.node(&urls, "a");
    let b = store.node(&urls, "b");
    runtime().block_on(async {
        eventually(Duration::from_secs(60), "a sees b", || async {
            a.client.list_workspaces().await.ok()?;
            b.client.list_workspaces().await.ok()
        })
        .await;
        for round in 0..5 {
            let name = format!("race-{round}");
            let (on_a, on_b) =
                tokio::join!(a.client.create_workspace(&name, "16Mi"), b.client.create_workspace(&name, "16Mi"));
            let won = [&on_a, &on_b].iter().filter(|r| r.is_ok()).count();
            assert_eq!(won, 1, "round {round}: a {on_a:?}, b {on_b:?}");
            let lost = if on_a.is_ok() { on_b } else { on_a };
            let lost = lost.expect_err("the loser");
            let exists =
                matches!(&lost, ClientError::Api { status: 409, code, .. } if code == "WORKSPACE::ALREADY_EXISTS");
            assert!(exists, "{lost:?}");
        }
    });
}

#[test]
fn a_node_cut_off_from_nats_freezes_its_copy_and_its_checkpoints_go_to_the_new_holder() {
    // The servers do not advertise one another: A, given server 0 only,
    // knows no other, and stopping server 0 cuts it off (advertised, it
    // moves to another server within seconds: `cluster/servers.rs`
    // `a_node_whose_nats_server_goes_silent_moves_to_another`). B talks to
    // servers 1 and 2. Every stream is R3 before the cut (C, given all
    // three, raises one that A or B made R1).
    let nats = nats::NatsCluster::start_unadvertised("rebind-cut", 3);
    let store = SharedStore::new("cut");
    let urls = nats.urls();
    let _c = store.node(&urls, "c");
    let a = store.node(&urls[..1], "a");
    let b = store.node(&urls[1..], "b");
    let rt = runtime();
    let id = rt.block_on(async {
        a.client.create_workspace("rb-cut", "64Mi").await.expect("workspace on a");
        let id = a.client.create_sandbox(&rebind_request("rb-cut")).await.expect("rebind sandbox on a").0.id;
        let (code, _, _) = a.sh(&id, "echo checkpointed > /workspace/kept", None).await;
        assert_eq!(code, Some(0));
        a.client.checkpoint_workspace("rb-cut").await.expect("checkpoint on a");
        eventually(Duration::from_secs(60), "b routes to a", || async { b.client.get_sandbox(&id).await.ok() }).await;
        id
    });
    nats.wait_replicas(EVERY_STREAM, 3);
    let server = nats.servers[0].name.clone();
    nats.signal(&server, "STOP");
    let stopped = Instant::now();
    rt.block_on(async {
        // A's own copy is frozen (A answers for it locally) ...
        wait_frozen(&a, &id).await;
        eprintln!("a froze its copy {:?} after its NATS server stopped", stopped.elapsed());
        // ... and the sandbox comes back elsewhere, with its checkpoint.
        let kept = read_through(&b, &id, "kept").await;
        assert_eq!(kept, "checkpointed\n");
        eprintln!("rebound elsewhere {:?} after a was cut off", stopped.elapsed());
    });
    nats.signal(&server, "CONT");
    rt.block_on(async {
        // A checkpoint asked of A is the workspace's, whose holder is now
        // another node: it is taken there, at the new epoch, never of A's
        // stale copy (which answered 409 `WORKSPACE::FENCED` to the drill's
        // sessions entering by A, a user-visible error). A cannot commit its
        // own copy: its checkpoint guard needs the holder's epoch.
        let c = eventually(Duration::from_secs(30), "a checkpoint routed to the holder", || async {
            a.client.checkpoint_workspace("rb-cut").await.ok()
        })
        .await;
        assert_eq!(c.epoch, 2, "{c:?}");
        // A removes its copy once it sees the sandbox rebound: one copy left.
        eventually(Duration::from_secs(30), "a drops its copy", || async { (!has_copy(&a, &id)).then_some(()) }).await;
        let kept = read_through(&a, &id, "kept").await;
        assert_eq!(kept, "checkpointed\n");
    });
}

/// A session rebound away from a node and later back onto it: that node
/// still has its stale copy of the workspace (an evicted sandbox's
/// workspaces stay), which the rebind replaces with the last checkpoint.
/// The files there are the sandbox user's to write (the 300-session drill's
/// appends after a rebind failed with "Permission denied", some on a bare
/// /workspace mount point).
#[test]
fn a_session_rebound_back_onto_a_node_with_a_stale_copy_is_writable_there() {
    // Servers that do not advertise one another, as above: stopping server
    // 0 cuts A off.
    let nats = nats::NatsCluster::start_unadvertised("rebind-back", 3);
    let store = SharedStore::new("back");
    let urls = nats.urls();
    let mut c = store.node(&urls, "c");
    let a = store.node(&urls[..1], "a");
    let mut b = store.node(&urls[1..], "b");
    let rt = runtime();
    let id = rt.block_on(async {
        a.client.create_workspace("rb-back", "64Mi").await.expect("workspace on a");
        let id = a.client.create_sandbox(&rebind_request("rb-back")).await.expect("rebind sandbox on a").0.id;
        let (code, _, _) = a.sh(&id, "echo first > /workspace/first", None).await;
        assert_eq!(code, Some(0));
        a.client.checkpoint_workspace("rb-back").await.expect("checkpoint on a");
        eventually(Duration::from_secs(60), "b routes to a", || async { b.client.get_sandbox(&id).await.ok() }).await;
        id
    });
    // A cut off: the session goes to b or c.
    nats.wait_replicas(EVERY_STREAM, 3);
    let server = nats.servers[0].name.clone();
    nats.signal(&server, "STOP");
    rt.block_on(async {
        wait_frozen(&a, &id).await;
        assert_eq!(read_through(&b, &id, "first").await, "first\n");
    });
    nats.signal(&server, "CONT");
    rt.block_on(async {
        eventually(Duration::from_secs(30), "a drops its copy", || async { (!has_copy(&a, &id)).then_some(()) }).await;
        let (code, out, err) = sh_through(&b, &id, "echo second > /workspace/second", false).await;
        assert_eq!(code, Some(0), "a write where the session went: {out} {err}");
        let c2 = b.client.checkpoint_workspace("rb-back").await.expect("checkpoint where the session went");
        assert_eq!(c2.epoch, 2, "{c2:?}");
    });
    // Only a is left: the session comes back onto it, over its stale copy.
    b.kill9();
    c.kill9();
    rt.block_on(async {
        assert_eq!(read_through(&a, &id, "second").await, "second\n");
        let script = "echo appended >> /workspace/first && echo new > /workspace/new && cat /workspace/first";
        let (code, out, err) = sh_through(&a, &id, script, false).await;
        let look = "id; ls -lna /workspace; grep workspace /proc/self/mountinfo";
        let (_, look, _) = sh_through(&a, &id, look, false).await;
        assert_eq!(code, Some(0), "append after rebinding back: {out} {err}\n{look}");
        assert_eq!(out, "first\nappended\n");
        let c3 = a.client.checkpoint_workspace("rb-back").await.expect("checkpoint back on a");
        assert_eq!(c3.epoch, 3, "{c3:?}");
    });
}

/// Waits until node `d` (cut off from NATS) has frozen its copy of `id`:
/// it answers for that copy itself, `Paused`.
async fn wait_frozen(d: &Daemon, id: &str) {
    eventually(Duration::from_secs(20), "the cut-off node freezes its copy", || async {
        let s = d.client.get_sandbox(id).await.ok()?;
        (s.status.state == "Paused").then_some(())
    })
    .await;
}

/// Whether `d`'s data dir holds a copy of sandbox `id`: its files, under a
/// record that is not an idle standby's (a node keeps the launch of another
/// node's rebind sandbox ready under its id, `standby.rs`; no workspace is
/// in it, and its rebind claims it).
fn has_copy(d: &Daemon, id: &str) -> bool {
    let dir = std::fs::read_dir(d.data_dir.join("sandboxes"));
    let files = dir.is_ok_and(|mut r| r.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy() == id)));
    let record = d.data_dir.join("state/sandboxes").join(format!("{id}.json"));
    let record = std::fs::read_to_string(record).unwrap_or_default();
    let standby = record.contains(r#""pool":"rebind.standby""#) && record.contains(r#""phase":"pooled""#);
    files && !standby
}

/// Every node SIGKILLed at once and started again at once (a power cut, a
/// botched roll-out): the cluster converges. Every sandbox is listed and
/// reached through either node, the rebind session answers under its id
/// with its checkpoint (on its node, or rebound if one node came back long
/// after the other), and exactly one copy of it is left.
#[test]
fn all_nodes_restarted_at_once_converge() {
    let nats = nats::NatsCluster::start("restart-all", 3);
    let store = SharedStore::new("restart-all");
    let urls = nats.urls();
    let mut a = store.node(&urls, "a");
    let mut b = store.node(&urls, "b");
    let rt = runtime();
    let all = rt.block_on(async {
        let plain_a = a.create(|_| {}).await.id;
        let plain_b = b.create(|_| {}).await.id;
        a.client.create_workspace("rs-all", "64Mi").await.expect("workspace on a");
        let session = a.client.create_sandbox(&rebind_request("rs-all")).await.expect("rebind sandbox").0.id;
        let (code, _, _) = a.sh(&session, "echo kept > /workspace/kept", None).await;
        assert_eq!(code, Some(0));
        a.client.checkpoint_workspace("rs-all").await.expect("checkpoint");
        [plain_a, plain_b, session]
    });
    a.kill9();
    b.kill9();
    a.spawn();
    b.spawn();
    let restarted = Instant::now();
    rt.block_on(async {
        for d in [&a, &b] {
            eventually(Duration::from_secs(60), "every sandbox listed again", || async {
                let listed = ids(d).await?;
                all.iter().all(|id| listed.contains(id)).then_some(())
            })
            .await;
        }
        eprintln!("converged {:?} after the restart", restarted.elapsed());
        let [plain_a, plain_b, session] = &all;
        for (through, id) in [(&b, plain_a), (&a, plain_b)] {
            let (code, out, _) = through.sh(id, "echo reached", None).await;
            assert_eq!((code, out.as_str()), (Some(0), "reached\n"), "{id} through the other node");
        }
        for d in [&a, &b] {
            assert_eq!(read_through(d, session, "kept").await, "kept\n");
        }
        eventually(Duration::from_secs(30), "one copy of the rebind session", || async {
            (has_copy(&a, session) != has_copy(&b, session)).then_some(())
        })
        .await;
    });
}
