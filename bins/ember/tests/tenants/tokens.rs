//! Scoped tokens are durable: a daemon restart (SIGKILL) keeps every live
//! token, hashed on disk like the keys; the sandbox's removal still ends them.
use super::{call, create_sandbox, exec, tenant};
use crate::common::Daemon;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scoped_tokens_survive_a_restart_and_still_die_with_their_sandbox() {
    let mut d = Daemon::start_with(&["--api-key", super::ADMIN]);
    let key = tenant(&d, "tr", json!({})).await;
    let (s, b) = create_sandbox(&d, &key, json!({})).await;
    assert_eq!(s, 202, "{b}");
    let id = b["id"].as_str().expect("id").to_string();
    let (s, t) = call(&d, &key, "POST", &format!("/v1/sandboxes/{id}/tokens"), Some(json!({"scope": "exec"}))).await;
    assert_eq!(s, 201, "{t}");
    let token = t["token"].as_str().expect("token").to_string();
    assert_eq!(exec(&d, ("OPEN-SANDBOX-API-KEY", &token), &id).await, 200);
    // Only the hash is on disk.
    let dir = d.data_dir.join("tenants/tokens");
    let files: Vec<String> = std::fs::read_dir(&dir)
        .expect("token records")
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).expect("record"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].contains(&id) && !files[0].contains(&token[4..]), "{}", files[0]);
    d.kill9();
    d.spawn();
    assert_eq!(exec(&d, ("OPEN-SANDBOX-API-KEY", &token), &id).await, 200, "the token died with the daemon");
    // Its scope came back with it.
    let c = ember_client::Client::new(&d.url, Some(token.clone())).expect("client");
    let up = c.upload(&id, "/tmp/t.txt", bytes::Bytes::from_static(b"x"), 0o644).await;
    assert!(up.is_err_and(|e| e.to_string().contains("403")), "an exec token wrote a file after the restart");
    assert_eq!(call(&d, &key, "DELETE", &format!("/v1/sandboxes/{id}"), None).await.0, 204);
    assert_eq!(exec(&d, ("OPEN-SANDBOX-API-KEY", &token), &id).await, 401);
    // A removed record's files stay as spares for the next records (engine
    // `store/spares.rs`), zeroed: no record, and no hash left in them.
    for e in std::fs::read_dir(&dir).expect("token records").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(name.starts_with(".spare-"), "the removed sandbox's token record stays: {name}");
        let bytes = std::fs::read(e.path()).expect("spare");
        assert!(bytes.iter().all(|&b| b == 0), "spare {name} still holds a record's bytes");
    }
    d.kill9();
    d.spawn();
    assert_eq!(exec(&d, ("OPEN-SANDBOX-API-KEY", &token), &id).await, 401, "a revoked token came back");
}
