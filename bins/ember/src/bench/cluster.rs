//! `ember bench cluster --urls URL,URL,...`: warm claims on a cluster
//! (`ember serve --cluster`), through [`Client`] only, against a cluster pool
//! this run creates (through the first URL) and removes.
//!
//! Two figures of the same claims, timed the same way: "cluster", each task
//! sending its claims to the URLs in turn (a claim through any node, pulled
//! over NATS from a node with an idle member), and "one node", every claim
//! through the first URL; with `--single`, a third on an embedded node. Each
//! starts on a full, quiet pool of `--idle` members (spread over the nodes);
//! claimed sandboxes are removed between the figures, untimed. Per figure:
//! warm claims' client wall time (p50/p99), claims/s (claims over the span
//! from the first sent to the last answered), and how many came back cold (a
//! miss: no idle member anywhere).
//!
//! `--rounds` rounds of every figure, the order turned by one each round
//! (none always runs first after the others' refills); the medians over the
//! rounds are printed. One figure of 300 claims lasts a second or less, and
//! on a loaded 2-core host the cluster's share of the embedded node's
//! claims/s moved from 33 % to 71 % between single-round runs of the same
//! build (docs/cluster.md).
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
    /// Rounds of the figures (the medians are printed).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The figures, in the order a round's first turn runs them.
const LABELS: [&str; 3] = ["cluster", "one node", "embedded"];

/// Round `round`'s order of the figures of `labels`: turned by one a round.
fn order<'a>(round: usize, labels: &[&'a str]) -> Vec<&'a str> {
    let mut v = labels.to_vec();
    if !v.is_empty() {
        let n = round % v.len();
        v.rotate_left(n);
    }
    v
}

/// The median of `v` (the mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
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
    if args.claims == 0 || args.tasks == 0 || args.urls.is_empty() || args.rounds == 0 {
        anyhow::bail!("--claims, --tasks, --rounds and --urls must not be empty or zero");
    }
    let clients: Vec<Client> = args
        .urls
        .iter()
        .map(|u| Client::new(u, api_key.clone()).with_context(|| format!("client of {u}")))
        .collect::<anyhow::Result<_>>()?;
    let single = match &args.single {
        Some(url) => Some(Client::new(url, api_key.clone()).with_context(|| format!("client of {url}"))?),
        None => None,
    };
    let idle = args.idle.unwrap_or(u32::try_from(args.claims).unwrap_or(u32::MAX));
    let first = &clients[0];
    pool::check_no_pool(first).await?;
    if let Some(s) = &single {
        pool::check_no_pool(s).await?;
    }
    let bench = BenchPool::create(first, "cluster", idle).await?;
    let single_pool = match &single {
        Some(s) => match BenchPool::create(s, "single", idle).await {
            Ok(p) => Some((s, p)),
            Err(e) => {
                let _ = bench.remove(first).await;
                return Err(e);
            }
        },
        None => None,
    };
    let on = Targets { clients: &clients, bench: &bench, single: single_pool.as_ref().map(|(c, p)| (*c, p)) };
    let res = pool::interruptible(rounds(&on, idle, &args)).await;
    let removed = bench.remove(first).await;
    if let Some((s, p)) = single_pool {
        p.remove(s).await?;
    }
    let rounds = res?;
    removed?;
    let failed = rounds.iter().flatten().any(|f| f.failed > 0);
    if args.json {
        let json = serde_json::json!({
            "urls": args.urls, "claims": args.claims, "tasks": args.tasks, "idle": idle, "rounds": rounds
        });
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        print_text(&args, idle, &rounds);
    }
    Ok(i32::from(failed))
}

/// What the figures run against.
struct Targets<'a> {
    clients: &'a [Client],
    bench: &'a BenchPool,
    /// An embedded node and its pool.
    single: Option<(&'a Client, &'a BenchPool)>,
}

/// `args.rounds` rounds of every figure, each round's in the order
/// [`order`] gives; each round's figures returned in [`LABELS`]' order.
async fn rounds(on: &Targets<'_>, idle: u32, args: &ClusterArgs) -> anyhow::Result<Vec<Vec<Figure>>> {
    let labels: Vec<&str> = LABELS.iter().copied().filter(|l| *l != "embedded" || on.single.is_some()).collect();
    let mut out = Vec::new();
    for round in 0..args.rounds {
        let mut figs = Vec::new();
        for label in order(round, &labels) {
            // Every pool full and quiet, not only this figure's: another's
            // refills would share the cores with these claims.
            on.bench.wait_full(&on.clients[0], idle).await?;
            if let Some((c, p)) = on.single {
                p.wait_full(c, idle).await?;
            }
            let fig = match (label, on.single) {
                ("embedded", Some((c, p))) => figure(c, p, idle, label, std::slice::from_ref(c), args).await?,
                ("one node", _) => figure(&on.clients[0], on.bench, idle, label, &on.clients[..1], args).await?,
                _ => figure(&on.clients[0], on.bench, idle, label, on.clients, args).await?,
            };
            figs.push(fig);
        }
        figs.sort_by_key(|f| LABELS.iter().position(|l| *l == f.through));
        out.push(figs);
    }
    Ok(out)
}

/// Per figure the medians over the rounds, and the cluster's share of the
/// embedded node's claims/s round by round.
fn print_text(args: &ClusterArgs, idle: u32, rounds: &[Vec<Figure>]) {
    println!(
        "\nember bench cluster: {} claims per figure, {} tasks, a pool of {idle} over {} URL(s), {} round(s), medians",
        args.claims,
        args.tasks,
        args.urls.len(),
        rounds.len()
    );
    println!(
        "{:<12} {:>10} {:>10} {:>6} {:>7} {:>10}   claims/s by round",
        "through", "warm p50", "warm p99", "cold", "failed", "claims/s"
    );
    let of = |label: &str| -> Vec<&Figure> { rounds.iter().flatten().filter(|f| f.through == label).collect() };
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.2}ms"));
    for label in LABELS {
        let figs = of(label);
        if figs.is_empty() {
            continue;
        }
        let each: Vec<String> = figs.iter().map(|f| format!("{:.0}", f.claims_per_sec)).collect();
        println!(
            "{label:<12} {:>10} {:>10} {:>6} {:>7} {:>10.1}   {}",
            ms(median(figs.iter().filter_map(|f| f.warm.p50_ms).collect())),
            ms(median(figs.iter().filter_map(|f| f.warm.p99_ms).collect())),
            figs.iter().map(|f| f.cold).sum::<usize>(),
            figs.iter().map(|f| f.failed).sum::<usize>(),
            median(figs.iter().map(|f| f.claims_per_sec).collect()).unwrap_or(0.0),
            each.join(" ")
        );
    }
    let shares: Vec<f64> = rounds
        .iter()
        .filter_map(|r| {
            let c = r.iter().find(|f| f.through == "cluster")?;
            let e = r.iter().find(|f| f.through == "embedded")?;
            Some(100.0 * c.claims_per_sec / e.claims_per_sec.max(1e-9))
        })
        .collect();
    if let Some(m) = median(shares.clone()) {
        let each: Vec<String> = shares.iter().map(|s| format!("{s:.0}%")).collect();
        println!(
            "the cluster's claims/s are {m:.0}% of the embedded node's at the median (rounds: {})",
            each.join(" ")
        );
    }
    for f in rounds.iter().flatten().filter(|f| f.failed > 0) {
        if let Some(e) = &f.warm.first_error {
            println!("{}: {} failed, the first: {e}", f.through, f.failed);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_figure_runs_first_in_turn() {
        let l = ["cluster", "one node", "embedded"];
        assert_eq!(order(0, &l), l);
        assert_eq!(order(1, &l), ["one node", "embedded", "cluster"]);
        assert_eq!(order(2, &l), ["embedded", "cluster", "one node"]);
        assert_eq!(order(3, &l), l);
        assert!(order(1, &[]).is_empty());
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }
}
