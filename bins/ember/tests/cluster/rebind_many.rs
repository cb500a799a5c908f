//! Several sessions of one node rebound at once: the survivors restore
//! their workspaces several at a time each (`--rebinds-at-once`), and every session is writable by
//! its user afterwards. The 300-session drill saw appends refused after a
//! rebind (`Permission denied`, on a mounted idmapped workspace, or on a
//! `/workspace` left the bare mount point), on nodes restoring two
//! workspaces at once; one session at a time never showed it. The
//! survivors restore into spare volumes made ahead (a rename, not an image,
//! a mkfs and two mounts on the rebind's path).
use super::rebind::{rebind_request, sh_through, SharedStore};
use super::{eventually, nats, runtime};
use crate::common::Daemon;
use ember_types::execd::RunCommandRequest;
use std::time::Duration;

const SESSIONS: usize = 6;

#[test]
fn sessions_of_a_killed_node_rebound_at_once_are_each_writable() {
    let nats = nats::NatsCluster::start("rebind-many", 3);
    let store = SharedStore::new("many");
    let urls = nats.urls();
    let mut a = store.node(&urls, "a");
    // As many spares as sessions: whichever survivor restores them all, each
    // takes a spare, so the count below is exact.
    let spares = SESSIONS.to_string();
    let b = store.node_with(&urls, "b", &["--workspace-spares", &spares]);
    let c = store.node_with(&urls, "c", &["--workspace-spares", &spares]);
    let ids = runtime().block_on(async {
        // Each survivor has made a workspace of the sessions' size (its own
        // sessions would have): its refill keeps spares of that size.
        for (d, ws) in [(&b, "own-b"), (&c, "own-c")] {
            d.client.create_workspace(ws, "64Mi").await.expect("a workspace of the survivor's own");
            eventually(Duration::from_secs(60), "spares of 64 MiB made", || async {
                (metric(d, "ember_workspace_spares_ready").await == SESSIONS as u64).then_some(())
            })
            .await;
        }
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
        // Through both survivors, as fast as they answer: the first exec the
        // re-created sandbox runs must see its workspace whole (the drill's
        // first append after a rebind was refused).
        let first = ids.iter().enumerate().map(|(i, id)| {
            let (b, c) = (&b, &c);
            async move {
                let want = format!("session-{i}\n");
                loop {
                    for d in [b, c] {
                        let req =
                            RunCommandRequest { command: Some("cat /workspace/records".into()), ..Default::default() };
                        let mut out = String::new();
                        let res = d.client.exec(id, &req, |ev| {
                            if ev.kind == "stdout" {
                                out.push_str(ev.text.as_deref().unwrap_or(""));
                                out.push('\n');
                            }
                        });
                        if let Ok(r) = res.await {
                            assert_eq!(
                                (r.exit_code, out.as_str()),
                                (Some(0), want.as_str()),
                                "session {i}: its first exec"
                            );
                            return;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
        let all = futures_util::future::join_all(first);
        tokio::time::timeout(Duration::from_secs(120), all).await.expect("every session back within 120 s");
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
        // Each orphan was rebound once. A node whose watch of the rebind
        // bucket lagged its own last write took the entry for pending still
        // and ran the rebind's steps again, each end of one starting the
        // next sweep (234 runs for 11 sessions on one node of the drill).
        // Some sweeps later, the count has not moved on.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let runs = metric(&b, "ember_cluster_rebinds_total").await + metric(&c, "ember_cluster_rebinds_total").await;
        assert_eq!(runs, SESSIONS as u64, "rebinds run by the survivors");
        // Every restore took a spare (the loop copies the count each second).
        eventually(Duration::from_secs(10), "each restore took a spare", || async {
            let taken = metric(&b, "ember_workspace_spares_taken_total").await
                + metric(&c, "ember_workspace_spares_taken_total").await;
            (taken == SESSIONS as u64).then_some(())
        })
        .await;
    });
}

/// A node's counter `name` (without labels).
async fn metric(d: &Daemon, name: &str) -> u64 {
    let value = super::metric(d, name).await.unwrap_or_else(|| panic!("no {name} on {}", d.url));
    value.parse().unwrap_or_else(|_| panic!("{name} {value}"))
}
