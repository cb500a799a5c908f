//! `ember bench classes`: per available runtime class, in one run against the
//! same daemon, cold create (server side, `X-Ember-Launch-Micros`) p50/p99,
//! remove, the exec round trip (`true` through the agent), a stat-heavy
//! micro-workload and the memory per idle sandbox (`class_extra.rs`), warm
//! claims from a pool of the class (`class_warm.rs`), then each class's
//! cold-create p50 as a ratio to native's; for runsc, checkpoint and restore
//! p50/p99 (`checkpoint.rs`).
use super::class_extra::{idle_memory, stat_workload, IdleMemory};
use super::class_warm::{self, WarmFigures};
use super::stats::{Progress, Series, Summary};
use ember_client::Client;
use ember_types::api::CreateSandboxRequest;
use ember_types::execd::RunCommandRequest;
use std::time::Instant;

struct ClassFigures {
    class: String,
    create: Series,
    delete: Series,
    exec: Series,
    stat: Series,
    memory: Result<IdleMemory, String>,
    warm: WarmFigures,
}

async fn measure(client: &Client, class: &str, runs: usize, idle: usize) -> ClassFigures {
    let mut f = ClassFigures {
        class: class.into(),
        create: Series::default(),
        delete: Series::default(),
        exec: Series::default(),
        stat: Series::default(),
        memory: Err("not measured".into()),
        warm: WarmFigures::default(),
    };
    let req =
        CreateSandboxRequest { template: Some("host".into()), runtime_class: Some(class.into()), ..Default::default() };
    let p = Progress::new(format!("{class} create+rm"), runs);
    for i in 0..runs {
        if f.create.gave_up() {
            break;
        }
        match client.create_sandbox(&req).await {
            Ok((info, header_us)) => {
                let us = if header_us > 0 { header_us } else { info.launch.as_ref().map_or(0, |l| l.micros) };
                f.create.push_ms(us as f64 / 1000.0);
                let t = Instant::now();
                match client.delete_sandbox(&info.id).await {
                    Ok(()) => f.delete.push(t.elapsed()),
                    Err(e) => f.delete.fail(format!("{}: {e}", info.id)),
                }
            }
            Err(e) => f.create.fail(e),
        }
        p.tick(i + 1);
    }
    p.finish(&f.create);
    if let Ok((info, _)) = client.create_sandbox(&req).await {
        let exec = RunCommandRequest { command: Some("true".into()), ..Default::default() };
        let p = Progress::new(format!("{class} exec"), runs);
        for i in 0..runs {
            let t = Instant::now();
            match client.exec(&info.id, &exec, |_| {}).await {
                Ok(r) if r.exit_code == Some(0) => f.exec.push(t.elapsed()),
                Ok(r) => f.exec.fail(format!("exit {:?}", r.exit_code)),
                Err(e) => f.exec.fail(e),
            }
            p.tick(i + 1);
        }
        p.finish(&f.exec);
        f.stat = stat_workload(client, &info.id, 3).await;
        let _ = client.delete_sandbox(&info.id).await;
    }
    if idle > 0 {
        f.memory = idle_memory(client, class, idle).await;
    }
    // Last: while the pool exists, a create of this class would be warm.
    f.warm = class_warm::measure(client, class, runs).await;
    f
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

pub async fn run(client: &Client, runs: usize, idle: usize, json: bool) -> anyhow::Result<i32> {
    if runs == 0 {
        anyhow::bail!("--runs must be at least 1");
    }
    let classes = client.list_runtimes().await?;
    let available: Vec<_> = classes.iter().filter(|c| c.available).map(|c| c.name.clone()).collect();
    eprintln!("ember bench classes: {runs} runs per figure; classes {}", available.join(", "));
    let mut all = Vec::new();
    for c in &available {
        all.push(measure(client, c, runs, idle).await);
    }
    let ckpt = match available.iter().any(|c| c == "runsc") {
        true => Some(super::checkpoint::measure(client, runs).await),
        false => None,
    };
    let sums: Vec<(String, Summary, Summary, Summary)> =
        all.iter().map(|f| (f.class.clone(), f.create.summary(), f.delete.summary(), f.exec.summary())).collect();
    let extra: Vec<(Summary, Option<IdleMemory>)> =
        all.iter().map(|f| (f.stat.summary(), f.memory.as_ref().ok().copied())).collect();
    let warm: Vec<(Summary, Summary)> = all.iter().map(|f| (f.warm.server.summary(), f.warm.wall.summary())).collect();
    let native = sums.iter().find(|s| s.0 == "native").and_then(|s| s.1.p50_ms);
    let ratio = |p50: Option<f64>| match (p50, native) {
        (Some(a), Some(n)) if n > 0.0 => Some(a / n),
        _ => None,
    };
    if json {
        let v: Vec<_> = sums
            .iter()
            .zip(&extra)
            .zip(warm.iter().zip(&all))
            .map(|(((c, cr, de, ex), (st, mem)), ((ws, ww), f))| {
                serde_json::json!({"class": c, "coldCreate": cr, "remove": de, "execRoundTrip": ex,
                    "stat100k": st, "idleMemory": mem, "coldCreateP50VsNative": ratio(cr.p50_ms),
                    "warmClaim": ws, "warmClaimWall": ww, "warmMisses": f.warm.misses, "warmErrors": f.warm.errors})
            })
            .collect();
        let ck = ckpt.as_ref().map(|c| c.as_ref().map_err(String::as_str).ok());
        let doc = serde_json::json!({"runs": runs, "classes": v, "runscCheckpoint": ck.flatten()});
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!();
        println!(
            "{:<8} {:>13} {:>13} {:>11} {:>11} {:>10} {:>11} {:>11} {:>13} {:>9} {:>11} {:>9}",
            "class",
            "create p50ms",
            "create p99ms",
            "warm p50ms",
            "warm p99ms",
            "rm p50ms",
            "exec p50ms",
            "exec p99ms",
            "100k stat ms",
            "host MiB",
            "cgroup MiB",
            "vs native"
        );
        for (((c, cr, de, ex), (st, mem)), (ws, _)) in sums.iter().zip(&extra).zip(&warm) {
            let r = ratio(cr.p50_ms).map_or_else(|| "-".into(), |r| format!("{r:.1}x"));
            let mib = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}"));
            println!(
                "{c:<8} {:>13} {:>13} {:>11} {:>11} {:>10} {:>11} {:>11} {:>13} {:>9} {:>11} {r:>9}",
                ms(cr.p50_ms),
                ms(cr.p99_ms),
                ms(ws.p50_ms),
                ms(ws.p99_ms),
                ms(de.p50_ms),
                ms(ex.p50_ms),
                ms(ex.p99_ms),
                ms(st.p50_ms),
                mib(mem.and_then(|m| m.host_mib)),
                mib(mem.and_then(|m| m.cgroup_mib)),
            );
        }
        if let (Some(g), Some(n)) = (sums.iter().find(|s| s.0 == "runsc").and_then(|s| s.1.p50_ms), native) {
            println!("gVisor (runsc) cold create p50 is {:.1}x native's ({g:.2} ms vs {n:.2} ms)", g / n.max(1e-9));
        }
        if let Some(c) = &ckpt {
            super::checkpoint::print(c, sums.iter().find(|s| s.0 == "runsc").and_then(|s| s.1.p50_ms));
        }
        println!("memory: per idle sandbox, {idle} at once: host = MemAvailable drop, cgroup = charged to its cgroup");
        class_warm::print_notes(all.iter().map(|f| (f.class.as_str(), &f.warm)));
        for (f, (st, _)) in all.iter().zip(&extra) {
            if let Some(e) = st.first_error.as_ref() {
                println!("{}: stat workload: {e}", f.class);
            }
            if let (true, Err(e)) = (idle > 0, &f.memory) {
                println!("{}: idle memory: {e}", f.class);
            }
        }
        for (c, cr, _, ex) in &sums {
            if let Some(e) = cr.first_error.as_ref().or(ex.first_error.as_ref()) {
                println!("{c}: first error: {e}");
            }
        }
    }
    let failed = sums.iter().any(|(_, cr, _, ex)| cr.samples == 0 || ex.samples == 0)
        || warm.iter().any(|(ws, _)| ws.samples == 0);
    Ok(i32::from(failed))
}
