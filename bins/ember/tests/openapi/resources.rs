//! ember's own resources: pools, workspaces and their snapshots, tasks.
use super::*;

pub(super) async fn pools(api: &Api) {
    let body = json!({"template": "host", "min": 1, "max": 2, "target": "auto"});
    let r = api.req("POST", "/v1/pools", &[]).json(body.clone()).send().await;
    assert_eq!((r.status, r.json()["name"].as_str()), (201, Some("host")));
    let r = api.req("POST", "/v1/pools", &[]).json(body).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("POOL::ALREADY_EXISTS")));
    let r = api
        .req("POST", "/v1/pools", &[])
        .json(json!({"template": "host", "name": "p2", "min": 3, "max": 1}))
        .send()
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(api.req("GET", "/v1/pools", &[]).send().await.json()["items"][0]["name"], "host");
    let r = api.req("GET", "/v1/pools/{name}", &["host"]).send().await;
    assert_eq!(r.json()["sizing"]["windowSecs"], 60);
    let r = api.req("PUT", "/v1/pools/{name}", &["host"]).json(json!({"target": 2})).send().await;
    assert_eq!((r.status, r.json()["target"].clone()), (200, json!(2)));
    let r = api.req("PUT", "/v1/pools/{name}", &["host"]).json(json!({"target": "lots"})).send().await;
    assert_eq!(r.status, 400);
    assert_eq!(api.req("GET", "/v1/pools/{name}", &["nope"]).send().await.status, 404);
    assert_eq!(api.req("DELETE", "/v1/pools/{name}", &["host"]).send().await.status, 204);
    assert_eq!(api.req("DELETE", "/v1/pools/{name}", &["host"]).send().await.status, 404);
}

pub(super) async fn workspaces(api: &Api) {
    let r = api.req("POST", "/v1/workspaces", &[]).json(json!({"name": "ws1", "size": "32Mi"})).send().await;
    assert_eq!((r.status, r.json()["name"].as_str()), (201, Some("ws1")));
    let r = api.req("POST", "/v1/workspaces", &[]).json(json!({"name": "ws1", "size": "32Mi"})).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("WORKSPACE::ALREADY_EXISTS")));
    let r = api.req("POST", "/v1/workspaces", &[]).json(json!({"name": "Bad", "size": "32Mi"})).send().await;
    assert_eq!(r.status, 400);
    assert_eq!(api.req("GET", "/v1/workspaces", &[]).send().await.json()["items"][0]["name"], "ws1");
    let body = json!({"template": "host", "workspaces": [{"name": "ws1"}]});
    let s = api.req("POST", "/v1/sandboxes", &[]).json(body).send().await;
    assert_eq!(s.status, 202);
    let id = s.json()["id"].as_str().expect("id").to_string();
    let r = api.req("GET", "/v1/workspaces/{name}", &["ws1"]).send().await;
    assert_eq!(r.json()["lease"]["holder"].as_str(), Some(id.as_str()));
    let r = api.req("DELETE", "/v1/workspaces/{name}", &["ws1"]).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("WORKSPACE::IN_USE")));
    let r = api.req("POST", "/v1/workspaces/{name}/snapshots", &["ws1"]).send().await;
    assert_eq!(r.status, 201);
    let snap = r.json()["id"].as_str().expect("snapshot id").to_string();
    let r = api
        .req("POST", "/v1/workspaces/{name}/snapshots", &["ws1"])
        .json(json!({"holder": "x", "epoch": 9}))
        .send()
        .await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("WORKSPACE::FENCED")));
    assert_eq!(api.req("POST", "/v1/workspaces/{name}/snapshots", &["nope"]).send().await.status, 404);
    // A checkpoint: the snapshot and the lease's epoch; fenced like a snapshot.
    let r = api.req("POST", "/v1/workspaces/{name}/checkpoint", &["ws1"]).send().await;
    assert_eq!(r.status, 200);
    let epoch = api.req("GET", "/v1/workspaces/{name}", &["ws1"]).send().await.json()["lease"]["epoch"].clone();
    assert_eq!(r.json()["epoch"], epoch);
    assert!(r.json()["snapshotId"].as_str().is_some_and(|s| s.starts_with("ws1-")), "{:?}", r.json());
    assert_eq!(api.req("POST", "/v1/workspaces/{name}/checkpoint", &["nope"]).send().await.status, 404);
    let body = json!({"template": "host", "extensions": {"restartPolicy": "sometimes"}});
    let r = api.req("POST", "/v1/sandboxes", &[]).json(body).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (400, Some("SANDBOX::INVALID_PARAMETER")));
    assert_eq!(api.req("GET", "/v1/workspace-snapshots", &[]).send().await.json()["items"][0]["id"], snap.as_str());
    assert_eq!(api.req("GET", "/v1/workspace-snapshots/{id}", &[&snap]).send().await.status, 200);
    let r = api.req("POST", "/v1/workspace-snapshots/{id}/restore", &[&snap]).json(json!({"name": "ws2"})).send().await;
    assert_eq!((r.status, r.json()["name"].as_str()), (201, Some("ws2")));
    let r = api
        .req("POST", "/v1/workspace-snapshots/{id}/fork", &[&snap])
        .json(json!({"count": 2, "prefix": "kid", "operationId": "fork-op-1"}))
        .send()
        .await;
    assert_eq!((r.status, r.json()["items"][1]["name"].as_str()), (201, Some("kid-2")));
    let r = api.req("GET", "/v1/workspace-snapshots/operations/{id}", &["fork-op-1"]).send().await;
    assert_eq!((r.status, r.json()["phase"].as_str(), r.json()["itemsDone"].as_u64()), (200, Some("done"), Some(2)));
    assert_eq!(r.json()["result"][1], "kid-2");
    let r = api.req("GET", "/v1/workspace-snapshots/operations", &[]).send().await;
    assert_eq!(r.status, 200);
    assert!(r.json()["items"].as_array().is_some_and(|a| a.iter().any(|o| o["id"] == "fork-op-1")));
    let r = api.req("GET", "/v1/workspace-snapshots/operations/{id}", &["nope"]).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("SNAPSHOT::OPERATION_NOT_FOUND")));
    for w in ["ws2", "kid-1", "kid-2"] {
        assert_eq!(api.req("DELETE", "/v1/workspaces/{name}", &[w]).send().await.status, 204);
    }
    assert_eq!(api.req("DELETE", "/v1/workspace-snapshots/{id}", &[&snap]).send().await.status, 204);
    assert_eq!(api.req("GET", "/v1/workspace-snapshots/{id}", &[&snap]).send().await.status, 404);
    let r = api.req("POST", "/v1/snapshot-store/gc", &[]).json(json!({"minAgeSeconds": 0})).send().await;
    assert_eq!(r.status, 200);
    assert!(r.json()["chunksDeleted"].as_u64() >= Some(1), "the deleted snapshot's chunks went: {}", r.json());
    let r = api.req("POST", "/v1/snapshot-store/gc", &[]).json(json!({"minAgeSeconds": -1})).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (400, Some("SANDBOX::INVALID_PARAMETER")));
    assert_eq!(api.req("DELETE", "/v1/sandboxes/{id}", &[&id]).send().await.status, 204);
    assert_eq!(api.req("GET", "/v1/workspaces/{name}", &["nope"]).send().await.status, 404);
    assert_eq!(api.req("DELETE", "/v1/workspaces/{name}", &["ws1"]).send().await.status, 204);
}

pub(super) async fn tasks(api: &Api) {
    let body = json!({"command": ["sh", "-c", "echo hi"], "key": "k1", "tier": "interactive"});
    let r = api.req("POST", "/v1/tasks", &[]).json(body.clone()).send().await;
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["id"].as_str().expect("id").to_string();
    assert_eq!(api.req("POST", "/v1/tasks", &[]).json(body).send().await.status, 200, "same key, same task");
    let r = api.req("POST", "/v1/tasks", &[]).json(json!({"command": []})).send().await;
    assert_eq!(r.status, 400);
    let r = api.req("POST", "/v1/tasks", &[]).json(json!({"command": ["true"], "workspace": "nope"})).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("WORKSPACE::NOT_FOUND")));
    for _ in 0..200 {
        if api.req("GET", "/v1/tasks/{id}", &[&id]).send().await.json()["state"] == "Succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let r = api.req("GET", "/v1/tasks/{id}/logs", &[&id]).query("follow=true").send().await;
    assert_eq!((r.status, r.text().as_str(), r.header("x-ember-attempt")), (200, "hi\n", Some("1")));
    let r = api.req("GET", "/v1/tasks", &[]).query("state=Succeeded&tier=interactive").send().await;
    assert_eq!(r.json()["items"][0]["id"].as_str(), Some(id.as_str()));
    assert_eq!(api.req("GET", "/v1/tasks", &[]).query("tier=urgent").send().await.status, 400);
    let r = api.req("POST", "/v1/tasks/{id}/cancel", &[&id]).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("TASK::ALREADY_ENDED")));
    let long = json!({"command": ["sleep", "600"], "tier": "batch"});
    let long = api.req("POST", "/v1/tasks", &[]).json(long).send().await.json()["id"].as_str().unwrap().to_string();
    let r = api.req("POST", "/v1/tasks/{id}/cancel", &[&long]).send().await;
    assert_eq!((r.status, r.json()["state"].as_str()), (200, Some("Cancelled")));
    assert_eq!(api.req("GET", "/v1/tasks/{id}", &["t-nope"]).send().await.status, 404);
    assert_eq!(api.req("GET", "/v1/tasks/{id}/logs", &["t-nope"]).send().await.status, 404);
    assert_eq!(api.req("POST", "/v1/tasks/{id}/cancel", &["t-nope"]).send().await.status, 404);
}
