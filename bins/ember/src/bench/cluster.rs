//! `ember bench cluster --urls URL,URL,...`: warm claims on a cluster
//! (`ember serve --cluster`), through [`Client`] only, against a cluster pool
//! this run creates (through the first URL) and removes.
//!
//! Two figures of the same claims, timed the same way: "cluster", each task
//! sending its claims to the URLs in turn (a claim through any node, pulled
//! over NATS from a node with an idle member), and "one node", every claim
//! through the first URL. Each starts on a full, quiet pool of `--idle`
//! members spread over the nodes; claimed sandboxes are removed between the
//! figures, untimed. Per figure: warm claims' client wall time (p50/p99),
//! claims/s (claims over the span from the first sent to the last answered),
//! and how many came back cold (a miss: no idle member anywhere).
use super::pool::{self, BenchPool, TEMPLATE};
use super::stats::{Series, Summary};
use anyhow::Context;
use ember_client::Client;
use ember_types::api::CreateSandboxRequest;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// The nodes' API URLs, comma-separated (every node of the cluster, or some).
    #[arg(long, value_delimiter = ',', required = true)]
    pub urls: Vec<String>,
    /// Claims per figure.
    #[arg(long, default_value_t = 200)]
    pub claims: usize,
    /// Concurrent claiming tasks.
    #[arg(long, default_value_t = 8)]
    pub tasks: usize,
    /// The pool's cluster-wide target (default: --claims, so a figure misses
    /// only when refills lag).
    #[arg(long)]
    pub idle: Option<u32>,
    /// An embedded (`ember serve` without `--cluster`) daemon's URL: the
    /// same claims against it, as the single-node figure of the same run.
    #[arg(long)]
    pub single: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Figure {
    through: String,
    warm: Summary,
    cold: usize,
    failed: usize,
    claims_per_sec: f64,
}

/// One claim: how long it took, and the sandbox id and whether it was warm
/// (or the error).
type ClaimOutcome = (Duration, Result<(String, bool), String>);

pub async fn run(api_key: Option<String>, args: ClusterArgs) -> anyhow::Result<i32> {
    if args.claims == 0 || args.tasks == 0 || args.urls.is_empty() {
        anyhow::bail!("--claims, --tasks and --urls must not be empty or zero");
    }
    let clients: Vec<Client> = args
        .urls
        .iter()
        .map(|u| Client::new(u, api_key.clone()).with_context(|| format!("client of {u}")))
        .collect::<anyhow::Result<_>>()?;
    let idle = args.idle.unwrap_or(u32::try_from(args.claims).unwrap_or(u32::MAX));
    let first = &clients[0];
    pool::check_no_pool(first).await?;
    let bench = BenchPool::create(first, "cluster", idle).await?;
    let res = pool::interruptible(figures(&clients, &bench, idle, &args)).await;
    let removed = bench.remove(first).await;
    let mut figs = res?;
    removed?;
    if let Some(url) = &args.single {
        let single = Client::new(url, api_key.clone()).with_context(|| format!("client of {url}"))?;
        pool::check_no_pool(&single).await?;
        let bench = BenchPool::create(&single, "single", idle).await?;
        let res =
            pool::interruptible(figure(&single, &bench, idle, "embedded", std::slice::from_ref(&single), &args)).await;
        let removed = bench.remove(&single).await;
        figs.push(res?);
        removed?;
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "urls": args.urls, "claims": args.claims, "tasks": args.tasks, "idle": idle, "figures": figs })
            )?
        );
    } else {
        println!(
            "\nember bench cluster: {} claims per figure, {} tasks, a pool of {idle} over {} URL(s)",
            args.claims,
            args.tasks,
            args.urls.len()
        );
        println!(
            "{:<12} {:>10} {:>10} {:>6} {:>7} {:>10}",
            "through", "warm p50", "warm p99", "cold", "failed", "claims/s"
        );
        if let (Some(c), Some(e)) = (figs.first(), figs.iter().find(|f| f.through == "embedded")) {
            println!(
                "the cluster's claims/s are {:.0}% of the embedded node's (through every URL, same claims)",
                100.0 * c.claims_per_sec / e.claims_per_sec.max(1e-9)
            );
        }
        for f in &figs {
            let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}ms"));
            println!(
                "{:<12} {:>10} {:>10} {:>6} {:>7} {:>10.1}",
                f.through,
                ms(f.warm.p50_ms),
                ms(f.warm.p99_ms),
                f.cold,
                f.failed,
                f.claims_per_sec
            );
        }
        for f in figs.iter().filter(|f| f.failed > 0) {
            if let Some(e) = &f.warm.first_error {
                println!("{}: {} failed, the first: {e}", f.through, f.failed);
            }
        }
    }
    Ok(i32::from(figs.iter().any(|f| f.failed > 0)))
}

async fn figures(clients: &[Client], bench: &BenchPool, idle: u32, args: &ClusterArgs) -> anyhow::Result<Vec<Figure>> {
    let mut out = Vec::new();
    for (label, targets) in [("cluster", clients.to_vec()), ("one node", vec![clients[0].clone()])] {
        out.push(figure(&clients[0], bench, idle, label, &targets, args).await?);
    }
    Ok(out)
}

/// One figure: `bench`'s pool full and quiet (seen through `admin`), the
/// claims through `targets`, then the claimed sandboxes removed, untimed.
async fn figure(
    admin: &Client,
    bench: &BenchPool,
    idle: u32,
    label: &str,
    targets: &[Client],
    args: &ClusterArgs,
) -> anyhow::Result<Figure> {
    bench.wait_full(admin, idle).await?;
    let (fig, ids) = claims(&bench.name, targets, args).await;
    let left = pool::remove_all(admin, ids).await;
    if !left.is_empty() {
        eprintln!("could not remove {} claimed sandboxes: {left:?}", left.len());
    }
    Ok(Figure { through: label.into(), ..fig })
}

/// `args.claims` claims from `pool` by `args.tasks` tasks, each sending its
/// claims to `targets` in turn; the figure and every sandbox it claimed.
async fn claims(pool: &str, targets: &[Client], args: &ClusterArgs) -> (Figure, Vec<String>) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let req = CreateSandboxRequest {
        template: Some(TEMPLATE.into()),
        extensions: Some([("poolRef".to_string(), pool.to_string())].into()),
        ..Default::default()
    };
    let start = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..args.tasks {
        let (next, req, targets, total) = (next.clone(), req.clone(), targets.to_vec(), args.claims);
        set.spawn(async move {
            let mut got: Vec<ClaimOutcome> = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    return got;
                }
                let t0 = Instant::now();
                let r = targets[i % targets.len()].create_sandbox(&req).await;
                let warm = |s: &ember_types::api::SandboxInfo| s.launch.as_ref().is_some_and(|l| l.kind == "warm");
                got.push((t0.elapsed(), r.map(|(s, _)| (s.id.clone(), warm(&s))).map_err(|e| e.to_string())));
            }
        });
    }
    let mut all = Vec::new();
    while let Some(r) = set.join_next().await {
        all.extend(r.unwrap_or_default());
    }
    let span = start.elapsed();
    let (mut warm, mut cold, mut failed, mut ids) = (Series::default(), 0, 0, Vec::new());
    for (took, r) in all {
        match r {
            Ok((id, true)) => {
                warm.push(took);
                ids.push(id);
            }
            Ok((id, false)) => {
                cold += 1;
                ids.push(id);
            }
            Err(e) => {
                failed += 1;
                warm.fail(e);
            }
        }
    }
    let claims_per_sec = (args.claims - failed) as f64 / span.as_secs_f64().max(1e-9);
    (Figure { through: String::new(), warm: warm.summary(), cold, failed, claims_per_sec }, ids)
}
