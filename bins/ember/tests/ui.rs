//! The `/ui` dashboard in headless Chromium (Debian's `chromium`, driven by
//! npm's `playwright-core`: `ui/driver.js`) against a real daemon with an API
//! key, a warm pool and sandboxes: the login exchange, the pool row's idle
//! count, an SSE update after a claim, a terminal into the claimed sandbox
//! that echoes what is typed, the boundary and the reports. Screenshots go
//! to target/ui-screenshots.
mod common;

use common::{playwright_dir, repo, Daemon};
use std::process::Command;

const KEY: &str = "ui-test-key";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_pools_updates_live_and_opens_a_terminal() {
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists(),
        "no /usr/bin/chromium: install Debian's chromium (.ci/run does)"
    );
    let modules = playwright_dir().join("node_modules");
    let reports = std::env::temp_dir().join(format!("ember-ui-reports-{}", std::process::id()));
    std::fs::create_dir_all(&reports).expect("reports dir");
    std::fs::write(reports.join("lab-ui.md"), "# a lab report\n").expect("a report");
    let r = reports.to_str().expect("utf-8 path");
    let mut d = Daemon::start_with(&["--ui", "--ui-reports", r, "--api-key", KEY]);
    d.client = ember_client::Client::new(&d.url, Some(KEY.into())).expect("client with the key");

    // Without a session: the page sends the browser to the login, the
    // event stream is a structured 401.
    let anon = ember_client::Client::new(&d.url, None).expect("client");
    let (status, body) = anon.get_raw("/ui/events").await.expect("events");
    assert_eq!(status.as_u16(), 401, "{}", String::from_utf8_lossy(&body));
    let err: serde_json::Value = serde_json::from_slice(&body).expect("a JSON error");
    assert_eq!(err["code"], "MISSING_API_KEY");

    // The login: a wrong key is the API's 401, a foreign page's post a 403,
    // and no cookie is set by either.
    let addr = d.url.trim_start_matches("http://").to_string();
    let host = format!("Host: {addr}");
    let form = ["Content-Type: application/x-www-form-urlencoded".to_string(), host.clone()];
    let hang = std::time::Duration::from_secs(30);
    let (status, head, _) = common::raw::exchange(&addr, "POST /ui/login", &form, "key=wrong", hang).await;
    assert!(status == 401 && !head.contains("set-cookie"), "{status} {head}");
    let foreign = [form[0].clone(), form[1].clone(), "Origin: http://8080-x.sb.example".to_string()];
    let (status, head, body) = common::raw::exchange(&addr, "POST /ui/login", &foreign, "key=ui-test-key", hang).await;
    assert!(status == 403 && body.contains("GENERAL::CROSS_ORIGIN") && !head.contains("set-cookie"), "{status} {body}");
    let (status, head, _) = common::raw::exchange(&addr, "POST /ui/login", &form, "key=ui-test-key", hang).await;
    assert!(status == 303 && head.contains("set-cookie: ember_ui="), "{status} {head}");
    assert!(head.contains("httponly") && head.contains("samesite=strict") && head.contains("path=/ui"), "{head}");

    let cold = d.create(|_| {}).await;
    d.warm_pool(2).await;
    let shots = repo().join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    let mut node = Command::new("node");
    node.arg(repo().join("bins/ember/tests/ui/driver.js"))
        .args([d.url.as_str(), KEY, shots.to_str().expect("utf-8"), "2", "lab-ui.md"])
        .env("NODE_PATH", &modules);
    // The daemon runs in its own process: blocking this thread stalls nothing.
    let out = tokio::task::spawn_blocking(move || node.output()).await.expect("join").expect("run node");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the driver failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("\"ok\":true"), "{stdout}");
    for s in ["0-login", "1-pools", "2-claimed", "3-terminal", "4-boundary"] {
        let p = shots.join(format!("{s}.png"));
        assert!(std::fs::metadata(&p).is_ok_and(|m| m.len() > 0), "screenshot {}", p.display());
    }
    d.client.delete_sandbox(&cold.id).await.expect("remove the cold sandbox");
    let _ = std::fs::remove_dir_all(&reports);
}
