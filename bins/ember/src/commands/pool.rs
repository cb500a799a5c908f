//! `ember pool ...`.
use crate::cli::PoolCmd;
use ember_client::Client;
use ember_types::api::{CreatePoolRequest, PoolInfo, ResizePoolRequest, ResourcesSpec};

fn target(s: &str) -> serde_json::Value {
    s.parse::<u32>().map(serde_json::Value::from).unwrap_or_else(|_| s.into())
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

fn print_inspect(p: &PoolInfo) {
    let z = &p.sizing;
    let t = p.target.as_str().map_or_else(|| p.target.to_string(), str::to_string);
    println!("pool {} (template {}, {}), min {} max {} target {t}", p.name, p.template, p.runtime_class, p.min, p.max);
    if let Some(sid) = &p.from_snapshot {
        println!("  golden          members start from sandbox snapshot {sid}");
    }
    if let Some(src) = &p.from_checkpoint {
        println!("  golden          members are restored from a gVisor checkpoint of sandbox {src}");
    }
    if let Some(a) = &p.auto_pause {
        println!("  auto-pause      claimed sandboxes freeze after {} s idle", a.after_seconds);
    }
    println!("  idle            {} (starting {}), holding {} of memory", p.idle, p.starting, mib(p.idle_memory_bytes));
    println!("  arrival rate λ  {:.3} claims/s over the last {} s", z.arrival_per_sec, z.window_secs);
    println!("  refill time W   {:.1} ms (moving average of cold starts)", z.refill_secs * 1000.0);
    println!("  λ·W             {:.3} claims arrive while one refill runs (Little's law)", z.in_flight_demand);
    println!("  headroom        {:.3} over λ·W: the Poisson count's 99.9 % quantile, for bursts", z.headroom);
    println!("  idle target     {} = clamp(λ·W + headroom, {}, {})", z.target, p.min, p.max);
    println!(
        "  claims          {} total; misses {} total, {} in the window",
        p.claims_total, p.misses_total, p.misses_in_window
    );
    println!("  create failures {}", p.create_failures);
}

pub async fn run(client: &Client, cmd: PoolCmd) -> anyhow::Result<i32> {
    match cmd {
        PoolCmd::Create {
            template,
            name,
            from_snapshot,
            from_checkpoint,
            auto_pause,
            min,
            max,
            target: t,
            memory,
            cpus,
            pids,
            disk,
            network,
            allow,
            json,
        } => {
            let req = CreatePoolRequest {
                name,
                template: template.unwrap_or_default(),
                from_snapshot,
                from_checkpoint,
                auto_pause: super::auto_pause(auto_pause.as_deref())?,
                min,
                max,
                target: Some(target(&t)),
                resources: Some(ResourcesSpec { memory, cpu: cpus, pids, disk }),
                runtime_class: None,
                network,
                allow,
            };
            let p = client.create_pool(&req).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&p)?);
            } else {
                println!("{}", p.name);
            }
        }
        PoolCmd::Ls { json } => {
            let pools = client.list_pools().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&pools)?);
            } else {
                println!(
                    "{:<20} {:<12} {:>5} {:>5} {:>7} {:>6} {:>8} {:>8}",
                    "NAME", "TEMPLATE", "MIN", "MAX", "TARGET", "IDLE", "CLAIMS", "MISSES"
                );
                for p in pools {
                    println!(
                        "{:<20} {:<12} {:>5} {:>5} {:>7} {:>6} {:>8} {:>8}",
                        p.name, p.template, p.min, p.max, p.sizing.target, p.idle, p.claims_total, p.misses_total
                    );
                }
            }
        }
        PoolCmd::Inspect { name, json } => {
            let p = client.get_pool(&name).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&p)?);
            } else {
                print_inspect(&p);
            }
        }
        PoolCmd::Resize { name, min, max, target: t } => {
            let p =
                client.resize_pool(&name, &ResizePoolRequest { min, max, target: t.as_deref().map(target) }).await?;
            print_inspect(&p);
        }
        PoolCmd::Rm { names } => {
            return super::for_each_name(names, |n| async move { client.delete_pool(&n).await }).await;
        }
    }
    Ok(0)
}
