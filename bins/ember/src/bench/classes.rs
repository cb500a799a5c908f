//! `ember bench classes`: per available runtime class, in one run against the
//! same daemon, cold create (server side, `X-Ember-Launch-Micros`) p50/p99,
//! remove, and the exec round trip (`true` through the agent), then each
//! class's cold-create p50 as a ratio to native's.
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
}

async fn measure(client: &Client, class: &str, runs: usize) -> ClassFigures {
    let mut f = ClassFigures {
        class: class.into(),
        create: Series::default(),
        delete: Series::default(),
        exec: Series::default(),
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
        let _ = client.delete_sandbox(&info.id).await;
    }
    f
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

pub async fn run(client: &Client, runs: usize, json: bool) -> anyhow::Result<i32> {
    if runs == 0 {
        anyhow::bail!("--runs must be at least 1");
    }
    let classes = client.list_runtimes().await?;
    let available: Vec<_> = classes.iter().filter(|c| c.available).map(|c| c.name.clone()).collect();
    eprintln!("ember bench classes: {runs} runs per figure; classes {}", available.join(", "));
    let mut all = Vec::new();
    for c in &available {
        all.push(measure(client, c, runs).await);
    }
    let sums: Vec<(String, Summary, Summary, Summary)> =
        all.iter().map(|f| (f.class.clone(), f.create.summary(), f.delete.summary(), f.exec.summary())).collect();
    let native = sums.iter().find(|s| s.0 == "native").and_then(|s| s.1.p50_ms);
    let ratio = |p50: Option<f64>| match (p50, native) {
        (Some(a), Some(n)) if n > 0.0 => Some(a / n),
        _ => None,
    };
    if json {
        let v: Vec<_> = sums
            .iter()
            .map(|(c, cr, de, ex)| {
                serde_json::json!({"class": c, "coldCreate": cr, "remove": de, "execRoundTrip": ex,
                    "coldCreateP50VsNative": ratio(cr.p50_ms)})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"runs": runs, "classes": v}))?);
    } else {
        println!();
        println!(
            "{:<8} {:>14} {:>14} {:>12} {:>12} {:>12} {:>10}",
            "class", "create p50 ms", "create p99 ms", "rm p50 ms", "exec p50 ms", "exec p99 ms", "vs native"
        );
        for (c, cr, de, ex) in &sums {
            let r = ratio(cr.p50_ms).map_or_else(|| "-".into(), |r| format!("{r:.1}x"));
            println!(
                "{c:<8} {:>14} {:>14} {:>12} {:>12} {:>12} {r:>10}",
                ms(cr.p50_ms),
                ms(cr.p99_ms),
                ms(de.p50_ms),
                ms(ex.p50_ms),
                ms(ex.p99_ms)
            );
        }
        for (c, cr, _, ex) in &sums {
            if let Some(e) = cr.first_error.as_ref().or(ex.first_error.as_ref()) {
                println!("{c}: first error: {e}");
            }
        }
    }
    let failed = sums.iter().any(|(_, cr, _, ex)| cr.samples == 0 || ex.samples == 0);
    Ok(i32::from(failed))
}
