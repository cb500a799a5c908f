//! Lab 4, workspaces: a task appends numbered, checksummed records, one every
//! 20 ms, and its sandbox is killed mid-task, again and again.
//!
//! Before: the records live in the sandbox's own writable layer; the fresh
//! sandbox that replaces a killed one starts from nothing. After: they live in
//! an ember workspace; each fresh sandbox remounts it, reads the last record
//! and carries on. Kills alternate between removal through the API and
//! SIGKILL of every process in the sandbox but its init (`kill -9 -1` from
//! inside), after which the fresh sandbox takes the workspace's lease over
//! (`steal`, a new epoch) and the old one is removed. Measured: recovery time
//! (kill → the fresh sandbox's first instruction has read the last record),
//! and at the end every record, in order, each checksum checked.
use super::report::{ms, LabReport, Table};
use super::{svg, Scale};
use crate::bench::stats::Series;
use anyhow::Context;
use ember_client::Client;
use ember_types::api::{CreateSandboxRequest, WorkspaceMountSpec};
use ember_types::execd::RunCommandRequest;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::{Duration, Instant};

/// The records file is read back at most this large.
const MAX_RECORDS_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
enum Kill {
    ApiRemove,
    Sigkill,
}

#[derive(Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct After {
    kills: Vec<(Kill, u64)>,
    /// Resumed-at record and recovery time (ms) per round after a kill.
    resumed_at: Vec<u64>,
    recovery_ms: Vec<f64>,
    records: u64,
    in_order: bool,
    bad_checksums: u64,
    missing: u64,
    duplicated: u64,
}

/// The task: carry on from the last record in `dir`, up to `total`.
fn task(dir: &str, total: u64) -> String {
    format!(
        "f={dir}/records; i=$(tail -n1 $f 2>/dev/null | cut -d' ' -f1); i=${{i:-0}}; \
         while [ $i -lt {total} ]; do i=$((i+1)); \
         echo \"$i $(printf %s $i | sha256sum | cut -c1-16)\" >> $f; echo rec $i; sleep 0.02; done; echo finished"
    )
}

fn checksum(i: u64) -> String {
    let h = Sha256::digest(i.to_string().as_bytes());
    h.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

pub async fn run(client: &Client, scale: Scale, dir: &Path) -> anyhow::Result<LabReport> {
    let (kills, total) = match scale {
        Scale::Small => (4, 150),
        Scale::Full => (20, 1000),
    };
    eprintln!("  before: records in the sandbox's own layer, one kill");
    let (written, survived) = baseline(client).await?;
    eprintln!("  after: records in a workspace, {kills} kills");
    let ws = format!("lab4-{}", std::process::id());
    client.create_workspace(&ws, "64Mi").await.with_context(|| format!("creating workspace {ws}"))?;
    let mut live = Vec::new();
    let mut recovery = Series::default();
    let r = crate::bench::pool::interruptible(rounds(client, &ws, kills, total, &mut live, &mut recovery)).await;
    for id in live {
        let _ = client.delete_sandbox(&id).await;
    }
    let removed = client.delete_workspace(&ws).await;
    let after = r?;
    removed.with_context(|| format!("removing workspace {ws}"))?;
    build(written, survived, &after, &recovery, total, scale, dir)
}

/// One sandbox, records in /tmp, removed mid-task; a fresh one counts them.
async fn baseline(client: &Client) -> anyhow::Result<(u64, u64)> {
    let req = CreateSandboxRequest { template: Some("host".into()), ..Default::default() };
    let (a, _) = client.create_sandbox(&req).await.context("creating the baseline's sandbox")?;
    let (_, written) = run_then_kill(client, &a.id, &task("/tmp", 1000), Some(Kill::ApiRemove)).await;
    let (b, _) = client.create_sandbox(&req).await.context("creating the baseline's fresh sandbox")?;
    let out = sh(client, &b.id, "cat /tmp/records 2>/dev/null | wc -l").await;
    let _ = client.delete_sandbox(&b.id).await;
    Ok((written, out?.trim().parse().unwrap_or(0)))
}

async fn rounds(
    client: &Client,
    ws: &str,
    kills: usize,
    total: u64,
    live: &mut Vec<String>,
    recovery: &mut Series,
) -> anyhow::Result<After> {
    let mut after = After::default();
    let mut rng = fastrand::Rng::new();
    let mut killed: Option<(Kill, Instant)> = None;
    for round in 0..=kills {
        let steal = matches!(killed, Some((Kill::Sigkill, _)));
        let mount = WorkspaceMountSpec { name: ws.into(), steal, ..Default::default() };
        let req = CreateSandboxRequest { template: Some("host".into()), workspaces: vec![mount], ..Default::default() };
        let (s, _) = client.create_sandbox(&req).await.with_context(|| format!("round {round}: creating a sandbox"))?;
        // The SIGKILLed sandbox is removed once its successor holds the lease.
        for old in live.drain(..) {
            client.delete_sandbox(&old).await.with_context(|| format!("removing sandbox {old}"))?;
        }
        live.push(s.id.clone());
        let last = sh(client, &s.id, "tail -n1 /workspace/records 2>/dev/null | cut -d' ' -f1; echo .").await?;
        if let Some((_, at)) = killed {
            recovery.push(at.elapsed());
            after.recovery_ms.push(at.elapsed().as_secs_f64() * 1000.0);
            after.resumed_at.push(last.lines().next().and_then(|l| l.parse().ok()).unwrap_or(0));
        }
        let kill = (round < kills).then_some(if round % 2 == 0 { Kill::ApiRemove } else { Kill::Sigkill });
        let pause = Duration::from_millis(rng.u64(150..450));
        let (at, written) = run_then_kill_after(client, &s.id, &task("/workspace", total), kill, pause).await;
        if let Some(k) = kill {
            after.kills.push((k, written));
            killed = Some((k, at));
            if k == Kill::ApiRemove {
                live.clear();
            }
        }
    }
    let id = live.last().context("a sandbox holds the workspace")?;
    let records = sh(client, id, "cat /workspace/records").await?;
    verify(&records, total, &mut after);
    Ok(after)
}

/// The records as read back: in order 1..=total, each checksum right.
fn verify(records: &str, total: u64, a: &mut After) {
    let mut seen = vec![0u32; total as usize + 1];
    let mut prev = 0;
    a.in_order = true;
    for line in records.lines().filter(|l| !l.is_empty()) {
        let mut w = line.split(' ');
        let (Some(Ok(i)), Some(c)) = (w.next().map(str::parse::<u64>), w.next()) else {
            a.bad_checksums += 1;
            continue;
        };
        a.records += 1;
        a.in_order &= i == prev + 1;
        prev = i;
        if c != checksum(i) {
            a.bad_checksums += 1;
        }
        if let Some(n) = seen.get_mut(i as usize) {
            *n += 1;
        }
    }
    a.missing = seen.iter().skip(1).filter(|n| **n == 0).count() as u64;
    a.duplicated = seen.iter().filter(|n| **n > 1).count() as u64;
}

async fn run_then_kill(client: &Client, id: &str, script: &str, kill: Option<Kill>) -> (Instant, u64) {
    run_then_kill_after(client, id, script, kill, Duration::from_millis(300)).await
}

/// Starts `script`, and after `pause` kills its sandbox the `kill` way (or
/// lets it finish); returns when the kill began and the records it reported.
async fn run_then_kill_after(
    client: &Client,
    id: &str,
    script: &str,
    kill: Option<Kill>,
    pause: Duration,
) -> (Instant, u64) {
    let (c, sid, script) = (client.clone(), id.to_string(), script.to_string());
    let task = tokio::spawn(async move { sh(&c, &sid, &script).await.unwrap_or_default() });
    let mut at = Instant::now();
    if let Some(k) = kill {
        tokio::time::sleep(pause).await;
        at = Instant::now();
        let _ = match k {
            Kill::ApiRemove => client.delete_sandbox(id).await.map(|_| String::new()).map_err(anyhow::Error::from),
            Kill::Sigkill => sh(client, id, "kill -9 -1").await,
        };
    }
    let out = task.await.unwrap_or_default();
    (at, out.lines().filter(|l| l.starts_with("rec ")).count() as u64)
}

/// `sh -c script`'s stdout, at most [`MAX_RECORDS_BYTES`]; a stream cut by a
/// kill returns what came before it.
async fn sh(client: &Client, id: &str, script: &str) -> anyhow::Result<String> {
    let req = RunCommandRequest { command: Some(script.into()), ..Default::default() };
    let mut out = String::new();
    let r = client
        .exec(id, &req, |ev| {
            if ev.kind == "stdout" && out.len() < MAX_RECORDS_BYTES {
                let t = ev.text.as_deref().unwrap_or("");
                out.push_str(t);
                if !t.ends_with('\n') {
                    out.push('\n');
                }
            }
        })
        .await;
    match r {
        Ok(_) => Ok(out),
        Err(_) if !out.is_empty() => Ok(out),
        Err(e) => Err(e).with_context(|| format!("running a command in sandbox {id}")),
    }
}

fn build(
    written: u64,
    survived: u64,
    a: &After,
    recovery: &Series,
    total: u64,
    scale: Scale,
    dir: &Path,
) -> anyhow::Result<LabReport> {
    let mut r = LabReport::new(super::lab(4), scale);
    let mut t = Table::new("What a fresh sandbox finds after a kill", &["", "sandbox's own layer", "ember workspace"]);
    let kills = a.kills.len();
    t.row(vec!["kills".into(), "1".into(), kills.to_string()]);
    t.row(vec![
        "records found afterwards".into(),
        format!("{survived} of {written}"),
        format!("{} of {total}", a.records),
    ]);
    let rec = recovery.summary();
    t.row(vec!["recovery p50 / max, ms".into(), "-".into(), format!("{} / {}", ms(rec.p50_ms), ms(rec.max_ms))]);
    t.row(vec![
        "missing / duplicated / bad checksum".into(),
        "-".into(),
        format!("{} / {} / {}", a.missing, a.duplicated, a.bad_checksums),
    ]);
    r.tables.push(t);
    r.check(
        "the sandbox's own layer died with it",
        written > 0 && survived == 0,
        format!("{survived} of {written} records found"),
    );
    let intact = a.records == total && a.in_order && a.missing == 0 && a.duplicated == 0 && a.bad_checksums == 0;
    r.check(
        "the workspace kept every record, in order, checksums intact",
        intact,
        format!(
            "{} records, in order {}, {} missing, {} duplicated, {} bad",
            a.records, a.in_order, a.missing, a.duplicated, a.bad_checksums
        ),
    );
    let resumed = a.resumed_at.len() == kills && a.resumed_at.iter().all(|n| *n > 0);
    r.check("every fresh sandbox carried on from the last record", resumed, format!("resumed at {:?}", a.resumed_at));
    let bars: Vec<(String, f64)> = a
        .kills
        .iter()
        .zip(&a.resumed_at)
        .enumerate()
        .map(|(i, ((k, _), n))| (format!("{}: {k:?}", i + 1), *n as f64))
        .collect();
    r.chart(dir, "resumed-at.svg", svg::bars("Record each fresh sandbox resumed from", "record", &bars))?;
    let times: Vec<(String, f64)> = a
        .kills
        .iter()
        .zip(&a.recovery_ms)
        .enumerate()
        .map(|(i, ((k, _), ms))| (format!("{}: {k:?}", i + 1), *ms))
        .collect();
    r.chart(dir, "recovery.svg", svg::bars("Kill → fresh sandbox has read the last record", "ms", &times))?;
    r.data = serde_json::json!({ "baseline": { "written": written, "survived": survived }, "after": a, "recovery": rec, "total": total });
    Ok(r)
}
