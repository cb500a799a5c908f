//! `ember bench claim`: warm-pool claims measured as any client sees them,
//! through [`Client`] only, against a pool this run creates and removes.
//!
//! Order: cold creates first (no pool of the template exists yet, so they are
//! the reference), then a pool is created and filled, and each warm figure
//! starts on a full, quiet pool. Claimed sandboxes are removed between figures
//! (untimed) so removal never overlaps a measurement; the pool's own refill
//! does overlap, as it would in production.
use super::ember::PHASES;
use super::pool::{self, BenchPool, Claimed, TEMPLATE};
use super::stats::{Progress, Series};
use ember_client::{Client, ClientError};
use ember_types::api::{CreateSandboxRequest, SandboxInfo};
use ember_types::execd::RunCommandRequest;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

pub struct ClaimArgs {
    pub runs: usize,
    pub concurrency: usize,
    pub bursts: usize,
    pub sustain: usize,
    pub tasks: usize,
}

#[derive(Default)]
pub struct ClaimFigures {
    pub pool: String,
    /// Idle count reached and the time the first fill took.
    pub fill: Option<(u32, Duration)>,
    pub cold_server: Series,
    pub cold_wall: Series,
    pub phases: BTreeMap<String, Series>,
    pub warm_server: Series,
    pub warm_wall: Series,
    /// Client wall minus server time, per warm claim: HTTP, loopback, JSON.
    pub warm_outside: Series,
    /// Create call started → first stdout event of `echo x`.
    pub first_output: Series,
    /// Create call returned → first stdout event.
    pub first_output_exec: Series,
    /// The create call of the same runs.
    pub first_output_claim: Series,
    /// The same `echo x` again in the same sandbox, exec call → first
    /// stdout: the steady command the first one is judged against.
    pub steady_output: Series,
    pub burst_server: Series,
    pub burst_wall: Series,
    /// Release of a burst → its last reply.
    pub burst_span: Series,
    pub burst_claims: usize,
    pub burst_warm: usize,
    pub sustain: Sustain,
    /// Creates of the sequential warm figures that the pool missed (answered cold).
    pub misses: usize,
    /// Cold creates that came back warm (someone else's pool).
    pub cold_warm: usize,
    pub leftovers: Vec<String>,
    /// Why the run stopped before its end.
    pub aborted: Option<String>,
}

#[derive(Default)]
pub struct Sustain {
    pub claims: usize,
    pub tasks: usize,
    pub warm: usize,
    pub elapsed: Duration,
    /// How long the pool took to fill to `claims` idle first.
    pub fill: Duration,
    pub server: Series,
    pub wall: Series,
}

impl Sustain {
    pub fn per_sec(&self) -> Option<f64> {
        let ok = self.wall.summary().samples;
        (ok > 0 && !self.elapsed.is_zero()).then(|| ok as f64 / self.elapsed.as_secs_f64())
    }
}

fn create_req() -> CreateSandboxRequest {
    CreateSandboxRequest { template: Some(TEMPLATE.into()), ..Default::default() }
}

/// Whether the create was a warm claim, and the server's time for it in ms.
fn launch(info: &SandboxInfo, header_us: u64) -> (bool, f64) {
    let l = info.launch.clone().unwrap_or_default();
    let us = if header_us > 0 { header_us } else { l.micros };
    (l.kind == "warm", us as f64 / 1000.0)
}

/// Measures everything it can; a setup failure or Ctrl-C ends the run early
/// (noted in `aborted`) with what was measured so far. Removes all it created.
pub async fn measure(client: &Client, a: &ClaimArgs) -> anyhow::Result<ClaimFigures> {
    pool::check_no_pool(client).await?;
    let mut f = ClaimFigures::default();
    let claimed = Claimed::default();
    if let Err(e) = pool::interruptible(cold(client, a.runs, &mut f, &claimed)).await {
        f.aborted = Some(format!("{e:#}"));
    }
    f.leftovers.extend(claimed.remove(client).await);
    if f.aborted.is_some() {
        return Ok(f);
    }
    let target = a.runs.max(a.concurrency) as u32;
    let p = BenchPool::create(client, "claim", target).await?;
    f.pool = p.name.clone();
    if let Err(e) = pool::interruptible(warm(client, a, &p, &mut f, &claimed)).await {
        f.aborted = Some(format!("{e:#}"));
    }
    // The pool first, so its refill stops competing with the removals.
    if let Err(e) = p.remove(client).await {
        f.leftovers.push(format!("{e:#}"));
    }
    f.leftovers.extend(claimed.remove(client).await);
    Ok(f)
}

async fn cold(client: &Client, runs: usize, f: &mut ClaimFigures, claimed: &Claimed) -> anyhow::Result<()> {
    // One discarded create: connection set-up, page cache, first-use costs.
    let (info, _) = client.create_sandbox(&create_req()).await?;
    claimed.push(info.id);
    let p = Progress::new("cold create", runs);
    for i in 0..runs {
        let t0 = Instant::now();
        let r = client.create_sandbox(&create_req()).await;
        let wall = t0.elapsed();
        match r {
            Ok((info, us)) => {
                let (warm, server) = launch(&info, us);
                if warm {
                    f.cold_warm += 1;
                } else {
                    f.cold_server.push_ms(server);
                    f.cold_wall.push(wall);
                    let phases = info.launch.as_ref().map(|l| &l.phases);
                    for name in PHASES {
                        if let Some(us) = phases.and_then(|p| p.get(name)) {
                            f.phases.entry(name.to_string()).or_default().push_ms(*us as f64 / 1000.0);
                        }
                    }
                }
                claimed.push(info.id);
            }
            Err(e) => {
                f.cold_server.fail(&e);
                f.cold_wall.fail(&e);
            }
        }
        p.tick(i + 1);
        if f.cold_wall.gave_up() {
            break;
        }
    }
    p.finish(&f.cold_wall);
    // Removed here, untimed, so the pool starts on a quiet daemon.
    f.leftovers.extend(claimed.remove(client).await);
    Ok(())
}

async fn warm(
    client: &Client,
    a: &ClaimArgs,
    p: &BenchPool,
    f: &mut ClaimFigures,
    claimed: &Claimed,
) -> anyhow::Result<()> {
    let target = a.runs.max(a.concurrency) as u32;
    let t0 = Instant::now();
    eprintln!("  filling pool {} to {target} idle", p.name);
    let info = p.wait_full(client, target).await?;
    f.fill = Some((info.idle, t0.elapsed()));

    sequential(client, a.runs, f, claimed).await;
    f.leftovers.extend(claimed.remove(client).await);
    p.wait_full(client, target).await?;

    first_output(client, a.runs, f, claimed).await;
    f.leftovers.extend(claimed.remove(client).await);

    let bp = Progress::new(format!("bursts of {}", a.concurrency), a.bursts);
    for i in 0..a.bursts {
        p.wait_full(client, target).await?;
        burst(client, a.concurrency, f, claimed).await;
        f.leftovers.extend(claimed.remove(client).await);
        bp.tick(i + 1);
    }
    bp.finish(&f.burst_span);

    if a.sustain > 0 {
        let n = a.sustain as u32;
        p.resize(client, n).await?;
        eprintln!("  filling pool {} to {n} idle", p.name);
        let t0 = Instant::now();
        p.wait_full(client, n).await?;
        f.sustain.fill = t0.elapsed();
        sustained(client, a.sustain, a.tasks.max(1), &mut f.sustain, claimed).await;
    }
    Ok(())
}

async fn sequential(client: &Client, runs: usize, f: &mut ClaimFigures, claimed: &Claimed) {
    let p = Progress::new("warm claim", runs);
    for i in 0..runs {
        let t0 = Instant::now();
        let r = client.create_sandbox(&create_req()).await;
        let wall = t0.elapsed();
        match r {
            Ok((info, us)) => {
                let (warm, server) = launch(&info, us);
                if warm {
                    f.warm_server.push_ms(server);
                    f.warm_wall.push(wall);
                    f.warm_outside.push_ms(wall.as_secs_f64() * 1000.0 - server);
                } else {
                    f.misses += 1;
                }
                claimed.push(info.id);
            }
            Err(e) => {
                f.warm_server.fail(&e);
                f.warm_wall.fail(&e);
            }
        }
        p.tick(i + 1);
        if f.warm_wall.gave_up() {
            break;
        }
    }
    p.finish(&f.warm_wall);
}

/// Claim, then `echo x`: until its first stdout event reaches this client.
async fn first_output(client: &Client, runs: usize, f: &mut ClaimFigures, claimed: &Claimed) {
    let echo = RunCommandRequest { argv: Some(vec!["echo".into(), "x".into()]), ..Default::default() };
    let p = Progress::new("claim + echo x", runs);
    for i in 0..runs {
        match first_output_once(client, &echo, claimed).await {
            Ok(Some((total, exec, steady))) => {
                f.first_output.push(total);
                f.first_output_exec.push(exec);
                f.first_output_claim.push(total - exec);
                f.steady_output.push(steady);
            }
            Ok(None) => f.misses += 1,
            Err(e) => {
                f.first_output.fail(format!("{e:#}"));
                f.first_output_exec.fail(format!("{e:#}"));
            }
        }
        p.tick(i + 1);
        if f.first_output.gave_up() {
            break;
        }
    }
    p.finish(&f.first_output);
}

/// (create started → first stdout, create returned → first stdout, the
/// same command again: exec call → first stdout); `None` when the pool missed.
async fn first_output_once(
    client: &Client,
    echo: &RunCommandRequest,
    claimed: &Claimed,
) -> anyhow::Result<Option<(Duration, Duration, Duration)>> {
    let t0 = Instant::now();
    let (info, us) = client.create_sandbox(&create_req()).await?;
    let t1 = Instant::now();
    claimed.push(info.id.clone());
    if !launch(&info, us).0 {
        return Ok(None);
    }
    let t = first_stdout(client, &info.id, echo).await?;
    let t2 = Instant::now();
    let steady = first_stdout(client, &info.id, echo).await?;
    Ok(Some((t - t0, t - t1, steady - t2)))
}

/// Runs `echo` in `id`; when its first stdout event reached this client.
async fn first_stdout(client: &Client, id: &str, echo: &RunCommandRequest) -> anyhow::Result<Instant> {
    let mut first = None;
    let o = client
        .exec(id, echo, |ev| {
            if ev.kind == "stdout" && first.is_none() {
                first = Some(Instant::now());
            }
        })
        .await?;
    first.ok_or_else(|| anyhow::anyhow!("no stdout event (exit code {:?}, error {:?})", o.exit_code, o.error))
}

type Reply = (Result<(SandboxInfo, u64), ClientError>, Duration);

/// `n` creates released at once. Each task holds an open connection first
/// (a discarded GET each), so the figure is the claim, not `n` TCP handshakes.
async fn burst(client: &Client, n: usize, f: &mut ClaimFigures, claimed: &Claimed) {
    let mut warmup = JoinSet::new();
    for _ in 0..n {
        let c = client.clone();
        warmup.spawn(async move { c.get_raw("/health").await.map(|_| ()) });
    }
    while warmup.join_next().await.is_some() {}

    let gate = Arc::new(tokio::sync::Barrier::new(n + 1));
    let mut set = JoinSet::new();
    for _ in 0..n {
        let (c, gate) = (client.clone(), gate.clone());
        set.spawn(async move {
            gate.wait().await;
            let t0 = Instant::now();
            let r = c.create_sandbox(&create_req()).await;
            (r, t0.elapsed())
        });
    }
    gate.wait().await;
    let release = Instant::now();
    let mut replies: Vec<Reply> = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        match r {
            Ok(r) => replies.push(r),
            Err(e) => f.burst_wall.fail(format!("task: {e}")),
        }
    }
    f.burst_span.push(release.elapsed());
    for (r, wall) in replies {
        f.burst_claims += 1;
        match r {
            Ok((info, us)) => {
                let (warm, server) = launch(&info, us);
                if warm {
                    f.burst_warm += 1;
                }
                f.burst_server.push_ms(server);
                f.burst_wall.push(wall);
                claimed.push(info.id);
            }
            Err(e) => {
                f.burst_server.fail(&e);
                f.burst_wall.fail(&e);
            }
        }
    }
}

/// `n` claims from `tasks` concurrent tasks, back to back, against a pool of
/// `n` idle; claims/s = successful claims / elapsed.
async fn sustained(client: &Client, n: usize, tasks: usize, s: &mut Sustain, claimed: &Claimed) {
    s.claims = n;
    s.tasks = tasks;
    let p = Progress::new(format!("sustained claims ({tasks} tasks)"), n);
    let next = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    let t0 = Instant::now();
    for _ in 0..tasks {
        let (c, next, claimed) = (client.clone(), next.clone(), claimed.clone());
        set.spawn(async move {
            let mut out = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let t = Instant::now();
                let r = c.create_sandbox(&create_req()).await;
                let wall = t.elapsed();
                out.push(r.map(|(info, us)| {
                    let (warm, server) = launch(&info, us);
                    claimed.push(info.id);
                    (warm, server, wall)
                }));
            }
            out
        });
    }
    let mut results = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        match r {
            Ok(v) => results.extend(v),
            Err(e) => s.wall.fail(format!("task: {e}")),
        }
    }
    s.elapsed = t0.elapsed();
    for r in results {
        match r {
            Ok((warm, server, wall)) => {
                s.warm += usize::from(warm);
                s.server.push_ms(server);
                s.wall.push(wall);
            }
            Err(e) => {
                s.server.fail(&e);
                s.wall.fail(&e);
            }
        }
    }
    p.tick(n);
    p.finish(&s.wall);
}
