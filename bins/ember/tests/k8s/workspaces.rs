//! ember's own Workspace against the live API server and a real node: it
//! becomes an ember workspace (`k8s-<namespace>-<name>`); its status follows
//! the holder, the fencing epoch and the newest checkpoint as ember's API
//! reports them; its size cannot change (the CRD's CEL rule, enforced by the
//! API server); deleting it waits while a sandbox writes it, then deletes it.
use super::{eventually, Operator};
use ember_operator::crd::{Workspace, WorkspaceSpec, WorkspaceStatus};
use ember_types::api::WorkspaceMountSpec;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

async fn status_where(api: &Api<Workspace>, what: &str, ok: impl Fn(&WorkspaceStatus) -> bool) -> WorkspaceStatus {
    eventually(what, 240, || async {
        let st = api.get_status("data").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        ok(&st).then_some(st.clone()).ok_or_else(|| format!("{st:?}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_resource_becomes_an_ember_workspace_and_reports_its_holder() {
    let (server, kube, daemon) = super::setup().await;
    let _operator = Operator::start(&server.kubeconfig, &daemon.url, &[]);
    let api: Api<Workspace> = Api::namespaced(kube.clone(), "default");
    api.create(&PostParams::default(), &Workspace::new("data", WorkspaceSpec { size: "64Mi".into() }))
        .await
        .expect("Workspace accepted");
    let name = "k8s-default-data";
    let st = status_where(&api, "the workspace Available", |s| s.phase.as_deref() == Some("Available")).await;
    assert_eq!(
        (st.workspace.as_deref(), st.size_bytes, st.epoch, st.holder.as_deref()),
        (Some(name), 64 << 20, 0, None)
    );
    assert!(st.conditions.iter().any(|c| c.type_ == "Ready" && c.is_true()), "{st:?}");
    daemon.client.get_workspace(name).await.expect("on the node");

    // The size is fixed: the API server refuses a change.
    let patch = serde_json::json!({ "spec": { "size": "128Mi" } });
    let refused = api.patch("data", &PatchParams::default(), &Patch::Merge(&patch)).await.expect_err("refused");
    assert!(matches!(&refused, kube::Error::Api(e) if e.code == 422), "{refused:?}");

    // A sandbox writing it holds it, at epoch 1; a checkpoint is reported.
    let mount = WorkspaceMountSpec { name: name.into(), ..Default::default() };
    let writer = daemon.create(|r| r.workspaces = vec![mount]).await;
    let (code, _, _) = daemon.sh(&writer.id, "echo kept > /workspace/f", None).await;
    assert_eq!(code, Some(0));
    let cp = daemon.client.checkpoint_workspace(name).await.expect("checkpoint");
    let st = status_where(&api, "the holder, its epoch and the checkpoint", |s| {
        s.holder.is_some() && s.last_checkpoint.is_some()
    })
    .await;
    assert_eq!((st.phase.as_deref(), st.holder.as_deref(), st.epoch), (Some("Held"), Some(writer.id.as_str()), 1));
    let last = st.last_checkpoint.expect("a checkpoint");
    assert_eq!((last.snapshot_id.as_str(), last.epoch), (cp.snapshot_id.as_str(), Some(1)));

    // `kubectl get ews`: the API server renders the CRD's printer columns.
    let req = http::Request::get("/apis/ember.run/v1alpha1/namespaces/default/workspaces")
        .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .body(Vec::new())
        .expect("a request");
    let table: serde_json::Value =
        serde_json::from_str(&kube.request_text(req).await.expect("the table")).expect("JSON");
    let columns: Vec<&str> =
        table["columnDefinitions"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(columns[..6], ["Name", "Size", "Workspace", "Holder", "Epoch", "Phase"], "{table}");
    let cells = &table["rows"][0]["cells"];
    let want = serde_json::json!(["data", "64Mi", name, writer.id, 1, "Held"]);
    assert_eq!(cells.as_array().map(|c| c[..6].to_vec()), want.as_array().cloned(), "{table}");

    // Deleting it waits while the sandbox writes it, and says why.
    api.delete("data", &DeleteParams::default()).await.expect("delete accepted");
    status_where(&api, "the deletion held", |s| {
        s.conditions.iter().any(|c| c.type_ == "DeletionBlocked" && c.is_true() && c.message.contains("IN_USE"))
    })
    .await;
    daemon.client.get_workspace(name).await.expect("the node keeps it while it is written");
    daemon.client.delete_sandbox(&writer.id).await.expect("writer removed");
    eventually("the resource and the node's workspace gone", 240, || async {
        let cr_gone = matches!(api.get("data").await, Err(kube::Error::Api(e)) if e.code == 404);
        let node = daemon.client.get_workspace(name).await;
        (cr_gone && node.is_err()).then_some(()).ok_or_else(|| format!("resource gone {cr_gone}, node {node:?}"))
    })
    .await;
}

/// A size ember refuses says why, without a retry loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_ember_refuses_says_why() {
    let (server, kube, daemon) = super::setup().await;
    let _operator = Operator::start(&server.kubeconfig, &daemon.url, &[]);
    let api: Api<Workspace> = Api::namespaced(kube.clone(), "default");
    api.create(&PostParams::default(), &Workspace::new("data", WorkspaceSpec { size: "1Ki".into() }))
        .await
        .expect("Workspace accepted");
    let st = status_where(&api, "the workspace Failed", |s| s.phase.as_deref() == Some("Failed")).await;
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready");
    assert_eq!(ready.reason, "NodeRefused", "{st:?}");
    assert!(ready.message.contains("size"), "ember's reason: {}", ready.message);
    // Deleting a workspace that never was: the finalizer lets it go.
    api.delete("data", &DeleteParams::default()).await.expect("delete accepted");
    eventually("the resource gone", 240, || async {
        let gone = matches!(api.get("data").await, Err(kube::Error::Api(e)) if e.code == 404);
        gone.then_some(()).ok_or("still there".to_string())
    })
    .await;
}
