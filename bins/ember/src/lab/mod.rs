//! `ember lab`: the labs of issue 17, runnable. Each lab breaks something
//! first (the baseline), then runs the same workload through the ember
//! component that answers it, and measures both in the same run.
//!
//! Layout: `report.rs` (the report every lab writes: tables, invariants,
//! charts → `report.md`, `report.json`; `ember lab report` over a folder of
//! runs), `svg.rs` (hand-written bar and line charts), one file per lab
//! (`shared*.rs` + `worker.rs`: lab 1; `ondemand.rs`: lab 2's node leg, `ondemand_k8s.rs` + `k8s_cost.rs`: its Kubernetes leg; `pool*.rs`: lab 3; `workspace.rs`: lab 4; `pushpull.rs`, `push.rs`, `pull.rs`: lab 5; `isolation.rs`: lab 6).
//!
//! The labs talk to the daemon at `--url` through ember-client only, like
//! `ember bench`: a lab measures the user's own node as it is configured
//! (its runtime, its templates), and starting a daemon of its own would mean
//! duplicating `ember serve`'s root setup (agent, data dir, cgroup parent).
//! The only host-side work is lab 1's baseline (a real worker process in a
//! memory-limited cgroup the lab makes and removes) and lab 2's Kubernetes
//! leg, which also talks to the Kubernetes API and reads kube-apiserver's
//! CPU from /proc and etcd's /metrics.
mod isolation;
mod k8s_cost;
mod ondemand;
mod ondemand_k8s;
mod pool;
mod pool_report;
mod poolsim;
mod pull;
mod push;
mod pushpull;
pub mod report;
mod shared;
mod shared_baseline;
mod shared_ember;
pub mod svg;
mod worker;
mod workspace;

use anyhow::Context;
use clap::{Subcommand, ValueEnum};
use ember_client::Client;
use report::LabReport;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum LabCmd {
    /// List the labs.
    Ls,
    /// Run lab N: its baseline, then ember, side by side; prints the tables and
    /// writes report.md, report.json and SVG charts into the output folder.
    Run {
        /// The lab's number (`ember lab ls`).
        n: u32,
        /// How big the run is.
        #[arg(long, value_enum, default_value_t = Scale::Small)]
        scale: Scale,
        /// Output folder (default: lab-runs/0N-<name>-<unix seconds>).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Lab 2's local registry port (the daemon must list
        /// 127.0.0.1:PORT in --insecure-registry, as for `ember bench image`).
        #[arg(long, default_value_t = 5099)]
        registry_port: u16,
        #[command(flatten)]
        k8s: ondemand_k8s::K8sLegArgs,
        /// Lab 7's local cluster (`ember cluster up --dir`).
        #[arg(long, default_value = crate::cluster::DEFAULT_DIR)]
        cluster_dir: PathBuf,
    },
    /// Render every run under DIR (each a folder with report.json) as one
    /// Markdown page, DIR/index.md.
    Report {
        /// The folder holding the runs.
        dir: PathBuf,
    },
    /// Lab 1's shared worker process (started by `ember lab run 1`).
    #[command(hide = true)]
    SharedWorker(worker::WorkerArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// Seconds; what CI runs.
    Small,
    /// Minutes; more samples, rates and sizes.
    Full,
}

/// A lab: its number, folder name, and the wall it shows.
pub struct Lab {
    pub n: u32,
    pub name: &'static str,
    pub title: &'static str,
    pub wall: &'static str,
}

/// The labs; lab 2's Kubernetes leg runs when given a Kubernetes API, lab 7
/// against the local cluster of `ember cluster up`.
pub const LABS: &[Lab] = &[
    Lab {
        n: 1,
        name: "single-shared-process",
        title: "Single shared process",
        wall: "one task's OOM takes the others with it; a payload reads the worker's secrets",
    },
    Lab {
        n: 2,
        name: "on-demand",
        title: "On demand",
        wall: "a cold create per request: pull, unpack, launch, agent ready; through the API server, what a burst costs it and etcd",
    },
    Lab {
        n: 3,
        name: "warm-pool",
        title: "Warm pool",
        wall: "a cold start per request; a pool buys latency with idle memory: how many to keep?",
    },
    Lab {
        n: 4,
        name: "workspaces",
        title: "Workspaces",
        wall: "a killed sandbox takes its half-finished work with it; a workspace outlives it",
    },
    Lab {
        n: 5,
        name: "push-to-pull",
        title: "Push to pull",
        wall: "a push allocator under worker failures runs tasks twice; ember's pull queue with leases does not",
    },
    Lab {
        n: 6,
        name: "hard-isolation",
        title: "Hard isolation",
        wall: "a shared kernel is reachable from a sandbox; gVisor moves the boundary, at a price",
    },
    Lab {
        n: 7,
        name: "chaos",
        title: "Chaos drill",
        wall: "30 % of the nodes and the queue's leader die under live sessions: who notices, who loses what",
    },
];

pub async fn run(cmd: LabCmd, client: impl FnOnce() -> anyhow::Result<Client>) -> anyhow::Result<i32> {
    match cmd {
        LabCmd::Ls => {
            for l in LABS {
                println!("{}  {:<24} {}", l.n, l.name, l.wall);
            }
            Ok(0)
        }
        LabCmd::Run { n, scale, out, registry_port, k8s, cluster_dir } => {
            let lab = LABS.iter().find(|l| l.n == n).with_context(|| format!("no lab {n} here (`ember lab ls`)"))?;
            let dir = out.unwrap_or_else(|| default_out(lab));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            if n == 7 {
                return finish(&crate::chaos::lab(scale, &cluster_dir, &dir).await?, &dir);
            }
            let client = client()?;
            let report = match n {
                1 => shared::run(&client, scale, &dir).await?,
                2 => ondemand::run(&client, scale, &dir, registry_port, &k8s).await?,
                3 => pool::run(&client, scale, &dir).await?,
                4 => workspace::run(&client, scale, &dir).await?,
                5 => pushpull::run(scale, &dir).await?,
                6 => isolation::run(&client, scale, &dir).await?,
                _ => anyhow::bail!("lab {n} has no runner"),
            };
            finish(&report, &dir)
        }
        LabCmd::Report { dir } => {
            let page = report::render_dir(&dir)?;
            println!("{}", page.display());
            Ok(0)
        }
        LabCmd::SharedWorker(a) => worker::main(a),
    }
}

/// Lab `n` of [`LABS`].
pub fn lab(n: u32) -> &'static Lab {
    LABS.iter().find(|l| l.n == n).unwrap_or(&LABS[0])
}

fn default_out(lab: &Lab) -> PathBuf {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    PathBuf::from("lab-runs").join(format!("{:02}-{}-{secs}", lab.n, lab.name))
}

/// Prints the tables, writes the files; exit code 1 when an invariant the
/// lab's argument rests on did not hold on this machine.
fn finish(report: &LabReport, dir: &Path) -> anyhow::Result<i32> {
    print!("{}", report.to_text());
    report.write(dir)?;
    println!("\nreport: {}", dir.join("report.md").display());
    Ok(if report.invariants.iter().all(|i| i.holds) { 0 } else { 1 })
}
