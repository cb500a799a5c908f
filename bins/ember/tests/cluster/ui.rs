//! The dashboard's node list on a cluster node (`/ui`, `#nodelist`), in
//! headless Chromium (`ui/nodes.js`): both nodes live with their free memory
//! and sandbox counts, then the one killed shown dead. Screenshots go to
//! target/ui-screenshots.
use super::{node, runtime};
use crate::common::{playwright_dir, repo};
use crate::nats;
use std::process::Command;

/// Runs `ui/nodes.js` against `url` until the node list shows `want`
/// (`name=live|dead:sandboxes,...`); the rows it saw.
fn dashboard_shows(url: &str, shot: &str, want: &str) -> String {
    let shots = repo().join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    let shot = shots.join(format!("{shot}.png"));
    let out = Command::new("node")
        .arg(repo().join("bins/ember/tests/ui/nodes.js"))
        .args([url, shot.to_str().expect("utf-8"), want])
        .env("NODE_PATH", playwright_dir().join("node_modules"))
        .output()
        .expect("run node");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("\"ok\":true"), "the driver ({want}) failed:\n{stdout}\n{stderr}");
    assert!(std::fs::metadata(&shot).is_ok_and(|m| m.len() > 0), "screenshot {}", shot.display());
    stdout.into_owned()
}

#[test]
fn the_dashboard_lists_the_clusters_nodes_with_capacity_liveness_and_sandboxes() {
    assert!(std::path::Path::new("/usr/bin/chromium").exists(), "no /usr/bin/chromium (.ci/run installs it)");
    let nats = nats::NatsCluster::start("ui-nodes", 3);
    let a = node(&nats, "a", &["--ui"]);
    let mut b = node(&nats, "b", &["--ui"]);
    let on_a = runtime().block_on(a.create(|_| {})).id;
    let shown = dashboard_shows(&a.url, "cluster-0-nodes", "a=live:1,b=live:0");
    assert!(shown.contains(&b.url), "b's API address is shown: {shown}");
    b.kill9();
    dashboard_shows(&a.url, "cluster-1-node-dead", "a=live:1,b=dead:0");
    runtime().block_on(a.client.delete_sandbox(&on_a)).expect("remove");
}
