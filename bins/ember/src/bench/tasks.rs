//! `ember bench tasks`: throughput of trivial tasks (each in its own sandbox,
//! warm from a pool of its own unless `--no-pool`), queue latency from submit
//! to start, and MTTD after a worker's sandbox is killed, per lease and
//! heartbeat setting. Figures come from the server's timestamps.
use super::pool::BenchPool;
use super::stats::Series;
use super::task_floor;
use crate::commands::parse_duration;
use anyhow::{bail, Context};
use clap::Args;
use ember_client::Client;
use ember_types::task::{SubmitTaskRequest, TaskRecord, TaskState};
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct TasksArgs {
    /// Trivial tasks (`true`) in the throughput figure.
    #[arg(long, default_value_t = 1000)]
    pub count: usize,
    /// Concurrent submitters.
    #[arg(long, default_value_t = 16)]
    pub submitters: usize,
    /// Idle sandboxes kept warm for the tasks (0: cold creates only).
    #[arg(long, default_value_t = 32)]
    pub pool: u32,
    /// LEASE/HEARTBEAT settings for the MTTD figure (comma-separated).
    #[arg(long, default_value = "1s/250ms,2s/500ms,4s/1s")]
    pub mttd: String,
    /// Worker kills per MTTD setting.
    #[arg(long, default_value_t = 3)]
    pub kills: usize,
    /// Rounds of the floors measured beside the throughput (0: skip them).
    #[arg(long, default_value_t = 300)]
    pub floor_count: usize,
    /// Concurrent clients driving the floors (match the daemon's --task-workers).
    #[arg(long, default_value_t = 8)]
    pub floor_parallel: usize,
    /// Skip the second throughput run, whose tasks opt in to `reuseSandbox`.
    #[arg(long)]
    pub no_reuse: bool,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

pub async fn run(client: &Client, a: TasksArgs) -> anyhow::Result<i32> {
    if a.count == 0 || a.submitters == 0 {
        bail!("--count and --submitters must be at least 1");
    }
    let pool = if a.pool > 0 {
        let p = BenchPool::create(client, "tasks", a.pool).await?;
        p.wait_full(client, a.pool).await?;
        Some(p)
    } else {
        None
    };
    let res = measure(client, &a, pool.as_ref()).await;
    if let Some(p) = pool {
        p.remove(client).await?;
    }
    let all_done = res?;
    let mut mttd_ok = true;
    println!("\nMTTD after a worker's sandbox is killed (kill → lease expiry detected, server clock):");
    println!("{:>8} {:>10} {:>9} {:>9} {:>9}", "LEASE", "HEARTBEAT", "p50 ms", "max ms", "runs");
    for setting in a.mttd.split(',').filter(|s| !s.is_empty()) {
        let (l, h) = setting.split_once('/').with_context(|| format!("--mttd {setting:?} is not LEASE/HEARTBEAT"))?;
        let (lease, hb) = (parse_duration(l)?, parse_duration(h)?);
        let mut s = Series::default();
        for _ in 0..a.kills {
            match mttd_once(client, lease, hb).await {
                Ok(ms) => s.push_ms(ms),
                Err(e) => s.fail(format!("{e:#}")),
            }
        }
        let sum = s.summary();
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        println!("{l:>8} {h:>10} {:>9} {:>9} {:>9}", f(sum.p50_ms), f(sum.max_ms), sum.samples);
        if let Some(e) = sum.first_error {
            eprintln!("  failed: {e}");
            mttd_ok = false;
        }
    }
    Ok(i32::from(!all_done || !mttd_ok))
}

/// Throughput with a sandbox per task, then with opt-in reuse, each with the
/// pool full at the start and its per-step breakdown; then the floors.
/// `false` when a task did not succeed.
async fn measure(client: &Client, a: &TasksArgs, pool: Option<&BenchPool>) -> anyhow::Result<bool> {
    let mut all_done = true;
    for reuse in [false, true] {
        if reuse && a.no_reuse {
            continue;
        }
        if let Some(p) = pool {
            p.wait_full(client, a.pool).await?;
        }
        let before = task_floor::phases(client).await?;
        let (done, failed) = throughput(client, a, reuse).await?;
        task_floor::print_breakdown(&before, &task_floor::phases(client).await?);
        all_done &= failed == 0 && done == a.count;
    }
    if a.floor_count > 0 {
        let (sandbox, exec) = floors(client, a, pool).await?;
        println!("\nfloor, same run, no queue, {} clients:", a.floor_parallel);
        println!("  sandbox per task (warm claim + `true` + remove over the API): {sandbox:.1} /s");
        println!("  exec only (`true` in sandboxes that already exist):          {exec:.1} /s");
    }
    Ok(all_done)
}

/// The floors, with the bench pool refilled first so they start as warm as
/// the throughput run did.
async fn floors(client: &Client, a: &TasksArgs, pool: Option<&BenchPool>) -> anyhow::Result<(f64, f64)> {
    if let Some(p) = pool {
        p.wait_full(client, a.pool).await?;
    }
    let sandbox = task_floor::sandbox_floor(client, a.floor_count, a.floor_parallel).await?;
    let exec = task_floor::exec_floor(client, a.floor_count, a.floor_parallel).await?;
    Ok((sandbox, exec))
}

async fn throughput(client: &Client, a: &TasksArgs, reuse: bool) -> anyhow::Result<(usize, usize)> {
    let how = if reuse {
        "opt-in sandbox reuse (same tenant, processes killed between, files kept)"
    } else {
        "a sandbox per task"
    };
    println!("\n== {} trivial tasks, {how}; {} submitters, pool {}", a.count, a.submitters, a.pool);
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let per = a.count.div_ceil(a.submitters);
    for s in 0..a.submitters {
        let c = client.clone();
        let n = per.min(a.count.saturating_sub(s * per));
        set.spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..n {
                let req = SubmitTaskRequest {
                    command: vec!["true".into()],
                    attempts: Some(1),
                    reuse_sandbox: reuse.then_some(true),
                    ..Default::default()
                };
                ids.push(c.submit_task(&req).await?.0.id);
            }
            anyhow::Ok(ids)
        });
    }
    let mut ids = Vec::new();
    while let Some(r) = set.join_next().await {
        ids.extend(r??);
    }
    let submit = t0.elapsed();
    let mut recs: Vec<TaskRecord>;
    loop {
        recs = Vec::with_capacity(ids.len());
        for id in &ids {
            recs.push(client.get_task(id).await?);
        }
        if recs.iter().all(|r| r.state.is_terminal()) {
            break;
        }
        if t0.elapsed() > Duration::from_secs(600) {
            bail!("tasks still unfinished after 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let done = recs.iter().filter(|r| r.state == TaskState::Succeeded).count();
    let first = recs.iter().map(|r| r.submitted_at_ms).min().unwrap_or(0);
    let last = recs.iter().filter_map(|r| r.transitions.last().map(|t| t.at_ms)).max().unwrap_or(first);
    let mut lat = Series::default();
    for r in &recs {
        match r.started_at(1) {
            Some(s) => lat.push_ms((s - r.submitted_at_ms) as f64),
            None => lat.fail(format!("task {} never started ({})", r.id, r.state.as_str())),
        }
    }
    let l = lat.summary();
    let secs = ((last - first) as f64 / 1e3).max(1e-3);
    let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    println!("tasks: {} succeeded of {} ({} failed)", done, recs.len(), recs.len() - done);
    println!("submit (queue accepts, client side): {:.0} tasks/s", ids.len() as f64 / submit.as_secs_f64());
    println!("throughput (first submit → last finish): {:.1} tasks/s over {secs:.2} s", done as f64 / secs);
    println!("queue latency submit → start: p50 {} ms, p99 {} ms, max {} ms", f(l.p50_ms), f(l.p99_ms), f(l.max_ms));
    Ok((done, recs.len() - done))
}

/// One kill: a long task starts, its sandbox is removed, and the time until
/// the queue notices (the attempt's end) is measured.
async fn mttd_once(client: &Client, lease: Duration, hb: Duration) -> anyhow::Result<f64> {
    let req = SubmitTaskRequest {
        command: vec!["sleep".into(), "600".into()],
        attempts: Some(2),
        lease_ms: Some(lease.as_millis() as u64),
        heartbeat_ms: Some(hb.as_millis() as u64),
        tier: Some(ember_types::task::Tier::Interactive),
        ..Default::default()
    };
    let (t, _) = client.submit_task(&req).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let sandbox = loop {
        let r = client.get_task(&t.id).await?;
        if let (TaskState::Running, Some(sb)) = (r.state, r.attempts.last().and_then(|a| a.sandbox.clone())) {
            break sb;
        }
        if Instant::now() > deadline {
            bail!("task {} did not start", t.id);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let killed = now_ms();
    client.delete_sandbox(&sandbox).await?;
    let detected = loop {
        let r = client.get_task(&t.id).await?;
        if let Some(end) = r.attempts.first().and_then(|a| a.ended_at_ms) {
            break end;
        }
        if Instant::now() > deadline + lease * 4 {
            bail!("task {}: the lease never expired", t.id);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = client.cancel_task(&t.id).await;
    Ok((detected - killed) as f64)
}
