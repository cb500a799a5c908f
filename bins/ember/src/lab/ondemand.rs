//! Lab 2, on demand (its node leg): a cold create per request, time to first
//! instruction broken into its phases. Cold node: every request names an
//! image the node has never seen (new layers each time, served by a real
//! local registry, `docker-registry` + `skopeo` as `ember bench image` uses),
//! so it pays pull + verify + unpack, then launch (cgroup, spawn, agent
//! ready), then its first instruction. Cached image: the same requests
//! against an image already on the node. Given a Kubernetes API, the same
//! cold create is then routed through it (`ondemand_k8s.rs`).
use super::report::{ms, LabReport, Table};
use super::{svg, Scale};
use crate::bench::ember::PHASES;
use crate::bench::registry::{layer_tar, push, write_layout, Config, Entry, Registry};
use crate::bench::stats::Series;
use anyhow::Context;
use ember_client::Client;
use ember_types::api::CreateSandboxRequest;
use ember_types::execd::RunCommandRequest;
use ember_types::image::{PullRequest, TemplateRequest};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// One request's phases, ms.
#[derive(Default)]
struct Phases {
    pull: Series,
    launch: BTreeMap<&'static str, Series>,
    first: Series,
    total: Series,
}

pub async fn run(
    client: &Client,
    scale: Scale,
    dir: &Path,
    port: u16,
    k8s: &super::ondemand_k8s::K8sLegArgs,
) -> anyhow::Result<LabReport> {
    let (runs, mib) = match scale {
        Scale::Small => (2, 16),
        Scale::Full => (5, 128),
    };
    let reg = tokio::task::spawn_blocking(move || Registry::start(port)).await?.map_err(anyhow::Error::msg)?;
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
    let mut images = Vec::new();
    for i in 0..runs {
        eprintln!("  building and pushing image {} of {runs} ({mib} MiB)", i + 1);
        images.push(build_image(&reg.addr, mib, seed ^ (i as u64 + 1)).await?);
    }
    let (mut cold, mut cached, mut absent_before) = (Phases::default(), Phases::default(), 0);
    let mut templates = Vec::new();
    let r = async {
        for (i, image) in images.iter().enumerate() {
            absent_before += usize::from(client.get_image(image).await.is_err());
            let t0 = Instant::now();
            let pull = PullRequest { image: image.clone(), auth: None };
            crate::commands::image::pull_with_progress(client, &pull, false).await.with_context(|| {
                format!("pulling {image} (is 127.0.0.1:{port} in the daemon's --insecure-registry?)")
            })?;
            cold.pull.push(t0.elapsed());
            let name = format!("lab2-{}-{i}", seed % 1_000_000);
            let treq = TemplateRequest { name: name.clone(), image: Some(image.clone()), ..Default::default() };
            client.create_template(&treq).await.with_context(|| format!("template {name}"))?;
            templates.push(name.clone());
            request(client, &name, t0, &mut cold).await?;
        }
        for _ in 0..runs {
            let name = templates.first().context("a template")?;
            request(client, name, Instant::now(), &mut cached).await?;
        }
        Ok::<_, anyhow::Error>(())
    };
    let r = crate::bench::pool::interruptible(r).await;
    for t in &templates {
        let _ = client.delete_template(t).await;
    }
    for image in &images {
        let _ = client.remove_image(image).await;
    }
    let _ = client.prune_images().await;
    drop(reg);
    r?;
    let mut report = build(&cold, &cached, absent_before, runs, mib, scale, dir)?;
    let template = crate::bench::pool::TEMPLATE;
    let leg = crate::bench::pool::interruptible(super::ondemand_k8s::run(client, k8s, scale, template)).await?;
    let data = super::ondemand_k8s::add(&mut report, leg.as_ref(), dir)?;
    report.data["kubernetesLeg"] = data;
    Ok(report)
}

/// A busybox layer and one incompressible data layer, pushed as a new image.
async fn build_image(addr: &str, mib: usize, seed: u64) -> anyhow::Result<String> {
    let dir = std::env::temp_dir().join(format!("ember-lab2-{}-{seed}", std::process::id()));
    let image = format!("{addr}/ember-lab2/img:{}", seed % 1_000_000_000);
    let (d, img) = (dir.clone(), image.clone());
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let bb =
            std::fs::read("/bin/busybox").context("/bin/busybox (scripts/bench-setup.sh installs busybox-static)")?;
        let data = crate::bench::image::noise(mib << 20, seed);
        let layers = vec![
            layer_tar(&[
                Entry::Dir("bin"),
                Entry::File("bin/busybox", &bb, 0o755),
                Entry::Symlink("bin/sh", "busybox"),
            ]),
            layer_tar(&[Entry::Dir("data"), Entry::File("data/blob", &data, 0o644)]),
        ];
        write_layout(&d, &layers, &Config { env: &["PATH=/bin"], ..Default::default() }, "1")?;
        push(&d, "1", &img).map_err(anyhow::Error::msg)?;
        let _ = std::fs::remove_dir_all(&d);
        Ok(())
    })
    .await??;
    Ok(image)
}

/// Create from `template`, then `echo x` to its first stdout event; the
/// total counts from `t0` (the request's start, its pull included).
async fn request(client: &Client, template: &str, t0: Instant, p: &mut Phases) -> anyhow::Result<()> {
    let req = CreateSandboxRequest { template: Some(template.into()), ..Default::default() };
    let (info, _) = client.create_sandbox(&req).await.with_context(|| format!("creating from {template}"))?;
    let t1 = Instant::now();
    // The image has busybox and the `sh` link only.
    let echo =
        RunCommandRequest { argv: Some(vec!["/bin/busybox".into(), "echo".into(), "x".into()]), ..Default::default() };
    let mut first = None;
    let r = client
        .exec(&info.id, &echo, |ev| {
            if ev.kind == "stdout" && first.is_none() {
                first = Some(Instant::now());
            }
        })
        .await;
    let _ = client.delete_sandbox(&info.id).await;
    r.with_context(|| format!("echo x in sandbox {}", info.id))?;
    let t2 = first.context("no stdout from echo x")?;
    let phases = info.launch.map(|l| l.phases).unwrap_or_default();
    for name in PHASES {
        if let Some(us) = phases.get(name) {
            p.launch.entry(name).or_default().push_ms(*us as f64 / 1000.0);
        }
    }
    p.first.push(t2 - t1);
    p.total.push(t2 - t0);
    Ok(())
}

fn build(
    cold: &Phases,
    cached: &Phases,
    absent_before: usize,
    runs: usize,
    mib: usize,
    scale: Scale,
    dir: &Path,
) -> anyhow::Result<LabReport> {
    let mut r = LabReport::new(super::lab(2), scale);
    let mut t = Table::new(
        &format!("Time to first instruction by phase, p50 ms ({runs} requests each, {mib} MiB images)"),
        &["phase", "cold node", "cached image"],
    );
    let p50 = |s: &Series| s.summary().p50_ms;
    t.row(vec!["pull + verify + unpack".into(), ms(p50(&cold.pull)), "0".into()]);
    for name in PHASES {
        let get = |p: &Phases| ms(p.launch.get(name).and_then(|s| s.summary().p50_ms));
        t.row(vec![format!("launch: {name}"), get(cold), get(cached)]);
    }
    t.row(vec!["create returned → first stdout".into(), ms(p50(&cold.first)), ms(p50(&cached.first))]);
    t.row(vec!["total".into(), ms(p50(&cold.total)), ms(p50(&cached.total))]);
    t.row(vec!["a pod on demand (published, not measured here)".into(), "45,000–90,000".into(), "-".into()]);
    r.tables.push(t);
    r.check(
        "every cold request pulled an image new to the node",
        absent_before == runs,
        format!("{absent_before} of {runs} absent before"),
    );
    let measured = cold.total.summary().samples == runs && cached.total.summary().samples == runs;
    r.check("every request reached its first instruction", measured, format!("{runs} cold, {runs} cached"));
    let bars = vec![
        ("cold node".to_string(), p50(&cold.total).unwrap_or(0.0)),
        ("cached image".to_string(), p50(&cached.total).unwrap_or(0.0)),
    ];
    r.chart(dir, "ttfi.svg", svg::bars("Time to first instruction, p50", "ms", &bars))?;
    r.data = serde_json::json!({
        "runs": runs, "imageMib": mib, "absentBefore": absent_before,
        "cold": { "pull": cold.pull.summary(), "first": cold.first.summary(), "total": cold.total.summary() },
        "cached": { "first": cached.first.summary(), "total": cached.total.summary() },
    });
    Ok(r)
}
