//! Lab 3, warm pool: real claims against the daemon at small scale, then the
//! simulation (`poolsim.rs`) fed with what they measured for the sweep over
//! arrival rates and pool sizes (`pool_report.rs` builds the report).
//!
//! Time to first instruction (TTFI): create call started → first stdout event
//! of `echo x` in the new sandbox, as a client sees it. Order: cold creates
//! first (no pool of the template exists yet), then per pool size a fresh,
//! full pool and Poisson arrivals against it; what a phase claimed is removed
//! after it (untimed), the pool with it.
use super::pool_report;
use super::report::LabReport;
use super::Scale;
use crate::bench::pool::{check_no_pool, interruptible, BenchPool, Claimed, TEMPLATE};
use crate::bench::stats::Series;
use anyhow::Context;
use ember_client::Client;
use ember_types::api::CreateSandboxRequest;
use ember_types::execd::RunCommandRequest;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

pub struct Params {
    pub cold_runs: usize,
    pub sizes: Vec<u32>,
    pub real_rate: f64,
    pub real_claims: usize,
    pub sim_rates: Vec<f64>,
    pub sim_claims: u32,
}

impl Params {
    fn of(scale: Scale) -> Params {
        match scale {
            Scale::Small => Params {
                cold_runs: 3,
                sizes: vec![1, 2],
                real_rate: 2.0,
                real_claims: 6,
                sim_rates: vec![1.0, 5.0, 20.0],
                sim_claims: 4000,
            },
            Scale::Full => Params {
                cold_runs: 10,
                sizes: vec![1, 2, 4],
                real_rate: 4.0,
                real_claims: 40,
                sim_rates: vec![0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0],
                sim_claims: 40_000,
            },
        }
    }
}

/// Claims against one pool size at the real arrival rate.
#[derive(Default)]
pub struct Phase {
    pub pool: u32,
    pub ttfi: Series,
    pub claims: usize,
    pub hits: usize,
    /// The pool's own moving average of a replacement's start time, seconds.
    pub refill_secs: f64,
    /// Memory charged to one idle sandbox when the pool was full, MiB.
    pub idle_mib: Option<f64>,
}

#[derive(Default)]
pub struct Real {
    pub cold: Series,
    /// Cold creates that came back warm (someone's pool of the template).
    pub cold_warm: usize,
    pub phases: Vec<Phase>,
    /// TTFI samples (ms) of every claim, by whether it was warm.
    pub warm_ms: Vec<f64>,
    pub cold_ms: Vec<f64>,
    pub leftovers: Vec<String>,
}

pub async fn run(client: &Client, scale: Scale, dir: &Path) -> anyhow::Result<LabReport> {
    let p = Params::of(scale);
    check_no_pool(client).await?;
    let claimed = Claimed::default();
    let mut real = Real::default();
    let r = interruptible(measure(client, &p, &mut real, &claimed)).await;
    real.leftovers.extend(claimed.remove(client).await);
    r?;
    pool_report::build(&p, &real, scale, dir)
}

async fn measure(client: &Client, p: &Params, real: &mut Real, claimed: &Claimed) -> anyhow::Result<()> {
    eprintln!("  cold creates: {}", p.cold_runs);
    for _ in 0..p.cold_runs {
        let (ttfi, warm) = ttfi_once(client.clone(), claimed.clone()).await?;
        if warm {
            real.cold_warm += 1;
        } else {
            real.cold.push(ttfi);
            real.cold_ms.push(ttfi.as_secs_f64() * 1000.0);
        }
    }
    real.leftovers.extend(claimed.remove(client).await);
    for &k in &p.sizes {
        eprintln!("  pool of {k}: {} claims at {}/s", p.real_claims, p.real_rate);
        let pool = BenchPool::create(client, "lab3", k).await?;
        let r = phase(client, p, &pool, k, real, claimed).await;
        // The pool first, so its refill stops competing with the removals.
        if let Err(e) = pool.remove(client).await {
            real.leftovers.push(format!("{e:#}"));
        }
        real.leftovers.extend(claimed.remove(client).await);
        real.phases.push(r?);
    }
    Ok(())
}

/// One pool size: wait until full, then Poisson arrivals, each claim timed
/// to its first instruction on a task of its own (claims overlap as they do
/// in production).
async fn phase(
    client: &Client,
    p: &Params,
    pool: &BenchPool,
    k: u32,
    real: &mut Real,
    claimed: &Claimed,
) -> anyhow::Result<Phase> {
    let full = pool.wait_full(client, k).await?;
    let idle_mib = (full.idle > 0).then(|| full.idle_memory_bytes as f64 / f64::from(full.idle) / f64::from(1 << 20));
    let mut rng = fastrand::Rng::new();
    let start = tokio::time::Instant::now();
    let mut at = 0.0f64;
    let mut set = JoinSet::new();
    for _ in 0..p.real_claims {
        at -= (1.0 - rng.f64()).ln() / p.real_rate;
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        set.spawn(ttfi_once(client.clone(), claimed.clone()));
    }
    let mut ph = Phase { pool: k, idle_mib, ..Default::default() };
    while let Some(r) = set.join_next().await {
        ph.claims += 1;
        match r.context("a claim's task")? {
            Ok((ttfi, warm)) => {
                ph.ttfi.push(ttfi);
                let ms = ttfi.as_secs_f64() * 1000.0;
                if warm {
                    ph.hits += 1;
                    real.warm_ms.push(ms);
                } else {
                    real.cold_ms.push(ms);
                }
            }
            Err(e) => ph.ttfi.fail(format!("{e:#}")),
        }
    }
    let info = client.get_pool(&pool.name).await.with_context(|| format!("reading pool {}", pool.name))?;
    ph.refill_secs = info.sizing.refill_secs;
    Ok(ph)
}

/// Create (a claim when a pool of the template has an idle sandbox), then
/// `echo x`: (time to its first stdout event, whether the create was warm).
async fn ttfi_once(client: Client, claimed: Claimed) -> anyhow::Result<(Duration, bool)> {
    let req = CreateSandboxRequest { template: Some(TEMPLATE.into()), ..Default::default() };
    let echo = RunCommandRequest { argv: Some(vec!["echo".into(), "x".into()]), ..Default::default() };
    let t0 = Instant::now();
    let (info, _) = client.create_sandbox(&req).await.context("creating a sandbox")?;
    claimed.push(info.id.clone());
    let warm = info.launch.as_ref().is_some_and(|l| l.kind == "warm");
    let mut first = None;
    let o = client
        .exec(&info.id, &echo, |ev| {
            if ev.kind == "stdout" && first.is_none() {
                first = Some(Instant::now());
            }
        })
        .await
        .with_context(|| format!("echo x in sandbox {}", info.id))?;
    let t = first.with_context(|| format!("no stdout from echo x (exit {:?}, error {:?})", o.exit_code, o.error))?;
    Ok((t - t0, warm))
}
