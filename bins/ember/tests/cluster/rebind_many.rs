//! Several sessions of one node rebound at once: the survivors restore
//! their workspaces two at a time each, and every session is writable by
//! its user afterwards. The 300-session drill saw appends refused after a
//! rebind (`Permission denied`, on a mounted idmapped workspace, or on a
//! `/workspace` left the bare mount point), on nodes restoring two
//! workspaces at once; one session at a time never showed it.
use super::rebind::{rebind_request, sh_through, SharedStore};
use super::{eventually, nats, runtime};
use std::time::Duration;

const SESSIONS: usize = 6;

#[test]
fn sessions_of_a_killed_node_rebound_at_once_are_each_writable() {
    let nats = nats::NatsCluster::start("rebind-many", 3);
    let store = SharedStore::new("many");
    let urls = nats.urls();
    let mut a = store.node(&urls, "a");
    let b = store.node(&urls, "b");
    let c = store.node(&urls, "c");
    let ids = runtime().block_on(async {
        let mut ids = Vec::new();
        for i in 0..SESSIONS {
            let ws = format!("many-{i}");
            a.client.create_workspace(&ws, "64Mi").await.expect("workspace on a");
            let id = a.client.create_sandbox(&rebind_request(&ws)).await.expect("rebind sandbox on a").0.id;
            let (code, _, err) = a.sh(&id, &format!("echo session-{i} > /workspace/records"), None).await;
            assert_eq!(code, Some(0), "{err}");
            a.client.checkpoint_workspace(&ws).await.expect("checkpoint");
            ids.push(id);
        }
        for id in &ids {
            eventually(Duration::from_secs(60), "b routes to a", || async { b.client.get_sandbox(id).await.ok() })
                .await;
        }
        ids
    });
    a.kill9();
    runtime().block_on(async {
        for (i, id) in ids.iter().enumerate() {
            let through = if i % 2 == 0 { &b } else { &c };
            let script = "echo appended >> /workspace/records && cat /workspace/records";
            let (code, out, err) = sh_through(through, id, script, false).await;
            let seen =
                sh_through(through, id, "id -u; ls -lnd /workspace /workspace/records; mount | grep workspace", false);
            let (_, diag, _) = seen.await;
            assert_eq!(code, Some(0), "session {i} ({id}) after the rebind: {out} {err}\n{diag}");
            assert_eq!(out, format!("session-{i}\nappended\n"), "session {i}: its checkpoint, then the append");
        }
    });
}
