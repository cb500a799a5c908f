//! `ember chaos run`: the drill of issue 15 against the local cluster of
//! `ember cluster up` (its state file: it kills by pid and cuts links in the
//! hosts' namespaces; a remote cluster through a chaos endpoint is not
//! built). docs/chaos.md says how to run it and what each figure means.
//!
//! Layout: `session.rs` (one session's loop under the retry policy),
//! `faults.rs` (the node kills or cuts, MTTD, the queue leader's kill),
//! `verify.rs` (records and tasks at the end), `host.rs` (the host's CPU
//! in the warm-up), `report.rs` (report.json,
//! report.md, the SVG timeline, through the labs' `LabReport`).
mod conn;
mod faults;
mod health;
mod host;
mod report;
mod session;
mod verify;

use crate::cluster::state::State;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use session::{Conn, Session, SessionResult, Shared};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Subcommand)]
pub enum ChaosCmd {
    /// Run the drill: sessions, node kills, the queue leader's kill; writes
    /// report.json, report.md and timeline.svg into --out, and the nodes'
    /// and nats-servers' logs into --out/logs.
    Run(RunArgs),
}

#[derive(Args, Clone)]
pub struct RunArgs {
    /// The local cluster (`ember cluster up --dir`).
    #[arg(long, default_value = crate::cluster::DEFAULT_DIR)]
    pub dir: PathBuf,
    /// Agent sessions to run through the drill.
    #[arg(long, default_value_t = 300)]
    pub sessions: u32,
    /// Nodes to kill: a share (`30%`, rounded up) or a count (`2`).
    #[arg(long, default_value = "30%")]
    pub kill_nodes: String,
    /// Then SIGKILL the nats-server leading the task stream.
    #[arg(long)]
    pub kill_queue_leader: bool,
    /// Cut the chosen nodes' links (eth0 down in their namespace) instead of
    /// killing them.
    #[arg(long)]
    pub partition: bool,
    /// Seed of the drill's random choices (victims, timings).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output folder (default: chaos-runs/<unix seconds>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Load before the first fault, e.g. 30s.
    #[arg(long, default_value = "30s", value_parser = crate::commands::duration_arg)]
    pub warmup: Duration,
    /// Time between the node faults and the leader's kill.
    #[arg(long, default_value = "15s", value_parser = crate::commands::duration_arg)]
    pub gap: Duration,
    /// Load after the last fault.
    #[arg(long, default_value = "45s", value_parser = crate::commands::duration_arg)]
    pub run_on: Duration,
    /// Pause of each session between two records.
    #[arg(long, default_value = "500ms", value_parser = crate::commands::duration_arg)]
    pub pace: Duration,
    /// The old spelling of --pace, in ms (hidden).
    #[arg(long, hide = true, conflicts_with = "pace")]
    pub pace_ms: Option<u64>,
    /// Nice value of the drill's own threads (-20..19; 0 leaves it). Its
    /// sessions stand for clients on other machines; here they share the
    /// cores with the cluster they measure, and at 0 they waited for a core
    /// behind it: the first success after a rebind came p50 0.7-1.5 s after
    /// the survivor had logged it, and at -10 p50 0 (docs/chaos.md, AE).
    #[arg(long, default_value_t = CLIENT_NICE, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub nice: i32,
}

/// The drill's nice value by default (`--nice`).
pub const CLIENT_NICE: i32 = -10;

impl RunArgs {
    /// Each session's pause between two records (`--pace`, or the old
    /// `--pace-ms`).
    pub fn pace(&self) -> Duration {
        self.pace_ms.map_or(self.pace, Duration::from_millis)
    }
}

pub async fn run(cmd: ChaosCmd) -> anyhow::Result<i32> {
    let ChaosCmd::Run(a) = cmd;
    let st = State::load(&a.dir)?;
    let out = a.out.clone().unwrap_or_else(|| {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        PathBuf::from("chaos-runs").join(secs.to_string())
    });
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let report = drill(&st, &a, &out).await?;
    print!("{}", report.to_text());
    report.write(&out)?;
    if let Err(e) = keep_logs(&st, &out) {
        eprintln!("warning: the nodes' logs were not kept: {e:#}");
    }
    println!("\nreport: {}", out.join("report.md").display());
    Ok(if report.invariants.iter().all(|i| i.holds) { 0 } else { 1 })
}

/// The most of each log [`keep_logs`] copies: its last bytes.
const LOG_TAIL: u64 = 64 << 20;

/// Copies each host's node and nats-server log (the last [`LOG_TAIL`] bytes)
/// into `out/logs/<host>/`: the cause of a failed run is in them, and `ember
/// cluster down` removes the cluster's folder (docs/chaos.md, run CD). The
/// logs are the cluster's own processes', written in the cluster's folder,
/// not a sandbox's.
fn keep_logs(st: &State, out: &Path) -> anyhow::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    for h in &st.hosts {
        for name in ["ember.log", "nats.log"] {
            let src = crate::cluster::procs::host_dir(st, h).join(name);
            let mut f = match std::fs::File::open(&src) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("opening {}", src.display())),
            };
            let len = f.metadata()?.len();
            f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL)))?;
            let dir = out.join("logs").join(&h.name);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let dst = dir.join(name);
            let mut w = std::fs::File::create(&dst).with_context(|| format!("creating {}", dst.display()))?;
            std::io::copy(&mut f.take(LOG_TAIL), &mut w).with_context(|| format!("copying {}", src.display()))?;
        }
    }
    Ok(())
}

/// `30%` of `n` rounded up, or a plain count; at most `n - 1` (someone has
/// to answer).
pub fn victims_count(spec: &str, n: usize) -> anyhow::Result<usize> {
    let k = match spec.strip_suffix('%') {
        Some(p) => {
            let p: f64 = p.trim().parse().with_context(|| format!("--kill-nodes {spec}"))?;
            if !(0.0..=100.0).contains(&p) {
                bail!("--kill-nodes {spec}: a share from 0% to 100%");
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "0 ≤ p·n/100 ≤ n")]
            let k = (p * n as f64 / 100.0).ceil() as usize;
            k
        }
        None => spec.trim().parse().with_context(|| format!("--kill-nodes {spec}: a count or a share"))?,
    };
    if k >= n {
        bail!("--kill-nodes {spec}: {k} of {n} nodes leaves none to answer");
    }
    Ok(k)
}

/// The whole drill; the report (not yet written).
pub async fn drill(st: &State, a: &RunArgs, out: &Path) -> anyhow::Result<crate::lab::report::LabReport> {
    let k = victims_count(&a.kill_nodes, st.hosts.len())?;
    if a.nice != 0 {
        // Threads started later inherit it from the one that starts them.
        match ember_runtime::nice_self(a.nice) {
            Ok(()) => println!("chaos: the drill's threads at nice {}", a.nice),
            Err(e) => println!("chaos: the drill's threads left at their nice value ({} refused: {e})", a.nice),
        }
    }
    let clients: Vec<_> = st.hosts.iter().map(|h| st.client(h)).collect::<anyhow::Result<_>>()?;
    let unix_ms = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let shared = Arc::new(Shared {
        t0: Instant::now(),
        t0_unix_ms: i64::try_from(unix_ms()).unwrap_or(i64::MAX),
        stop: false.into(),
        events: Default::default(),
        health: Default::default(),
        probes: Default::default(),
        faulted: Default::default(),
    });
    // Names this run's workspaces and task keys apart from any earlier run's.
    let run_id = format!("c{:08x}", fastrand::u32(..));
    println!("chaos: {} sessions over {} nodes, run {run_id}", a.sessions, st.hosts.len());
    // At most a few creates at once: 2 cores make sandboxes and workspaces.
    let opening = Arc::new(tokio::sync::Semaphore::new(4));
    let opened = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut tasks = Vec::new();
    for i in 0..a.sessions {
        let node = i as usize % st.hosts.len();
        let r = SessionResult {
            index: i,
            node: st.hosts[node].name.clone(),
            workspace: format!("{run_id}-{i}"),
            ..Default::default()
        };
        let mut s = Session {
            conn: Conn::new(clients.clone(), node, i as usize / st.hosts.len(), shared.clone()),
            r,
            run: run_id.clone(),
        };
        let (shared, opening, pace) = (shared.clone(), opening.clone(), a.pace());
        let done = opened.clone();
        tasks.push(tokio::spawn(async move {
            let permit = opening.acquire_owned().await;
            let opened = s.open().await;
            drop(permit);
            done.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = opened {
                s.r.first_errors.push(format!("open: {e}"));
                return s;
            }
            s.run(&shared, pace).await;
            s
        }));
    }
    // Warm up once every session is open (or failed to).
    while opened.load(Ordering::Relaxed) < a.sessions {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    faults::open_probes(st, &shared, &clients).await;
    println!("chaos: sessions open after {:?}; warming up {:?}", shared.t0.elapsed(), a.warmup);
    let mark = host::Mark::now();
    tokio::time::sleep(a.warmup).await;
    let warm = host::WarmUp::between(mark, host::Mark::now());
    println!("chaos: warm-up: {}", warm.line());
    let faults = faults::run(st, a, k, &shared, &clients).await?;
    tokio::time::sleep(a.run_on).await;
    shared.stop.store(true, Ordering::Relaxed);
    let stopped_ms = shared.ms(Instant::now());
    println!("chaos: stopping sessions at {stopped_ms} ms; verifying");
    let mut sessions = Vec::new();
    for t in tasks {
        sessions.push(t.await.context("a session panicked")?);
    }
    let tasks = verify::tasks(&clients, &faults, &sessions).await;
    let sessions = verify::records(sessions, &shared).await;
    report::build(st, a, out, &shared, &faults, &sessions, &tasks, &warm, stopped_ms)
}

/// Lab 7: the drill at a scale (small: what CI runs; full: issue 15's
/// 300 sessions; the cluster's size is `ember cluster up`'s).
pub async fn lab(
    scale: crate::lab::Scale,
    cluster: &Path,
    out: &Path,
) -> anyhow::Result<crate::lab::report::LabReport> {
    let st = State::load(cluster)?;
    let small = scale == crate::lab::Scale::Small;
    let a = RunArgs {
        dir: cluster.to_path_buf(),
        sessions: if small { 24 } else { 300 },
        kill_nodes: "30%".into(),
        kill_queue_leader: true,
        partition: false,
        seed: 1,
        out: Some(out.to_path_buf()),
        warmup: Duration::from_secs(if small { 10 } else { 30 }),
        gap: Duration::from_secs(if small { 10 } else { 15 }),
        run_on: Duration::from_secs(if small { 20 } else { 45 }),
        pace: Duration::from_millis(500),
        pace_ms: None,
        nice: CLIENT_NICE,
    };
    drill(&st, &a, out).await
}
