//! Cluster mode end to end: a real 3-server NATS JetStream cluster and real
//! `ember serve --cluster` nodes on loopback (own data dirs, cgroup parents,
//! ports). A sandbox created through one node is reached through another:
//! lifecycle calls forwarded, exec, files and a PTY over the proxied
//! WebSocket; lists merge the nodes; a SIGKILLed node is noticed dead; an
//! `--api-only` node places a create on a node that runs sandboxes. Tasks
//! (`cluster/tasks.rs`): one queue for the
//! cluster, logs read through any node, a SIGKILLed node's tasks re-run.
//! Rebind (`cluster/rebind.rs`): workspaces claimed once cluster-wide,
//! checkpointed to a shared store, sessions re-created on a live node.
//! Snapshots (`cluster/snapshots.rs`): one store for the cluster.
//! The NATS servers (`cluster/servers.rs`): R3 on three servers, whatever
//! URLs a node was given; a node whose server goes silent moves to another.
//! Pools (`cluster/pools.rs`): desired state kept across nodes, warm claims
//! asked of the nodes with a member over NATS. Tenants (`cluster/tenants.rs`): a tenant's
//! sandbox quotas held across nodes; (`cluster/tenant_state.rs`) tenants,
//! keys, owners and tokens the cluster's. The dashboard (`cluster/ui.rs`):
//! the node list in headless Chromium.
mod common;
#[path = "cluster/hold.rs"]
mod hold;
#[path = "../../../crates/ember-cluster/tests/common/mod.rs"]
mod nats;
#[path = "cluster/pools.rs"]
mod pools;
#[path = "cluster/rebind.rs"]
mod rebind;
#[path = "cluster/rebind_many.rs"]
mod rebind_many;
#[path = "cluster/servers.rs"]
mod servers;
#[path = "cluster/snapshots.rs"]
mod snapshots;
#[path = "cluster/tasks.rs"]
mod tasks;
#[path = "cluster/tenant_state.rs"]
mod tenant_state;
#[path = "cluster/tenants.rs"]
mod tenants;
#[path = "cluster/ui.rs"]
mod ui;

use bytes::Bytes;
use common::Daemon;
use ember_client::ClientError;
use ember_client::PtyEvent;
use std::time::{Duration, Instant};

/// A node of `cluster`: the cluster's manifest key (one file beside the
/// servers, shared by every node: their snapshots share the cluster's store).
fn node(cluster: &nats::NatsCluster, name: &str, extra: &[&str]) -> Daemon {
    let urls = cluster.urls().join(",");
    let key = cluster.dir.join("snapshot.key");
    ember_snapshot::ManifestKey::load_or_create(&key).expect("the cluster's manifest key");
    let key = key.to_str().expect("a UTF-8 temp path");
    let mut args = vec!["--cluster", urls.as_str(), "--node", name, "--snapshot-key-file", key];
    args.extend_from_slice(extra);
    Daemon::start_with(&args)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// Polls `f` until it returns `Some`, for at most `within` (a bound on a
/// hang, never a timing assertion).
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    within: Duration,
    what: &str,
    f: impl Fn() -> F,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of a node's metric `name` (a counter or a gauge without
/// labels) as its `/metrics` prints it; `None` when it has none.
async fn metric(d: &Daemon, name: &str) -> Option<String> {
    let addr = d.url.trim_start_matches("http://").to_string();
    let (_, _, metrics) =
        common::raw::exchange(&addr, "GET /metrics", &[format!("Host: {addr}")], "", Duration::from_secs(60)).await;
    let line = metrics.lines().find(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ')))?;
    line.rsplit(' ').next().map(String::from)
}

async fn ids(d: &Daemon) -> Option<Vec<String>> {
    d.client.list_sandboxes("").await.ok().map(|l| l.into_iter().map(|s| s.id).collect())
}

#[test]
fn a_sandbox_is_reached_through_a_node_that_does_not_own_it() {
    let nats = nats::NatsCluster::start("routing", 3);
    // One API key for the cluster: forwarded calls and proxied requests carry it.
    let keyed = ["--api-key", "cluster-k3y"];
    let mut a = node(&nats, "a", &keyed);
    let mut b = node(&nats, "b", &keyed);
    for d in [&mut a, &mut b] {
        d.client = ember_client::Client::new(&d.url, Some("cluster-k3y".into())).expect("client");
    }
    runtime().block_on(async {
        let on_a = a.create(|_| {}).await.id;
        let on_b = b.create(|_| {}).await.id;
        // Both nodes list both sandboxes once they see each other's heartbeat.
        for d in [&a, &b] {
            eventually(Duration::from_secs(20), "a merged list", || async {
                ids(d).await.filter(|l| l.contains(&on_a) && l.contains(&on_b))
            })
            .await;
        }

        let anonymous = ember_client::Client::new(&b.url, None).expect("client");
        let refused = anonymous.get_sandbox(&on_a).await.expect_err("no key");
        assert!(matches!(refused, ClientError::Api { status: 401, .. }), "{refused:?}");

        // Lifecycle through B, forwarded to A.
        let got = b.client.get_sandbox(&on_a).await.expect("get through b");
        assert_eq!(got.status.state, "Running");
        // An owner's error reaches B's client with the owner's code and message.
        let direct = a.client.resume_sandbox(&on_a).await.expect_err("resume of a running sandbox");
        let routed = b.client.resume_sandbox(&on_a).await.expect_err("resume through b");
        assert!(matches!(&routed, ClientError::Api { status: 409, .. }), "{routed:?}");
        assert_eq!(routed.to_string(), direct.to_string());
        let missing = b.client.get_sandbox("00000000-0000-4000-8000-000000000000").await.expect_err("unknown id");
        assert!(matches!(&missing, ClientError::Api { status: 404, code, .. } if code == "SANDBOX::NOT_FOUND"));

        // Exec and files through B's proxy, spliced to A's.
        let (code, out, _) = b.sh(&on_a, "echo routed; hostname", None).await;
        assert_eq!(code, Some(0));
        assert!(out.starts_with("routed\n"), "{out:?}");
        let data = Bytes::from((0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
        b.client.upload(&on_a, "/tmp/through-b.bin", data.clone(), 0o644).await.expect("upload through b");
        let (_, sum, _) = a.sh(&on_a, "wc -c < /tmp/through-b.bin", None).await;
        assert_eq!(sum.trim(), "200000");
        assert_eq!(b.client.download(&on_a, "/tmp/through-b.bin").await.expect("download through b"), data);

        // A terminal session over B's proxied WebSocket.
        let sid = b.client.create_pty(&on_a, None, None).await.expect("pty through b");
        let mut term = b.client.connect_pty(&on_a, &sid, true, 0, false).await.expect("attach through b");
        term.stdin(b"echo pty-$((6*7))\n").await.expect("type");
        let mut seen = String::new();
        while !seen.contains("pty-42") {
            match tokio::time::timeout(Duration::from_secs(20), term.next()).await.expect("terminal output") {
                Ok(PtyEvent::Stdout(b)) => seen.push_str(&String::from_utf8_lossy(&b)),
                other => panic!("terminal ended: {other:?} after {seen:?}"),
            }
        }
        term.detach().await;
        b.client.delete_pty(&on_a, &sid).await.expect("end the session");

        // Removal through B, forwarded.
        let gone = a.create(|_| {}).await.id;
        b.client.delete_sandbox(&gone).await.expect("remove through b");
        let err = a.client.get_sandbox(&gone).await.expect_err("removed on a");
        assert!(matches!(err, ClientError::Api { status: 404, .. }), "{err:?}");

        // SIGKILL B: a call naming its sandbox is a 503 at once (connection
        // refused) and after B is noticed dead; A stops listing B's sandbox
        // once B's heartbeat lapses.
        b.kill9();
        let killed = Instant::now();
        let err = a.client.get_sandbox(&on_b).await.expect_err("a just-killed node's sandbox");
        assert_node_unavailable(&err, "b");
        // So is a request through the agent proxy (it was a 502
        // `SANDBOX::AGENT_UNREACHABLE`, which no client retries).
        let err = a.client.download(&on_b, "/etc/hostname").await.expect_err("a file from a just-killed node");
        assert_node_unavailable(&err, "b");
        eventually(Duration::from_secs(20), "b noticed dead", || async {
            ids(&a).await.filter(|l| l.contains(&on_a) && !l.contains(&on_b))
        })
        .await;
        eprintln!("MTTD: node b's death noticed by node a after {:?}", killed.elapsed());
        let err = a.client.get_sandbox(&on_b).await.expect_err("a dead node's sandbox");
        assert_node_unavailable(&err, "b");
        assert!(matches!(&err, ClientError::Api { message, .. } if message.contains("dead")), "{err:?}");
    });
}

/// A node that stops answering mid-call (SIGSTOP: its socket still
/// accepts, nothing answers; a cut link looks the same) ends the calls
/// forwarded to it with a 503 naming it dead once the registry takes it
/// for dead, which clients retry. The partition drill's calls waited the
/// forward's whole deadline (300 s, "no answer within 300s").
#[test]
fn a_call_to_a_node_that_stops_answering_ends_when_it_is_judged_dead() {
    let nats = nats::NatsCluster::start("mid-call", 3);
    let a = node(&nats, "a", &[]);
    let b = node(&nats, "b", &[]);
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill").args([sig, &a.pid().to_string()]).status();
        assert!(ok.is_ok_and(|s| s.success()), "kill {sig}");
    };
    runtime().block_on(async {
        let id = a.create(|_| {}).await.id;
        eventually(Duration::from_secs(60), "b routes to a", || async { b.client.get_sandbox(&id).await.ok() }).await;
        signal("-STOP");
        let got = b.client.get_sandbox(&id).await;
        signal("-CONT");
        let err = got.expect_err("a frozen node's sandbox");
        assert_node_unavailable(&err, "a");
        assert!(matches!(&err, ClientError::Api { message, .. } if message.contains("dead")), "{err:?}");
    });
}

/// An owner that accepts the proxy's connection and then resets it (a node
/// SIGKILLed while its listener still queued connections: the drill's run HD
/// saw three) fails the proxied call with a 503 naming the node, which
/// clients retry, not a 502 `SANDBOX::AGENT_UNREACHABLE`, which none does.
/// The reset is real: an nftables rule of the test's own answers every
/// packet carrying data to b's port with a TCP reset (the handshake passes).
#[test]
fn a_proxied_call_whose_owner_resets_the_connection_is_a_503() {
    let nats = nats::NatsCluster::start("reset", 3);
    let a = node(&nats, "a", &[]);
    let b = node(&nats, "b", &[]);
    runtime().block_on(async {
        let on_b = b.create(|_| {}).await.id;
        eventually(Duration::from_secs(60), "a routes to b", || async { a.client.get_sandbox(&on_b).await.ok() }).await;
        let port = b.url.rsplit(':').next().expect("b's port").trim_end_matches('/').to_string();
        let _rule = ResetRule::add(&port);
        let err = a.client.download(&on_b, "/etc/hostname").await.expect_err("a file from a node that resets");
        assert_node_unavailable(&err, "b");
        assert!(matches!(&err, ClientError::Api { message, .. } if message.contains("request")), "{err:?}");
    });
}

/// An nftables table answering data sent to a local TCP port with a reset;
/// deleted when dropped.
struct ResetRule(String);

impl ResetRule {
    fn add(port: &str) -> ResetRule {
        let table = format!("ember_reset_{}", std::process::id());
        let nft = |args: &[&str]| {
            let out = std::process::Command::new("nft").args(args).output().expect("nft");
            assert!(out.status.success(), "nft {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let rule = ResetRule(table.clone());
        nft(&["add", "table", "inet", &table]);
        nft(&["add", "chain", "inet", &table, "in", "{ type filter hook input priority -10; }"]);
        // Not the SYN, not a bare ACK (no data): the connection is made, and
        // its first request is answered with a reset.
        let spec = format!("tcp dport {port} tcp flags != syn ip length > 52 reject with tcp reset");
        let mut args = vec!["add", "rule", "inet", &table, "in"];
        args.extend(spec.split(' '));
        nft(&args);
        rule
    }
}

impl Drop for ResetRule {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nft").args(["delete", "table", "inet", &self.0]).output();
    }
}

/// A 503 `CLUSTER::NODE_UNAVAILABLE` naming `node`.
fn assert_node_unavailable(err: &ClientError, node: &str) {
    let ok = matches!(err, ClientError::Api { status: 503, code, message, .. }
        if code == "CLUSTER::NODE_UNAVAILABLE" && message.contains(&format!("node {node} ")));
    assert!(ok, "{err:?}");
}

#[test]
fn an_api_only_node_places_a_create_on_a_node_that_runs_sandboxes() {
    let nats = nats::NatsCluster::start("api-only", 3);
    let worker = node(&nats, "worker", &[]);
    let router = node(&nats, "router", &["--api-only"]);
    runtime().block_on(async {
        let req = ember_types::api::CreateSandboxRequest { template: Some("host".into()), ..Default::default() };
        let id = eventually(Duration::from_secs(20), "a create through the router", || async {
            match router.client.create_sandbox(&req).await {
                Ok((s, _)) => Some(s.id),
                Err(ClientError::Api { message, .. }) if message.contains("no live node") => None,
                Err(e) => panic!("create through the router: {e}"),
            }
        })
        .await;
        // It runs on the worker: the router's data dir holds no sandbox.
        assert_eq!(worker.client.get_sandbox(&id).await.expect("on the worker").status.state, "Running");
        let here = std::fs::read_dir(router.data_dir.join("sandboxes")).map(|d| d.count()).unwrap_or(0);
        assert_eq!(here, 0, "the api-only node runs no sandbox");
        let (code, out, _) = router.sh(&id, "echo via-router", None).await;
        assert_eq!((code, out.as_str()), (Some(0), "via-router\n"));
        assert_eq!(ids(&router).await.expect("list through the router"), vec![id.clone()]);
        router.client.delete_sandbox(&id).await.expect("remove through the router");
    });
}

/// The node registry's stream loses its leader (SIGKILL of that NATS
/// server): no heartbeat gets through until the election ends (seconds,
/// longer than the time after which a silent node is dead), so every node
/// is silent alike. No node may be taken for dead meanwhile: A keeps listing
/// B's sandbox through the whole election.
#[test]
fn an_election_of_the_node_registry_takes_no_node_for_dead() {
    let mut nats = nats::NatsCluster::start("election", 3);
    let a = node(&nats, "a", &[]);
    let b = node(&nats, "b", &[]);
    let rt = runtime();
    let on_b = rt.block_on(async {
        let id = b.create(|_| {}).await.id;
        eventually(Duration::from_secs(20), "a lists b's sandbox", || async {
            ids(&a).await.filter(|l| l.contains(&id))
        })
        .await;
        id
    });
    let info = "$JS.API.STREAM.INFO.KV_ember_nodes";
    let old = nats.stream_leader("KV_ember_nodes");
    nats.kill(&old);
    let killed = Instant::now();
    let mut checks = 0;
    loop {
        let listed = rt.block_on(ids(&a));
        assert!(
            listed.as_ref().is_some_and(|l| l.contains(&on_b)),
            "after {:?} of the election, a lists {listed:?} without b's sandbox {on_b}",
            killed.elapsed()
        );
        checks += 1;
        let leader = nats::request(&nats.urls_running(), info)
            .ok()
            .and_then(|v| v["cluster"]["leader"].as_str().map(str::to_string));
        if leader.is_some_and(|l| l != old) {
            break;
        }
        assert!(killed.elapsed() < Duration::from_secs(60), "no new leader of the node registry");
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("election of the node registry: {:?}, a's list checked {checks} times", killed.elapsed());
}

/// The sandbox registry's stream loses its leader: a non-owner that has to
/// find a sandbox in it waits through the election (latency), and answers.
#[test]
fn a_call_through_the_non_owner_waits_through_an_election_of_the_sandbox_registry() {
    let mut nats = nats::NatsCluster::start("registry-election", 3);
    let a = node(&nats, "a", &[]);
    let b = node(&nats, "b", &[]);
    let rt = runtime();
    let on_b = rt.block_on(async {
        let id = b.create(|_| {}).await.id;
        eventually(Duration::from_secs(20), "a lists b's sandbox", || async {
            ids(&a).await.filter(|l| l.contains(&id))
        })
        .await;
        id
    });
    let old = nats.stream_leader("KV_ember_sandboxes");
    nats.kill(&old);
    let killed = Instant::now();
    rt.block_on(async {
        let got = a.client.get_sandbox(&on_b).await.expect("get through the non-owner during the election");
        assert_eq!(got.status.state, "Running");
    });
    eprintln!("get through the non-owner answered {:?} after the registry leader's kill", killed.elapsed());
}
