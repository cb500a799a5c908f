//! `ember bench network`: what egress networking costs a create. Warm claims
//! from a pool without network and from one with egress (each claim on a full,
//! quiet pool, server-side time), cold creates of both for reference, and the
//! network slot refill rate (slots made by the daemon's refill thread during
//! the run, and the mean time to make one).
use super::pool::{check_no_pool, interruptible, remove_all, BenchPool, TEMPLATE};
use super::stats::{Series, Summary};
use anyhow::Context;
use ember_client::Client;
use ember_types::api::{CreatePoolRequest, CreateSandboxRequest};
use serde_json::json;

async fn one_create(client: &Client, egress: bool, s: &mut Series, made: &mut Vec<String>) {
    let req = CreateSandboxRequest {
        template: Some(TEMPLATE.into()),
        network: Some(if egress { "egress" } else { "none" }.into()),
        ..Default::default()
    };
    match client.create_sandbox(&req).await {
        Ok((info, micros)) => {
            s.push_ms(micros as f64 / 1000.0);
            made.push(info.id);
        }
        Err(e) => s.fail(e),
    }
}

/// `runs` warm claims from a pool of its own with (or without) egress.
async fn warm(client: &Client, egress: bool, runs: usize) -> anyhow::Result<(Series, usize)> {
    let kind = if egress { "net-egress" } else { "net-none" };
    let name = format!("bench-{kind}-{}", std::process::id());
    let req = CreatePoolRequest {
        name: Some(name.clone()),
        template: TEMPLATE.into(),
        min: 0,
        max: 2,
        target: Some(2.into()),
        network: Some(if egress { "egress" } else { "none" }.into()),
        ..Default::default()
    };
    client.create_pool(&req).await.with_context(|| format!("creating pool {name}"))?;
    let pool = BenchPool { name };
    let mut s = Series::default();
    let mut made = Vec::new();
    let res = interruptible(async {
        for _ in 0..runs {
            pool.wait_full(client, 2).await?;
            one_create(client, egress, &mut s, &mut made).await;
            if s.gave_up() {
                break;
            }
        }
        Ok(())
    })
    .await;
    let warm = made.len();
    let _ = remove_all(client, made).await;
    let _ = pool.remove(client).await;
    res?;
    Ok((s, warm))
}

async fn cold(client: &Client, egress: bool, runs: usize) -> Series {
    let mut s = Series::default();
    for _ in 0..runs {
        let mut made = Vec::new();
        one_create(client, egress, &mut s, &mut made).await;
        let _ = remove_all(client, made).await;
        if s.gave_up() {
            break;
        }
    }
    s
}

fn row(label: &str, s: &Summary) {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    println!("{label:<24} {:>9} {:>9} {:>9} {:>6} {:>6}", f(s.p50_ms), f(s.p90_ms), f(s.p99_ms), s.samples, s.failed);
}

pub async fn run(client: &Client, runs: usize, json_out: bool) -> anyhow::Result<i32> {
    if runs == 0 {
        anyhow::bail!("--runs must be at least 1");
    }
    let before = client.network_node().await.context("reading the daemon's network")?;
    if !before.enabled {
        anyhow::bail!("egress networking is off on this daemon (ember serve without --network-range none)");
    }
    check_no_pool(client).await?;
    eprintln!("ember bench network: {runs} runs per figure");
    let t0 = std::time::Instant::now();
    let (warm_none, _) = warm(client, false, runs).await?;
    let (warm_egress, _) = warm(client, true, runs).await?;
    let cold_runs = runs.div_ceil(5);
    let cold_none = cold(client, false, cold_runs).await;
    let cold_egress = cold(client, true, cold_runs).await;
    let elapsed = t0.elapsed().as_secs_f64();
    let after = client.network_node().await.context("reading the daemon's network")?;
    let made = after.created_total.saturating_sub(before.created_total);
    let per_slot_ms = after.create_micros_avg as f64 / 1000.0;
    let rate = if per_slot_ms > 0.0 { 1000.0 / per_slot_ms } else { 0.0 };
    let figures = [
        ("warm claim, no network", warm_none.summary()),
        ("warm claim, egress", warm_egress.summary()),
        ("cold create, no network", cold_none.summary()),
        ("cold create, egress", cold_egress.summary()),
    ];
    let failed = figures.iter().any(|(_, s)| s.failed > 0);
    if json_out {
        let v = json!({
            "runs": runs,
            "figures": figures.iter().map(|(k, s)| json!({"figure": k, "serverMs": s})).collect::<Vec<_>>(),
            "slots": {
                "madeDuringRun": made, "runSecs": elapsed, "meanMsPerSlot": per_slot_ms,
                "refillPerSec": rate, "readyTarget": after.target, "ready": after.ready,
            },
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!();
        println!("server-side ms            {:>9} {:>9} {:>9} {:>6} {:>6}", "p50", "p90", "p99", "n", "failed");
        for (k, s) in &figures {
            row(k, s);
        }
        println!(
            "slot refill: {made} slots made in {elapsed:.1} s; {per_slot_ms:.1} ms per slot \
             (netns + veth + addresses) = {rate:.0} slots/s on one thread; ready target {}",
            after.target
        );
    }
    Ok(if failed { 1 } else { 0 })
}
