//! What `ember bench tasks` puts beside its throughput figure, measured in the
//! same run on the same daemon:
//!
//! - where a worker's time goes: the server's per-step histograms
//!   (`ember_task_phase_seconds`), differenced over the run;
//! - the sandbox floor: the work one task needs when it has a sandbox of its
//!   own (warm claim, one `true`, removal), driven straight through the API
//!   with no queue at all — the queue cannot beat it;
//! - the exec floor: `true` run again and again in sandboxes that already
//!   exist — what any scheme that reuses sandboxes cannot beat.
use super::pool::TEMPLATE;
use anyhow::Context;
use ember_client::Client;
use ember_types::api::CreateSandboxRequest;
use ember_types::execd::RunCommandRequest;
use std::collections::BTreeMap;
use std::time::Instant;

/// `phase → (seconds summed, observations)` from `/metrics`.
#[derive(Default)]
pub struct Phases(BTreeMap<String, (f64, u64)>);

/// The order a worker goes through them (see `tasks/worker.rs`).
const ORDER: [&str; 8] = ["lease", "fence", "sandbox", "started", "exec", "finish", "remove", "reset"];

pub async fn phases(client: &Client) -> anyhow::Result<Phases> {
    let (_, body) = client.get_raw("/metrics").await.context("reading /metrics")?;
    let mut out = Phases::default();
    for line in String::from_utf8_lossy(&body).lines() {
        let Some(rest) = line.strip_prefix("ember_task_phase_seconds_") else { continue };
        let (kind, rest) = rest.split_once("{phase=\"").unwrap_or(("", ""));
        let Some((phase, value)) = rest.split_once("\"} ") else { continue };
        let Ok(v) = value.trim().parse::<f64>() else { continue };
        let e = out.0.entry(phase.to_string()).or_default();
        match kind {
            "sum" => e.0 = v,
            "count" => e.1 = v as u64,
            _ => {}
        }
    }
    Ok(out)
}

/// Prints the time per step between two readings: the mean of each step
/// when it happens, and its share of one task (a step that happens for only
/// some tasks, such as a cold create or a reset, weighs in by how often).
pub fn print_breakdown(before: &Phases, after: &Phases) {
    let delta = |phase: &str| {
        let (s1, n1) = after.0.get(phase).copied().unwrap_or_default();
        let (s0, n0) = before.0.get(phase).copied().unwrap_or_default();
        (s1 - s0, n1.saturating_sub(n0))
    };
    let (_, tasks) = delta("lease");
    if tasks == 0 {
        return;
    }
    println!("worker time by step (server side): mean when it happens, share of one task");
    let mut total = 0.0;
    for phase in ORDER {
        let (secs, n) = delta(phase);
        if n == 0 {
            continue;
        }
        let share_ms = secs / tasks as f64 * 1e3;
        total += share_ms;
        println!("  {phase:>8}: {:>8.3} ms × {n:>5} → {share_ms:>8.3} ms per task", secs / n as f64 * 1e3);
    }
    println!("  {:>8}: {total:>8.3} ms of one worker's time per task", "sum");
}

/// Sandbox floor: `count` rounds of claim (warm while the pool lasts) + `true`
/// + removal, `parallel` at a time. Returns rounds per second.
pub async fn sandbox_floor(client: &Client, count: usize, parallel: usize) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for w in 0..parallel {
        let c = client.clone();
        let n = count / parallel + usize::from(w < count % parallel);
        set.spawn(async move {
            for _ in 0..n {
                let req = CreateSandboxRequest { template: Some(TEMPLATE.into()), ..Default::default() };
                let (sb, _) = c.create_sandbox(&req).await.context("floor: create")?;
                let run = c.exec(&sb.id, &true_cmd(), |_| {}).await;
                c.delete_sandbox(&sb.id).await.context("floor: delete")?;
                anyhow::ensure!(run.context("floor: exec")?.exit_code == Some(0), "floor: `true` failed");
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(count as f64 / t0.elapsed().as_secs_f64())
}

/// Exec floor: `parallel` sandboxes created first, then `count` runs of
/// `true` spread over them. Returns runs per second.
pub async fn exec_floor(client: &Client, count: usize, parallel: usize) -> anyhow::Result<f64> {
    let mut ids = Vec::new();
    for _ in 0..parallel {
        let req = CreateSandboxRequest { template: Some(TEMPLATE.into()), ..Default::default() };
        ids.push(client.create_sandbox(&req).await.context("exec floor: create")?.0.id);
    }
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for (w, id) in ids.iter().enumerate() {
        let (c, id) = (client.clone(), id.clone());
        let n = count / parallel + usize::from(w < count % parallel);
        set.spawn(async move {
            for _ in 0..n {
                let out = c.exec(&id, &true_cmd(), |_| {}).await.context("exec floor: exec")?;
                anyhow::ensure!(out.exit_code == Some(0), "exec floor: `true` failed");
            }
            anyhow::Ok(())
        });
    }
    let mut res = Ok(());
    while let Some(r) = set.join_next().await {
        res = res.and(r.map_err(anyhow::Error::from).and_then(|x| x));
    }
    let rate = count as f64 / t0.elapsed().as_secs_f64();
    for id in &ids {
        let _ = client.delete_sandbox(id).await;
    }
    res.map(|_| rate)
}

fn true_cmd() -> RunCommandRequest {
    RunCommandRequest { argv: Some(vec!["true".into()]), ..Default::default() }
}
