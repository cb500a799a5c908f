//! The execd protocol through the daemon's proxy route: commands, sessions,
//! files, code contexts, metrics and the PTY routes.
use super::*;

pub(super) async fn execd_through_the_proxy(api: &Api, a: &str) {
    let x = |method: &'static str, op: &'static str| api.req(method, op, &[a]);
    let r = x("GET", "/v1/sandboxes/{id}/proxy/44772/ping").send().await;
    assert_eq!((r.status, r.body.len()), (200, 0));

    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/command")
        .json(json!({"command": "echo hi; echo oops >&2"}))
        .send()
        .await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").is_some_and(|c| c.starts_with("text/event-stream")));
    let frames: Vec<Value> =
        r.text().split("\n\n").filter(|f| !f.is_empty()).map(|f| serde_json::from_str(f).unwrap()).collect();
    let kinds: Vec<&str> = frames.iter().filter_map(|f| f["type"].as_str()).filter(|k| *k != "ping").collect();
    assert_eq!(kinds.first(), Some(&"init"));
    assert_eq!(kinds.last(), Some(&"execution_complete"));
    assert!(frames.iter().any(|f| f["type"] == "stdout" && f["text"] == "hi"));
    let cid = frames[0]["text"].as_str().expect("init carries the command id").to_string();
    let r =
        x("POST", "/v1/sandboxes/{id}/proxy/44772/command").json(json!({"argv": ["sh", "-c", "exit 3"]})).send().await;
    assert!(r.text().contains(r#""evalue":"3""#), "{}", r.text());
    let r =
        x("POST", "/v1/sandboxes/{id}/proxy/44772/command").json(json!({"command": "x", "argv": ["y"]})).send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (400, Some("INVALID_REQUEST_BODY")));

    let status =
        |id: &str| api.req("GET", "/v1/sandboxes/{id}/proxy/44772/command/status/{commandId}", &[a, id]).send();
    let s = status(&cid).await.json();
    assert_eq!((s["running"].as_bool(), s["exit_code"].as_i64()), (Some(false), Some(0)));
    assert_eq!(status("no-such-command").await.status, 404);
    let r = api.req("GET", "/v1/sandboxes/{id}/proxy/44772/command/{commandId}/logs", &[a, &cid]).send().await;
    assert!(r.status == 200 && r.text().contains("hi"), "{}", r.text());
    let r = x("DELETE", "/v1/sandboxes/{id}/proxy/44772/command").query(&format!("id={cid}")).send().await;
    assert_eq!(r.status, 200);
    assert_eq!(x("DELETE", "/v1/sandboxes/{id}/proxy/44772/command").send().await.status, 400);

    let body = multipart("XyZ", "/tmp/oa/a.txt", "hello openapi\n");
    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/files/upload")
        .raw("multipart/form-data; boundary=XyZ", body)
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/files/upload")
        .raw("multipart/form-data; boundary=XyZ", b"--XyZ--\r\n".to_vec())
        .send()
        .await;
    assert_eq!(r.status, 400);
    let dl = |q: &str| x("GET", "/v1/sandboxes/{id}/proxy/44772/files/download").query(q);
    let r = dl("path=/tmp/oa/a.txt").send().await;
    assert_eq!((r.status, r.text().as_str()), (200, "hello openapi\n"));
    let r = dl("path=/tmp/oa/a.txt").header("Range", "bytes=0-4").send().await;
    assert_eq!((r.status, r.text().as_str(), r.header("content-range")), (206, "hello", Some("bytes 0-4/14")));
    assert_eq!(dl("path=/tmp/oa/a.txt").header("Range", "bytes=99-").send().await.status, 416);
    assert_eq!(dl("path=/tmp/oa/a.txt&offset=1&limit=1").send().await.status, 200);
    assert_eq!(dl("path=/tmp/oa/missing").send().await.status, 404);
    assert_eq!(dl("").send().await.status, 400);

    let r = x("GET", "/v1/sandboxes/{id}/proxy/44772/files/info").query("path=/tmp/oa/a.txt").send().await;
    assert_eq!((r.status, r.json()["/tmp/oa/a.txt"]["mode"].as_u64()), (200, Some(644)));
    let r =
        x("POST", "/v1/sandboxes/{id}/proxy/44772/directories").json(json!({"/tmp/oa/d": {"mode": 700}})).send().await;
    assert_eq!(r.status, 200);
    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/files/permissions")
        .json(json!({"/tmp/oa/a.txt": {"mode": 600}}))
        .send()
        .await;
    assert_eq!(r.status, 200);
    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/files/replace")
        .query("verbose=true")
        .json(json!({"/tmp/oa/a.txt": {"old": "hello", "new": "bye"}}))
        .send()
        .await;
    assert_eq!((r.status, r.json()), (200, json!({"/tmp/oa/a.txt": {"replacedCount": 1}})));
    let r = x("POST", "/v1/sandboxes/{id}/proxy/44772/files/mv")
        .json(json!([{"src": "/tmp/oa/a.txt", "dest": "/tmp/oa/d/b.txt"}]))
        .send()
        .await;
    assert_eq!(r.status, 200);
    let r = x("GET", "/v1/sandboxes/{id}/proxy/44772/directories/list").query("path=/tmp/oa&depth=2").send().await;
    assert_eq!((r.status, r.json().as_array().map(Vec::len)), (200, Some(2)));
    let r = x("GET", "/v1/sandboxes/{id}/proxy/44772/files/search").query("path=/tmp/oa&pattern=*.txt").send().await;
    assert_eq!((r.status, r.json()[0]["path"].as_str()), (200, Some("/tmp/oa/d/b.txt")));
    assert_eq!(
        x("GET", "/v1/sandboxes/{id}/proxy/44772/directories/list").query("path=/tmp/nope").send().await.status,
        404
    );
    assert_eq!(
        x("DELETE", "/v1/sandboxes/{id}/proxy/44772/files").query("path=/tmp/oa/d/b.txt").send().await.status,
        200
    );
    assert_eq!(
        x("DELETE", "/v1/sandboxes/{id}/proxy/44772/directories").query("path=/tmp/oa").send().await.status,
        200
    );
    assert_eq!(x("GET", "/v1/sandboxes/{id}/proxy/44772/metrics").send().await.status, 200);

    // The generic proxy route: unknown agent path, other ports, bad port, unknown sandbox.
    let proxy =
        |id: &str, port: &str, rest: &str| api.req("GET", "/v1/sandboxes/{id}/proxy/{port}/{path}", &[id, port, rest]);
    let r = proxy(a, "44772", "no/such/route").send().await;
    assert_eq!((r.status, r.json()["code"].as_str()), (404, Some("NOT_SUPPORTED")));
    // Port 18080 is the egress port, answered by the daemon; any other port goes
    // through the agent to 127.0.0.1:port in the sandbox (nothing listens: 502).
    let r = proxy(a, "18080", "policy").send().await;
    assert_eq!((r.status, r.json()["enforcementMode"].as_str()), (200, Some("none")));
    let r = proxy(a, "18080", "credential-vault").send().await;
    assert_eq!(r.status, 404);
    let r = proxy(a, "8080", "x").send().await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(proxy(a, "port", "ping").send().await.status, 400);
    assert_eq!(proxy("nope", "44772", "ping").send().await.status, 404);
    assert_eq!(api.req("GET", "/v1/sandboxes/{id}/proxy/{port}", &[a, "44772"]).send().await.status, 404);
    assert_eq!(api.req("POST", "/v1/sandboxes/{id}/proxy/{port}", &[a, "8080"]).send().await.status, 502);
}
