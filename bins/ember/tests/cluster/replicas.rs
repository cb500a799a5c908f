//! The replicas of what ember makes in the cluster are the cluster's, not
//! those of the URLs a node was given: a node given one server of three
//! made the buckets it opened first R1 on that server, and when it stopped
//! no rebind could be written (the rebind tests, in CI). A bucket an
//! earlier node made R1 is raised to R3 by the next node that opens it.
use super::common::Daemon;
use super::nats;
use serde_json::Value;
use std::time::{Duration, Instant};

/// `$JS.API.STREAM.INFO` of `stream`, asked through any server.
fn info(cluster: &nats::NatsCluster, stream: &str) -> Value {
    nats::request(&cluster.urls(), &format!("$JS.API.STREAM.INFO.{stream}")).expect("stream info")
}

#[test]
fn a_node_given_one_server_of_three_keeps_everything_r3_and_raises_an_r1_bucket() {
    let cluster = nats::NatsCluster::start("replicas", 3);
    let urls = cluster.urls();
    // The rebind bucket as a node given one URL made it before: R1.
    let r1 = serde_json::json!({
        "name": "KV_ember_rebind", "subjects": ["$KV.ember_rebind.>"], "storage": "file",
        "num_replicas": 1, "max_msgs_per_subject": 1, "discard": "new", "allow_rollup_hdrs": true,
        "deny_delete": true, "allow_direct": true,
    });
    let made = nats::request_with(&urls, "$JS.API.STREAM.CREATE.KV_ember_rebind", &r1.to_string()).expect("create");
    assert!(made["error"].is_null(), "{made}");
    assert_eq!(info(&cluster, "KV_ember_rebind")["config"]["num_replicas"], 1);

    let key = cluster.dir.join("snapshot.key");
    ember_snapshot::ManifestKey::load_or_create(&key).expect("a manifest key");
    let key = key.to_str().expect("a UTF-8 temp path");
    let _a = Daemon::start_with(&["--cluster", urls[0].as_str(), "--node", "a", "--snapshot-key-file", key]);

    // What a node opens as it joins (it answers before it has): registries,
    // the task queue, tenants, the snapshot store; each made R3, and R3 and
    // read from its leader once settled.
    let must =
        ["KV_ember_nodes", "KV_ember_rebind", "KV_ember_tenant_usage", "EMBER_TASKS_STANDARD", "OBJ_ember_snapshots"];
    let start = Instant::now();
    loop {
        let names = nats::request(&urls, "$JS.API.STREAM.NAMES").expect("stream names");
        let names: Vec<String> =
            names["streams"].as_array().expect("a list").iter().filter_map(|s| s.as_str().map(String::from)).collect();
        let missing: Vec<&str> = must.iter().copied().filter(|m| !names.iter().any(|n| n == m)).collect();
        let unsettled: Vec<String> = names
            .iter()
            .map(|name| (name, info(&cluster, name)["config"].clone()))
            .filter(|(_, c)| c["num_replicas"] != 3 || c["allow_direct"] == true)
            .map(|(name, c)| format!("{name}: R{} direct {}", c["num_replicas"], c["allow_direct"]))
            .collect();
        if missing.is_empty() && unsettled.is_empty() {
            break;
        }
        let late = start.elapsed() > Duration::from_secs(60);
        assert!(!late, "missing {missing:?}; not R3 or read from any replica: {unsettled:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
