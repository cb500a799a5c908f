//! The OpenSandbox lifecycle routes: system, create/get/list, metadata and
//! renew, sandbox snapshots, checkpoint/pause/resume/delete, and the router's fallbacks.
use super::*;

pub(super) async fn system_routes(api: &Api) {
    let h = api.req("GET", "/health", &[]).send().await;
    assert_eq!((h.status, h.json()), (200, json!({"status": "healthy"})));
    assert_eq!(api.req("GET", "/version", &[]).send().await.status, 200);
    let rts = api.req("GET", "/v1/runtimes", &[]).send().await;
    assert_eq!(rts.status, 200);
    let items = rts.json()["items"].as_array().cloned().unwrap_or_default();
    assert!(items.iter().any(|r| r["name"] == "native" && r["available"] == true), "{items:?}");
    let m = api.req("GET", "/metrics", &[]).send().await;
    assert_eq!(m.status, 200);
    assert!(m.text().trim_end().ends_with("# EOF"), "OpenMetrics text ends with # EOF");
    let ev = json!({"eventType": "sandbox.create", "createDurationMs": 12, "success": true});
    assert_eq!(api.req("POST", "/v1/metrics/events", &[]).json(ev).send().await.status, 204);
    // Without an X-Request-ID, one is generated.
    let r = http(&api.d.url, "GET", "/health", &[], b"").await;
    let id = r.header("x-request-id").expect("generated X-Request-ID");
    assert!(id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
}

/// Creates A (with expiry, team=a) and B (manual cleanup, team=b) and reads them back.
pub(super) async fn create_and_read(api: &Api) -> (String, String) {
    let body =
        json!({"template": "host", "timeout": 600, "metadata": {"team": "a"}, "entrypoint": ["sleep", "infinity"]});
    let r = api.req("POST", "/v1/sandboxes", &[]).json(body).send().await;
    assert_eq!(r.status, 202, "{}", r.text());
    let a = r.json();
    assert_eq!(a["status"]["state"], "Running");
    assert!(a["expiresAt"].is_string() && a["launch"]["micros"].is_u64());
    assert_eq!(r.header("x-ember-launch-micros").map(str::to_string), Some(a["launch"]["micros"].to_string()));
    let body = json!({"image": {"uri": "host"}, "metadata": {"team": "b"}, "resourceLimits": {"memory": "256Mi"}});
    let r = api.req("POST", "/v1/sandboxes", &[]).json(body).send().await;
    assert_eq!(r.status, 202, "{}", r.text());
    let b = r.json();
    assert!(b.get("expiresAt").is_none(), "manual cleanup: no expiresAt key, not null");
    assert_eq!(b["entrypoint"], json!([]));
    let (a, b) = (a["id"].as_str().unwrap().to_string(), b["id"].as_str().unwrap().to_string());

    for (body, status, code) in [
        (b"{".to_vec(), 400, "SANDBOX::INVALID_PARAMETER"),
        (br#"{"timeout":"soon"}"#.to_vec(), 400, "SANDBOX::INVALID_PARAMETER"),
        (br#"{"template":"no-such-template"}"#.to_vec(), 400, "SANDBOX::UNKNOWN_TEMPLATE"),
        (br#"{"template":"host","image":{"uri":"other"}}"#.to_vec(), 400, "SANDBOX::INVALID_PARAMETER"),
        (br#"{"template":"host","resourceLimits":{"gpu":"1"}}"#.to_vec(), 400, "SANDBOX::INVALID_PARAMETER"),
        (br#"{"snapshotId":"s1"}"#.to_vec(), 404, "SNAPSHOT::NOT_FOUND"),
        (br#"{"snapshotId":"s1","templateId":"host"}"#.to_vec(), 400, "SANDBOX::INVALID_PARAMETER"),
    ] {
        let r = api.req("POST", "/v1/sandboxes", &[]).raw("application/json", body).send().await;
        assert_eq!((r.status, r.json()["code"].as_str()), (status, Some(code)), "{}", r.text());
    }

    let r = api.req("GET", "/v1/sandboxes/{id}", &[&a]).send().await;
    assert_eq!((r.status, r.json()["id"].as_str()), (200, Some(a.as_str())));
    let r = api.req("GET", "/v1/sandboxes/{id}", &["nope"]).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("SANDBOX::NOT_FOUND")));
    let r = api.req("GET", "/v1/sandboxes/{id}", &[&b]).bare().send().await;
    assert_eq!(r.status, 200);

    let list = |q: &str| api.req("GET", "/v1/sandboxes", &[]).query(q).send();
    let r = list("").await;
    assert_eq!((r.status, r.json()["pagination"]["totalItems"].as_u64()), (200, Some(2)));
    let r = list("state=Running&state=paused").await;
    assert_eq!(r.json()["items"].as_array().map(Vec::len), Some(2));
    let r = list("metadata=team%3Da").await;
    assert_eq!(r.json()["items"][0]["id"].as_str(), Some(a.as_str()));
    assert_eq!(r.json()["pagination"]["totalItems"], 1);
    let p1 = list("page=1&pageSize=1").await.json();
    assert_eq!(
        p1["pagination"],
        json!({"page": 1, "pageSize": 1, "totalItems": 2, "totalPages": 2, "hasNextPage": true})
    );
    let p2 = list("page=2&pageSize=1").await.json();
    assert_eq!(
        (p2["pagination"]["hasNextPage"].as_bool(), p2["items"][0]["id"].as_str()),
        (Some(false), Some(b.as_str()))
    );
    assert_eq!(list("page=3&pageSize=1").await.json()["items"], json!([]));
    for bad in ["pageSize=0", "pageSize=201", "page=0"] {
        assert_eq!(list(bad).await.status, 400, "{bad}");
    }
    // A state ember never enters matches nothing (clients must tolerate unknown
    // state names), alone or OR-ed with a known one.
    assert_eq!(list("state=Pausing").await.json()["items"], json!([]));
    assert_eq!(list("state=Pausing&state=Running").await.json()["pagination"]["totalItems"], 2);
    assert_eq!(api.req("GET", "/v1/sandboxes", &[]).bare().send().await.status, 200);
    (a, b)
}

pub(super) async fn change_and_inspect(api: &Api, a: &str, b: &str) {
    let patch = |id: &str, body: &[u8]| {
        api.req("PATCH", "/v1/sandboxes/{id}/metadata", &[id]).raw("application/json", body.to_vec()).send()
    };
    let r = patch(a, br#"{"owner":"me","team":null}"#).await;
    assert_eq!((r.status, &r.json()["metadata"]), (200, &json!({"owner": "me"})));
    let r = patch(b, br#"{"team":null}"#).await;
    assert!(r.json().get("metadata").is_none(), "empty metadata is omitted");
    assert_eq!(patch(a, br#"{"opensandbox.io/x":"y"}"#).await.status, 400);
    assert_eq!(patch(a, b"[1]").await.status, 400);
    assert_eq!(patch("nope", b"{}").await.status, 404);

    let renew = |id: &str, at: &str| {
        api.req("POST", "/v1/sandboxes/{id}/renew-expiration", &[id]).json(json!({ "expiresAt": at })).send()
    };
    let r = renew(a, "2099-01-01T00:00:00Z").await;
    assert_eq!((r.status, r.json()["expiresAt"].as_str()), (200, Some("2099-01-01T00:00:00Z")));
    let r = renew(b, "2099-01-01T00:00:00Z").await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("SANDBOX::NO_EXPIRATION")));
    let r = renew(a, "tomorrow").await;
    assert_eq!((r.status, r.json()["code"].as_str()), (400, Some("SANDBOX::INVALID_EXPIRATION")));
    assert_eq!(renew(a, "2000-01-01T00:00:00Z").await.status, 400);
    assert_eq!(renew("nope", "2099-01-01T00:00:00Z").await.status, 404);
    let r = api.req("POST", "/v1/sandboxes/{id}/renew-expiration", &[a]).json(json!({})).send().await;
    assert_eq!(r.status, 400);

    let endpoint = |id: &str, port: &str| api.req("GET", "/v1/sandboxes/{id}/endpoints/{port}", &[id, port]);
    for port in ["44772", "18080"] {
        let r = endpoint(a, port).query("use_server_proxy=true").send().await;
        let want = format!("{}/v1/sandboxes/{a}/proxy/{port}", api.d.url.trim_start_matches("http://"));
        assert_eq!((r.status, r.json()), (200, json!({ "endpoint": want })));
    }
    assert_eq!(endpoint("nope", "44772").send().await.status, 404);
    assert_eq!(endpoint(a, "not-a-port").send().await.status, 400);
    assert_eq!(endpoint(a, "70000").send().await.status, 400);

    for kind in ["logs", "events"] {
        let t = if kind == "logs" {
            "/v1/sandboxes/{id}/diagnostics/logs"
        } else {
            "/v1/sandboxes/{id}/diagnostics/events"
        };
        let r = api.req("GET", t, &[a]).query("scope=lifecycle").send().await;
        assert_eq!(
            (r.status, r.json()["kind"].as_str(), r.json()["scope"].as_str()),
            (200, Some(kind), Some("lifecycle"))
        );
        assert_eq!(api.req("GET", t, &["nope"]).send().await.status, 404);
    }
    let r = api.req("GET", "/v1/sandboxes/{id}/diagnostics/events", &[a]).send().await;
    assert!(r.json()["content"].as_str().unwrap_or("").contains("Running"), "{}", r.text());
    sandbox_snapshots(api, a).await;

    let r = api.req("GET", "/v1/sandboxes/{id}/boundary", &[a]).send().await;
    assert_eq!((r.status, r.json()["runtimeClass"].as_str()), (200, Some("native")));
    assert_eq!(api.req("GET", "/v1/sandboxes/{id}/boundary", &["nope"]).send().await.status, 404);
    let r = api.req("GET", "/v1/sandboxes/{id}/stats", &[a]).send().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["memoryBytes"].as_u64().is_some_and(|m| m > 0), "{}", r.text());
    assert_eq!(api.req("GET", "/v1/sandboxes/{id}/stats", &["nope"]).send().await.status, 404);
}

/// Sandbox snapshots: create (202 + Location), list, get, restore via
/// `snapshotId`, the refusals, delete (204).
pub(super) async fn sandbox_snapshots(api: &Api, a: &str) {
    let r = api.req("POST", "/v1/sandboxes/{id}/snapshots", &[a]).json(json!({"name": "s1"})).send().await;
    assert_eq!(r.status, 202, "{}", r.text());
    let sid = r.json()["id"].as_str().expect("snapshot id").to_string();
    assert_eq!(r.header("location"), Some(format!("/v1/snapshots/{sid}").as_str()));
    let r = api.req("POST", "/v1/sandboxes/{id}/snapshots", &[a]).bare().send().await;
    assert_eq!(r.status, 202, "no body is fine: {}", r.text());
    let other = r.json()["id"].as_str().expect("snapshot id").to_string();
    assert_eq!(api.req("POST", "/v1/sandboxes/{id}/snapshots", &["nope"]).send().await.status, 404);
    let r = api.req("GET", "/v1/snapshots", &[]).query(&format!("sandboxId={a}&name=s1&state=Ready")).send().await;
    assert_eq!(r.json()["items"][0]["id"], sid.as_str(), "{}", r.text());
    assert_eq!(api.req("GET", "/v1/snapshots", &[]).query("page=0").send().await.status, 400);
    assert_eq!(api.req("GET", "/v1/snapshots/{snapshotId}", &[&sid]).send().await.status, 200);
    assert_eq!(api.req("GET", "/v1/snapshots/{snapshotId}", &["nope"]).bare().send().await.status, 404);
    let r = api.req("POST", "/v1/sandboxes", &[]).json(json!({"snapshotId": sid, "metadata": {"r": "1"}})).send().await;
    assert_eq!(r.status, 202, "{}", r.text());
    let restored = r.json()["id"].as_str().expect("id").to_string();
    assert_eq!(api.req("DELETE", "/v1/sandboxes/{id}", &[&restored]).send().await.status, 204);
    assert_eq!(api.req("DELETE", "/v1/snapshots/{snapshotId}", &[&sid]).send().await.status, 204);
    assert_eq!(api.req("DELETE", "/v1/snapshots/{snapshotId}", &[&other]).bare().send().await.status, 204);
    assert_eq!(api.req("DELETE", "/v1/snapshots/{snapshotId}", &[&sid]).send().await.status, 404);
}

pub(super) async fn pause_resume_and_delete(api: &Api, a: &str, b: &str) {
    let op = |method: &'static str, t: &'static str, id: &str| api.req(method, t, &[id]).send();
    // Checkpoint is runsc-only (bins/ember/tests/checkpoint.rs covers the 202).
    let r = op("POST", "/v1/sandboxes/{id}/checkpoint", a).await;
    assert_eq!((r.status, r.json()["code"].as_str()), (400, Some("SANDBOX::UNSUPPORTED_RUNTIME")));
    assert_eq!(op("POST", "/v1/sandboxes/{id}/checkpoint", "nope").await.status, 404);
    assert_eq!(op("POST", "/v1/sandboxes/{id}/pause", a).await.status, 202);
    assert_eq!(op("GET", "/v1/sandboxes/{id}", a).await.json()["status"]["state"], "Paused");
    let r = op("POST", "/v1/sandboxes/{id}/pause", a).await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("SANDBOX::NOT_RUNNING")));
    let r = op("GET", "/v1/sandboxes/{id}/proxy/44772/ping", a).await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("SANDBOX::NOT_RUNNING")));
    let r = api.req("GET", "/v1/sandboxes", &[]).query("state=Paused").send().await;
    assert_eq!(r.json()["items"][0]["id"].as_str(), Some(a));
    assert_eq!(op("POST", "/v1/sandboxes/{id}/resume", a).await.status, 202);
    let r = op("POST", "/v1/sandboxes/{id}/resume", a).await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("SANDBOX::NOT_PAUSED")));
    assert_eq!(op("POST", "/v1/sandboxes/{id}/pause", "nope").await.status, 404);
    assert_eq!(op("POST", "/v1/sandboxes/{id}/resume", "nope").await.status, 404);
    assert_eq!(api.req("POST", "/v1/sandboxes/{id}/pause", &[b]).bare().send().await.status, 202);

    assert_eq!(op("DELETE", "/v1/sandboxes/{id}", a).await.status, 204);
    assert_eq!(api.req("DELETE", "/v1/sandboxes/{id}", &[b]).bare().send().await.status, 204);
    assert_eq!(op("DELETE", "/v1/sandboxes/{id}", a).await.status, 404);
    assert_eq!(op("GET", "/v1/sandboxes/{id}", b).await.status, 404);
    assert_eq!(api.req("GET", "/v1/sandboxes", &[]).send().await.json()["items"], json!([]));
}

/// A runsc sandbox through checkpoint (202, then 409 while checkpointed) and
/// resume (the restore), then removed.
pub(super) async fn checkpoint_and_restore(api: &Api) {
    let body = json!({"template": "host", "runtimeClass": "runsc", "timeout": 600});
    let r = api.req("POST", "/v1/sandboxes", &[]).json(body).send().await;
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().expect("id").to_string();
    let op = |t: &'static str| api.req("POST", t, &[&id]).send();
    assert_eq!(op("/v1/sandboxes/{id}/checkpoint").await.status, 202);
    let r = op("/v1/sandboxes/{id}/checkpoint").await;
    assert_eq!((r.status, r.json()["code"].as_str()), (409, Some("SANDBOX::NOT_RUNNING")));
    assert_eq!(api.req("GET", "/v1/sandboxes/{id}", &[&id]).send().await.json()["status"]["state"], "Paused");
    assert_eq!(op("/v1/sandboxes/{id}/resume").await.status, 202);
    assert_eq!(api.req("DELETE", "/v1/sandboxes/{id}", &[&id]).send().await.status, 204);
}

pub(super) async fn router_fallbacks(api: &Api, a: &str) {
    for (method, template, args) in [
        ("PUT", "/v1/sandboxes/{id}", vec![a]),
        ("DELETE", "/v1/sandboxes", vec![]),
        ("GET", "/v1/sandboxes/{id}/pause", vec![a]),
        ("GET", "/v1/metrics/events", vec![]),
        ("POST", "/health", vec![]),
    ] {
        let op = &api.doc["paths"][template][method.to_ascii_lowercase()];
        assert!(op.is_null(), "{method} {template} is documented, so 405 would be wrong");
        let r = api.req(method, template, &args).fallback("MethodNotAllowed").send().await;
        assert_eq!(
            (r.status, r.json()["code"].as_str()),
            (405, Some("GENERAL::METHOD_NOT_ALLOWED")),
            "{method} {template}"
        );
    }
    let r = api.req("PUT", "/v1/sandboxes/{id}", &[a]).bare().fallback("MethodNotAllowed").send().await;
    assert_eq!(r.status, 405);
    for path in ["/v1/nope", "/v1", "/v1/sandboxes/x/y/z", "/v2/sandboxes"] {
        let r = api.req("GET", path, &[]).fallback("RouteNotFound").send().await;
        assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("GENERAL::NOT_FOUND")), "{path}");
    }
}

/// `POST /v1/cluster/call` (between a cluster's nodes) on a node on its own:
/// a call runs on its plane; a malformed one is a 400, an unknown id a 404.
pub(super) async fn cluster_call(api: &Api, a: &str) {
    let r = api.req("POST", "/v1/cluster/call", &[]).json(json!({"op": "get", "id": a})).send().await;
    assert_eq!((r.status, r.json()["id"].as_str()), (200, Some(a)));
    let r =
        api.req("POST", "/v1/cluster/call", &[]).json(json!({"op": "list", "states": [], "metadata": []})).send().await;
    assert_eq!(r.status, 200);
    assert!(r.json().as_array().is_some_and(|l| l.iter().any(|s| s["id"] == a)), "{}", r.text());
    let r = api.req("POST", "/v1/cluster/call", &[]).json(json!({"op": "nope"})).send().await;
    assert_eq!(r.status, 400);
    let missing = "00000000-0000-4000-8000-000000000000";
    let r = api.req("POST", "/v1/cluster/call", &[]).json(json!({"op": "get", "id": missing})).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("SANDBOX::NOT_FOUND")));
}
