//! `ember bench create`: ember's cold create-to-ready and exec round trip,
//! measured through the public API like any client, beside crun measured in
//! the same run on the same machine. `ember bench claim` and `ember bench
//! density`: warm-pool claims and how many idle sandboxes fit. `ember bench
//! cluster`: warm claims through every node of a cluster beside one node.
//!
//! Exit code: 0 when every ember run succeeded, 1 when some failed (the
//! figures are printed either way). A missed target is a result, not an error.
mod autopause;
mod checkpoint;
mod claim;
mod claim_report;
mod class_extra;
mod class_warm;
mod classes;
pub mod cluster;
mod crun;
mod density;
pub(crate) mod ember;
mod golden;
pub(crate) mod image;
pub mod k8s;
mod k8s_agents;
mod mounts;
mod network;
mod oci;
pub(crate) mod pool;
mod procfs;
pub mod registry;
mod report;
pub(crate) mod stats;
mod task_floor;
pub mod tasks;

use crate::cli::BenchCmd;
use anyhow::Context;
use ember_client::Client;
use stats::Progress;

pub async fn run(client: &Client, cmd: BenchCmd) -> anyhow::Result<i32> {
    match cmd {
        BenchCmd::Snapshot { size, size_mb, forks, work_dir, store } => {
            let size_mb = size_mb.unwrap_or(size / 1_000_000);
            let s3 = match store.as_deref().map(|s| crate::serve::snapshot_store(Some(s), &work_dir)).transpose()? {
                Some(ember_engine::SnapshotStoreConfig::S3(c)) => Some(c),
                Some(_) => {
                    anyhow::bail!("--store: expected s3://bucket[/prefix]; the local store lives in --work-dir")
                }
                None => None,
            };
            let cfg = ember_snapshot::bench::BenchConfig { dir_size_mb: size_mb, work_dir, forks, keep: false, s3 };
            let report = tokio::task::spawn_blocking(move || ember_snapshot::bench::bench(&cfg)).await??;
            println!("{report}");
            Ok(0)
        }
        BenchCmd::Mounts { runs, tables, work_dir } => {
            let a = mounts::Args { runs, tables, work_dir };
            tokio::task::spawn_blocking(move || mounts::run(&a)).await?
        }
        BenchCmd::Create { runs, no_crun, json } => create(client, runs, no_crun, json).await,
        BenchCmd::Image { runs, size, size_mib, registry_port, json } => {
            let size_mib = size_mib.unwrap_or(size >> 20);
            image::run(client, image::Args { runs, size_mib, port: registry_port, json }).await
        }
        BenchCmd::Claim { runs, from_snapshot: Some(snapshot), primed, json, .. } => {
            let primed_mib = u32::try_from(primed.div_ceil(1 << 20)).unwrap_or(u32::MAX);
            let snapshot = (snapshot != "new").then_some(snapshot);
            golden::run(client, golden::GoldenArgs { runs, snapshot, primed_mib, json }).await
        }
        BenchCmd::Claim { runs, concurrency, bursts, sustain, tasks, json, .. } => {
            let args = claim::ClaimArgs { runs, concurrency, bursts, sustain, tasks };
            claim_bench(client, args, json).await
        }
        BenchCmd::Classes { runs, idle, json } => classes::run(client, runs, idle, json).await,
        BenchCmd::Tasks(a) => tasks::run(client, a).await,
        BenchCmd::Cluster(a) => {
            let key = <crate::cli::Cli as clap::Parser>::try_parse().ok().and_then(|c| c.api_key);
            cluster::run(key, a).await
        }
        BenchCmd::K8s(a) => k8s::run(client, a).await,
        BenchCmd::Network { runs, json } => network::run(client, runs, json).await,
        BenchCmd::Autopause { runs, json } => autopause::run(client, runs, json).await,
        BenchCmd::Density { count, timeout, json } => density::run(client, count, timeout, json).await,
    }
}

async fn claim_bench(client: &Client, args: claim::ClaimArgs, json: bool) -> anyhow::Result<i32> {
    if args.runs == 0 || args.concurrency == 0 {
        anyhow::bail!("--runs and --concurrency must be at least 1");
    }
    let url = pool::url();
    eprintln!("ember bench claim: {} runs per figure", args.runs);
    let load = procfs::loadavg();
    let f = claim::measure(client, &args).await?;
    let r = claim_report::ClaimReport { url: &url, args: &args, f: &f, load: (load, procfs::loadavg()) };
    if json {
        println!("{}", serde_json::to_string_pretty(&r.to_json())?);
    } else {
        println!();
        r.print_table();
    }
    Ok(r.exit_code())
}

async fn create(client: &Client, runs: usize, no_crun: bool, json: bool) -> anyhow::Result<i32> {
    if runs == 0 {
        anyhow::bail!("--runs must be at least 1");
    }
    // The client keeps its address to itself; the command line has it too.
    let url = <crate::cli::Cli as clap::Parser>::try_parse().map(|c| c.url).unwrap_or_default();
    eprintln!("ember bench create: {runs} runs per figure, ember and crun alternating");
    let mut em = ember::EmberBench::start(client).await.context("ember is not measurable")?;
    let mut cr = if no_crun {
        None
    } else {
        Some(tokio::task::block_in_place(crun::CrunBench::start).map_err(|why| {
            eprintln!("crun reference unavailable: {why}");
            why
        }))
    };
    // Each ember step is followed by the same crun step, so that whatever
    // the machine does meanwhile lands on both figures alike.
    let p = Progress::new("create+rm", runs);
    for i in 0..runs {
        em.create_once().await;
        if let Some(Ok(c)) = cr.as_mut() {
            tokio::task::block_in_place(|| c.create_once());
        }
        p.tick(i + 1);
        if em.f.create_wall.gave_up() {
            break;
        }
    }
    p.finish(&em.f.create_wall);
    em.exec_start().await;
    if let Some(Ok(c)) = cr.as_mut() {
        tokio::task::block_in_place(|| c.exec_start());
    }
    for (bash, label) in [(false, "exec argv true"), (true, "exec bash -c true")] {
        let p = Progress::new(label, runs);
        for i in 0..=runs {
            // i == 0: the discarded first call, as for create.
            em.exec_step(bash, i > 0).await;
            if let Some(Ok(c)) = cr.as_mut() {
                tokio::task::block_in_place(|| c.exec_step(bash, i > 0));
            }
            p.tick(i);
        }
        p.finish(if bash { &em.f.exec_bash } else { &em.f.exec_argv });
    }
    let ember = em.finish().await;
    let crun = cr.map(|c| match c {
        Ok(c) => tokio::task::block_in_place(|| c.finish()),
        Err(why) => crun::Crun::Unavailable(why),
    });
    let r = report::Report { url: &url, runs, ember: &ember, crun: crun.as_ref() };
    if json {
        println!("{}", serde_json::to_string_pretty(&r.to_json())?);
    } else {
        println!();
        r.print_table();
    }
    let failed =
        [&ember.create_wall, &ember.delete, &ember.exec_argv, &ember.exec_bash].iter().any(|s| s.summary().failed > 0);
    Ok(if failed { 1 } else { 0 })
}
