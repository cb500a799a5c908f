//! `ember bench claim --from-snapshot SNAP|new`: what a golden pool buys.
//! With `new` a sandbox is primed (`--primed` of files written, as installed
//! packages or a loaded repository would be), snapshotted and removed (else
//! the given snapshot is used, and kept); then, in the same
//! run and timed the same way (create call started → first stdout event of
//! `echo x`, through [`Client`] like any client):
//! - a cold restore of the snapshot (no golden pool exists yet),
//! - a claim from a plain pool of the same template (no primed files),
//! - a claim from a golden pool of the snapshot (the primed files),
//!
//! and the two pools' refill cost (their moving average of a member's start).
//! Each warm claim starts on a full, quiet pool; claimed sandboxes are
//! removed between rounds, untimed.
use super::pool::{check_no_pool, interruptible, BenchPool, Claimed, TEMPLATE};
use super::stats::{Series, Summary};
use anyhow::Context;
use ember_client::Client;
use ember_types::api::{CreatePoolRequest, CreateSandboxRequest};
use ember_types::execd::RunCommandRequest;
use std::time::Instant;

/// Idle members of each pool.
const TARGET: u32 = 2;

pub struct GoldenArgs {
    pub runs: usize,
    /// A Ready sandbox snapshot to use (kept); `None`: the bench primes one.
    pub snapshot: Option<String>,
    pub primed_mib: u32,
    pub json: bool,
}

#[derive(Default)]
struct Figures {
    cold_restore: Series,
    plain_claim: Series,
    golden_claim: Series,
    /// Claims answered cold (the pool missed) or restores answered warm.
    wrong_kind: usize,
    plain_refill_ms: f64,
    golden_refill_ms: f64,
}

pub async fn run(client: &Client, a: GoldenArgs) -> anyhow::Result<i32> {
    if a.runs == 0 {
        anyhow::bail!("--runs must be at least 1");
    }
    check_no_pool(client).await?;
    let claimed = Claimed::default();
    let sid = match &a.snapshot {
        Some(s) => s.clone(),
        None => prime(client, a.primed_mib, &claimed).await?,
    };
    let mut pools_made = Vec::new();
    let mut f = Figures::default();
    let res = interruptible(measure(client, &a, &sid, &mut f, &claimed, &mut pools_made)).await;
    for p in pools_made {
        let _ = p.remove(client).await;
    }
    let left = claimed.remove(client).await;
    if a.snapshot.is_none() {
        let _ = client.delete_sandbox_snapshot(&sid).await;
    }
    res?;
    if !left.is_empty() {
        eprintln!("could not remove: {left:?}");
    }
    let rows = [
        ("cold restore from the snapshot", f.cold_restore.summary()),
        ("claim from a plain pool", f.plain_claim.summary()),
        ("claim from the golden pool", f.golden_claim.summary()),
    ];
    if a.json {
        let v = serde_json::json!({
            "snapshot": sid,
            "coldRestore": rows[0].1, "plainClaim": rows[1].1, "goldenClaim": rows[2].1,
            "plainRefillMs": f.plain_refill_ms, "goldenRefillMs": f.golden_refill_ms,
            "wrongKind": f.wrong_kind,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print(&rows, &f, &sid);
    }
    let failed: usize = rows.iter().map(|(_, s)| s.failed).sum();
    Ok(if failed + f.wrong_kind == 0 { 0 } else { 1 })
}

/// A source sandbox with `mib` MiB of files under /opt/primed, snapshotted
/// and removed: the snapshot's id.
async fn prime(client: &Client, mib: u32, claimed: &Claimed) -> anyhow::Result<String> {
    let req = CreateSandboxRequest {
        template: Some(TEMPLATE.into()),
        resources: Some(ember_types::api::ResourcesSpec {
            disk: Some(format!("{}Mi", mib + 256)),
            ..Default::default()
        }),
        ..Default::default()
    };
    let src = client.create_sandbox(&req).await.context("creating the source sandbox")?.0.id;
    claimed.push(src.clone());
    let script = format!(
        "set -e; mkdir -p /opt/primed; for i in $(seq 1 {mib}); do head -c 1048576 /dev/urandom > /opt/primed/f$i; done"
    );
    let cmd = RunCommandRequest { command: Some(script), uid: Some(0), gid: Some(0), ..Default::default() };
    let o = client.exec(&src, &cmd, |_| {}).await.context("priming the source")?;
    anyhow::ensure!(o.exit_code == Some(0), "priming the source exited {:?}", o.exit_code);
    let snap = client.snapshot_sandbox(&src, Some("bench-golden")).await.context("snapshotting the source")?;
    let _ = claimed.remove(client).await;
    Ok(snap.id)
}

async fn measure(
    client: &Client,
    a: &GoldenArgs,
    sid: &str,
    f: &mut Figures,
    claimed: &Claimed,
    pools: &mut Vec<BenchPool>,
) -> anyhow::Result<()> {
    let restore = CreateSandboxRequest { snapshot_id: Some(sid.into()), ..Default::default() };
    let plain = CreateSandboxRequest { template: Some(TEMPLATE.into()), ..Default::default() };
    for i in 0..a.runs {
        let copies = once(client, &restore, "cold", &mut f.cold_restore, &mut f.wrong_kind, claimed).await;
        let _ = claimed.remove(client).await;
        remove_copies(client, copies).await;
        eprint!("\rcold restores: {}/{}", i + 1, a.runs);
    }
    eprintln!();
    pools.push(BenchPool::create(client, "plain", TARGET).await?);
    let name = format!("bench-golden-{}", std::process::id());
    let req = CreatePoolRequest {
        name: Some(name.clone()),
        from_snapshot: Some(sid.into()),
        max: TARGET,
        target: Some(TARGET.into()),
        ..Default::default()
    };
    client.create_pool(&req).await.with_context(|| format!("creating pool {name}"))?;
    pools.push(BenchPool { name });
    for i in 0..a.runs {
        for p in pools.iter() {
            p.wait_full(client, TARGET).await?;
        }
        once(client, &plain, "warm", &mut f.plain_claim, &mut f.wrong_kind, claimed).await;
        let copies = once(client, &restore, "warm", &mut f.golden_claim, &mut f.wrong_kind, claimed).await;
        let _ = claimed.remove(client).await;
        remove_copies(client, copies).await;
        eprint!("\rwarm claims: {}/{}", i + 1, a.runs);
    }
    eprintln!();
    f.plain_refill_ms = client.get_pool(&pools[0].name).await?.sizing.refill_secs * 1000.0;
    f.golden_refill_ms = client.get_pool(&pools[1].name).await?.sizing.refill_secs * 1000.0;
    Ok(())
}

/// One create (which must launch as `kind`) and `echo x`: create call
/// started → first stdout event. Returns the workspaces a restore made for
/// the sandbox (a snapshot's read-write ones), which outlive it.
async fn once(
    client: &Client,
    req: &CreateSandboxRequest,
    kind: &str,
    s: &mut Series,
    wrong: &mut usize,
    claimed: &Claimed,
) -> Vec<String> {
    let echo = RunCommandRequest { argv: Some(vec!["echo".into(), "x".into()]), ..Default::default() };
    let t0 = Instant::now();
    let info = match client.create_sandbox(req).await {
        Ok((info, _)) => info,
        Err(e) => {
            s.fail(e);
            return Vec::new();
        }
    };
    claimed.push(info.id.clone());
    let suffix = format!("-{}", info.id.get(..8).unwrap_or_default());
    let copies = info.workspaces.iter().filter(|w| !w.read_only && w.name.ends_with(&suffix));
    let copies = copies.map(|w| w.name.clone()).collect();
    if info.launch.as_ref().map(|l| l.kind.as_str()) != Some(kind) {
        *wrong += 1;
        return copies;
    }
    let mut first = None;
    match client
        .exec(&info.id, &echo, |ev| {
            if ev.kind == "stdout" && first.is_none() {
                first = Some(Instant::now());
            }
        })
        .await
    {
        Ok(_) => match first {
            Some(t) => s.push(t - t0),
            None => s.fail("no stdout event"),
        },
        Err(e) => s.fail(e),
    }
    copies
}

/// Removes a restore's workspace copies once its sandbox is gone.
async fn remove_copies(client: &Client, names: Vec<String>) {
    for n in names {
        if let Err(e) = client.delete_workspace(&n).await {
            eprintln!("could not remove workspace {n}: {e}");
        }
    }
}

fn print(rows: &[(&str, Summary)], f: &Figures, sid: &str) {
    let v = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.2}"));
    println!("claim -> first stdout of `echo x` (ms), from sandbox snapshot {sid}");
    println!("{:<32} {:>9} {:>9} {:>5} {:>6}", "", "p50", "p99", "n", "failed");
    for (label, s) in rows {
        println!("{label:<32} {:>9} {:>9} {:>5} {:>6}", v(s.p50_ms), v(s.p99_ms), s.samples, s.failed);
    }
    println!(
        "refill (moving average of a member's start, ms): plain {:.1}, golden {:.1}",
        f.plain_refill_ms, f.golden_refill_ms
    );
    if f.wrong_kind > 0 {
        println!("{} creates launched other than expected (a pool missed, or another pool served them)", f.wrong_kind);
    }
}
