//! `ember bench image`: cold pull+unpack of an image of at least 100 MB that
//! the bench builds itself and serves from a real local registry
//! (`docker-registry` on loopback, pushed with `skopeo`), then create-to-ready
//! from the cached image beside the `host` template, in the same run, through
//! the public API only. The daemon must list the registry as insecure
//! (`ember serve --insecure-registry 127.0.0.1:PORT`).
//!
//! The creates alternate, one `host` then one from the image, and the figure
//! judged is the median of each pair's difference: on a shared machine load
//! drifts by more than the sub-millisecond difference measured, and
//! alternating makes the drift weigh on both sides alike.
use super::registry::{layer_tar, push, write_layout, Config, Entry, Registry};
use super::stats::{Progress, Series, Summary};
use anyhow::Context;
use ember_client::Client;
use ember_types::api::CreateSandboxRequest;
use ember_types::image::{PullRequest, TemplateRequest};
use std::collections::BTreeMap;
use std::time::Instant;

pub struct Args {
    pub runs: usize,
    pub size_mib: u64,
    pub port: u16,
    pub json: bool,
}

/// Pseudo-random, so gzip cannot shrink it and every run has new digests.
pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub async fn run(client: &Client, a: Args) -> anyhow::Result<i32> {
    let size = a.size_mib.max(100) as usize;
    let reg = tokio::task::spawn_blocking(move || Registry::start(a.port)).await?.map_err(anyhow::Error::msg)?;
    let dir = std::env::temp_dir().join(format!("ember-bench-image-{}", std::process::id()));
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    eprintln!("building a {size} MiB image (4 layers) and pushing it to {}", reg.addr);
    let d2 = dir.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let bb =
            std::fs::read("/bin/busybox").context("/bin/busybox (scripts/bench-setup.sh installs busybox-static)")?;
        let mut layers = vec![layer_tar(&[
            Entry::Dir("bin"),
            Entry::File("bin/busybox", &bb, 0o755),
            Entry::Symlink("bin/sh", "busybox"),
            Entry::Dir("etc"),
        ])];
        for i in 0..4u64 {
            let data = noise((size / 4) << 20, seed ^ i);
            let name = format!("data/part{i}");
            layers.push(layer_tar(&[Entry::Dir("data"), Entry::File(&name, &data, 0o644)]));
        }
        write_layout(&d2, &layers, &Config { env: &["PATH=/bin"], ..Default::default() }, "1")?;
        Ok(())
    })
    .await??;
    let image = format!("{}/ember-bench/big:{seed}", reg.addr);
    let (d3, img) = (dir.clone(), image.clone());
    tokio::task::spawn_blocking(move || push(&d3, "1", &img)).await?.map_err(anyhow::Error::msg)?;
    let _ = std::fs::remove_dir_all(&dir);

    let t0 = Instant::now();
    let info =
        crate::commands::image::pull_with_progress(client, &PullRequest { image: image.clone(), auth: None }, !a.json)
            .await
            .context("cold pull (does the daemon have --insecure-registry for this port?)")?;
    let pull_s = t0.elapsed().as_secs_f64();
    let mb = info.size as f64 / 1e6;

    let tname = format!("bench-image-{}", seed % 1_000_000);
    let treq = TemplateRequest { name: tname.clone(), image: Some(image.clone()), ..Default::default() };
    client.create_template(&treq).await.context("template from the cached image")?;
    let (host, img, diff, phases) = creates(client, &tname, a.runs).await;
    let _ = client.delete_template(&tname).await;
    let _ = client.remove_image(&image).await;
    let _ = client.prune_images().await;

    let (h, i, d) = (host.summary(), img.summary(), diff.summary());
    let phases: BTreeMap<String, Summary> = phases.iter().map(|(k, v)| (k.clone(), v.summary())).collect();
    if a.json {
        let v = serde_json::json!({
            "image": image, "compressedMB": mb, "layers": info.layers.len(),
            "coldPullUnpackSeconds": pull_s, "coldPullMBps": mb / pull_s,
            "createServer": {"host": h, "image": i, "imageMinusHost": d, "imageMinusHostByPhase": phases},
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!("\nimage {image}: {} layers, {mb:.1} MB compressed", info.layers.len());
        println!("cold pull + verify + unpack: {pull_s:.2} s, {:.1} MB/s", mb / pull_s);
        println!("\ncreate-to-ready, server side (X-Ember-Launch-Micros), {} runs each:", a.runs);
        println!("{:<22} {:>9} {:>9} {:>9}", "template", "p50 ms", "p90 ms", "p99 ms");
        for (n, s) in [("host", &h), ("image (cached)", &i)] {
            let f = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.2}"));
            println!("{n:<22} {:>9} {:>9} {:>9}", f(s.p50_ms), f(s.p90_ms), f(s.p99_ms));
        }
        if let (Some(a), Some(b)) = (h.p50_ms, i.p50_ms) {
            println!("image p50 - host p50: {:+.2} ms", b - a);
        }
        if let Some(m) = d.p50_ms {
            println!(
                "median of (image - host) over {} alternating pairs: {m:+.2} ms (target: within 0.3 ms)",
                d.samples
            );
        }
        // Where a difference is: the daemon's launch phases, each pair's.
        let line = |(k, s): (&String, &Summary)| s.p50_ms.map(|m| format!("{k} {m:+.3}"));
        let by_phase: Vec<String> = phases.iter().filter_map(line).collect();
        println!("  of which, median per phase (image - host, ms): {}", by_phase.join(", "));
    }
    Ok(i32::from(h.failed + i.failed > 0))
}

/// The per-pair difference (image - host) of each launch phase the daemon
/// reports (`launch.phases`: start, cgroup, spawn, agentReady), ms.
type Phases = BTreeMap<String, Series>;

/// `runs` pairs (after one discarded pair): a `host` create, then one from
/// `template`, each removed at once. Returns both series, the per-pair
/// difference (image - host), server side, and that difference per phase.
async fn creates(client: &Client, template: &str, runs: usize) -> (Series, Series, Series, Phases) {
    let (mut host, mut img, mut diff) = (Series::default(), Series::default(), Series::default());
    let mut phases = Phases::new();
    let p = Progress::new(format!("create host / {template}, alternating"), runs);
    for n in 0..=runs {
        let h = create_one(client, "host", n > 0, &mut host).await;
        let i = create_one(client, template, n > 0, &mut img).await;
        if let (Some((h, hp)), Some((i, ip)), true) = (h, i, n > 0) {
            diff.push_ms(i - h);
            for (k, iu) in &ip {
                if let Some(hu) = hp.get(k) {
                    phases.entry(k.clone()).or_default().push_ms((*iu as f64 - *hu as f64) / 1000.0);
                }
            }
        }
        p.tick(n);
    }
    p.finish(&img);
    (host, img, diff, phases)
}

/// One create-to-ready (server side, ms, and its launch phases in µs) and its
/// removal; recorded in `s` when `keep`.
async fn create_one(
    client: &Client,
    template: &str,
    keep: bool,
    s: &mut Series,
) -> Option<(f64, BTreeMap<String, u64>)> {
    let req = CreateSandboxRequest { template: Some(template.into()), ..Default::default() };
    match client.create_sandbox(&req).await {
        Ok((info, us)) => {
            let _ = client.delete_sandbox(&info.id).await;
            let ms = us as f64 / 1000.0;
            if keep {
                s.push_ms(ms);
            }
            Some((ms, info.launch.map(|l| l.phases).unwrap_or_default()))
        }
        Err(e) => {
            s.fail(e);
            None
        }
    }
}
