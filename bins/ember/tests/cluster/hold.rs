//! A call for a rebind sandbox whose node is dead waits for the sandbox
//! (`ember serve --rebind-hold`) instead of answering 503 at once: issued
//! through an API-only node while no node could re-create the sandbox, it
//! is still under way when a node that can joins, and answers from the
//! re-created sandbox; so is a checkpoint of its workspace, taken on the
//! re-created copy.
use super::rebind::{rebind_request, SharedStore};
use super::{eventually, metric, nats, runtime};
use std::time::Duration;

#[test]
fn a_call_for_a_rebind_sandbox_on_a_dead_node_waits_for_its_rebind() {
    let nats = nats::NatsCluster::start("rebind-hold", 3);
    let store = SharedStore::new("hold");
    let urls = nats.urls();
    // A bound on the test's wait, not the default (10 s).
    let router = store.node_with(&urls, "r", &["--api-only", "--rebind-hold", "60s"]);
    let mut a = store.node(&urls, "a");
    let rt = runtime();
    let (id, epoch) = rt.block_on(async {
        a.client.create_workspace("rb-hold", "64Mi").await.expect("workspace on a");
        let id = a.client.create_sandbox(&rebind_request("rb-hold")).await.expect("rebind sandbox on a").0.id;
        let (code, _, _) = a.sh(&id, "echo kept > /workspace/kept", None).await;
        assert_eq!(code, Some(0));
        let first = a.client.checkpoint_workspace("rb-hold").await.expect("checkpoint on a");
        eventually(Duration::from_secs(60), "r routes to a", || async { router.client.get_sandbox(&id).await.ok() })
            .await;
        (id, first.epoch)
    });
    a.kill9();
    // R takes A for dead: no node is left that runs sandboxes.
    rt.block_on(eventually(Duration::from_secs(60), "r takes a for dead", || async {
        (metric(&router, "ember_cluster_nodes_alive").await.as_deref() == Some("1")).then_some(())
    }));
    let get = rt.spawn({
        let (client, id) = (router.client.clone(), id.clone());
        async move { client.get_sandbox(&id).await }
    });
    let checkpoint = rt.spawn({
        let client = router.client.clone();
        async move { client.checkpoint_workspace("rb-hold").await }
    });
    // B joins (its start waits for its health) and re-creates the sandbox.
    let b = store.node(&urls, "b");
    if get.is_finished() {
        panic!("the get answered before any node could re-create the sandbox: {:?}", rt.block_on(get));
    }
    if checkpoint.is_finished() {
        panic!("the checkpoint answered before any node could restore the workspace: {:?}", rt.block_on(checkpoint));
    }
    let got = rt.block_on(get).expect("joined").expect("the held get, answered once b re-created the sandbox");
    assert_eq!(got.id, id);
    let c = rt.block_on(checkpoint).expect("joined").expect("the held checkpoint, taken on b");
    assert_eq!(c.epoch, epoch + 1, "taken on b's copy, at the epoch of its take-over: {c:?}");
    let (code, out, err) = rt.block_on(b.sh(&id, "cat /workspace/kept", None));
    assert_eq!((code, out.as_str()), (Some(0), "kept\n"), "{err}");
}
