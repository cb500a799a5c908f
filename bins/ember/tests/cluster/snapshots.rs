//! Workspace snapshots on a cluster: every node's snapshot store is the
//! cluster's JetStream object store (the default with `--cluster`), so a
//! snapshot taken on one node is listed, restored and swept on another.
use super::{nats, node, runtime};
use ember_types::api::WorkspaceMountSpec;

fn mount(name: &str) -> WorkspaceMountSpec {
    WorkspaceMountSpec { name: name.into(), ..Default::default() }
}

const READ: &str = "md5sum < /workspace/blob; cat /workspace/note";

#[test]
fn a_workspace_snapshot_taken_on_one_node_restores_on_another() {
    let nats = nats::NatsCluster::start("snapstore", 3);
    let a = node(&nats, "a", &[]);
    let b = node(&nats, "b", &[]);
    runtime().block_on(async {
        a.client.create_workspace("src", "64Mi").await.expect("workspace on a");
        let w = a.create(|r| r.workspaces = vec![mount("src")]).await;
        let (code, _, err) =
            a.sh(&w.id, "head -c 3000000 /dev/urandom > /workspace/blob && echo from-a > /workspace/note", None).await;
        assert_eq!(code, Some(0), "{err}");
        let snap = a.client.snapshot_workspace("src", None).await.expect("snapshot on a");

        // B reads the same store: it lists A's snapshot and restores it.
        let listed = b.client.list_snapshots(Some("src")).await.expect("list on b");
        assert!(listed.iter().any(|s| s.id == snap.id), "b lists a's snapshot: {listed:?}");
        b.client.restore_snapshot(&snap.id, "copy", None).await.expect("restore on b");
        let r = b.create(|r| r.workspaces = vec![mount("copy")]).await;
        let (_, on_b, _) = b.sh(&r.id, READ, None).await;
        let (_, on_a, _) = a.sh(&w.id, READ, None).await;
        assert_eq!(on_b, on_a, "the restored workspace holds a's bytes");
        assert!(on_b.ends_with("from-a\n"), "{on_b:?}");

        // gc from B keeps what A's snapshot references; once A deletes it,
        // B's sweep frees its chunks.
        let kept = b.client.gc_snapshots(Some(0)).await.expect("gc on b");
        assert_eq!(kept.chunks_deleted, 0, "{kept:?}");
        assert!(kept.chunks_referenced > 0, "{kept:?}");
        a.client.delete_snapshot(&snap.id).await.expect("delete on a");
        let swept = b.client.gc_snapshots(Some(0)).await.expect("gc on b");
        assert_eq!(swept.chunks_deleted, kept.chunks_referenced, "{swept:?}");
    });
}
