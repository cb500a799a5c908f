//! `ember bench autopause`: what idle auto-pause costs the call that wakes a
//! sandbox. Two sandboxes in the same run: one with `autoPause: {afterSeconds:
//! 1}`, one without. Each round waits until the first is Paused (polled),
//! then times an exec (`true`, argv) on it — the thaw, then the command —
//! and the same exec on the plain one; p50/p99 of both side by side, and
//! their difference, the resume-on-call cost.
use super::ember::exec_once;
use super::pool::{remove_all, TEMPLATE};
use super::stats::{Series, Summary};
use anyhow::Context;
use ember_client::Client;
use ember_types::api::{AutoPause, CreateSandboxRequest};
use ember_types::execd::RunCommandRequest;
use std::time::{Duration, Instant};

/// Polls until `id` is Paused; `false` after 30 s.
async fn paused(client: &Client, id: &str) -> anyhow::Result<bool> {
    for _ in 0..600 {
        if client.get_sandbox(id).await?.status.state == "Paused" {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(false)
}

async fn timed(client: &Client, id: &str, s: &mut Series) {
    let req = RunCommandRequest { argv: Some(vec!["true".into()]), ..Default::default() };
    let t = Instant::now();
    match exec_once(client, id, &req).await {
        Ok(()) => s.push(t.elapsed()),
        Err(e) => s.fail(e),
    }
}

pub async fn run(client: &Client, runs: usize, json: bool) -> anyhow::Result<i32> {
    let make = |auto: bool| CreateSandboxRequest {
        template: Some(TEMPLATE.into()),
        auto_pause: auto.then_some(AutoPause { after_seconds: 1, checkpoint: false }),
        ..Default::default()
    };
    let sleepy = client.create_sandbox(&make(true)).await.context("creating the auto-pause sandbox")?.0.id;
    let plain = client.create_sandbox(&make(false)).await.context("creating the plain sandbox")?.0.id;
    let (mut wake, mut exec) = (Series::default(), Series::default());
    let mut res = Ok(());
    for i in 0..runs {
        match paused(client, &sleepy).await {
            Ok(true) => {}
            Ok(false) => {
                res = Err(anyhow::anyhow!("round {i}: the sandbox was not auto-paused within 30 s"));
                break;
            }
            Err(e) => {
                res = Err(e);
                break;
            }
        }
        timed(client, &sleepy, &mut wake).await;
        timed(client, &plain, &mut exec).await;
        eprint!("\rautopause: {}/{runs}", i + 1);
    }
    eprintln!();
    let _ = remove_all(client, vec![sleepy, plain]).await;
    res?;
    let (w, e) = (wake.summary(), exec.summary());
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "resumeOnCall": w, "plainExec": e }))?);
    } else {
        print(&w, &e);
    }
    Ok(if w.failed + e.failed == 0 { 0 } else { 1 })
}

fn print(w: &Summary, e: &Summary) {
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
    let d = |a: Option<f64>, b: Option<f64>| f(a.zip(b).map(|(a, b)| a - b));
    println!("{:<28} {:>9} {:>9} {:>6} {:>6}", "exec (ms)", "p50", "p99", "n", "failed");
    println!(
        "{:<28} {:>9} {:>9} {:>6} {:>6}",
        "on an auto-paused sandbox",
        f(w.p50_ms),
        f(w.p99_ms),
        w.samples,
        w.failed
    );
    println!("{:<28} {:>9} {:>9} {:>6} {:>6}", "on a running sandbox", f(e.p50_ms), f(e.p99_ms), e.samples, e.failed);
    println!("{:<28} {:>9} {:>9}", "resume-on-call cost", d(w.p50_ms, e.p50_ms), d(w.p99_ms, e.p99_ms));
}
