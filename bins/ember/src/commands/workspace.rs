//! `ember workspace ...`.
use crate::cli::WorkspaceCmd;
use ember_client::Client;
use ember_types::api::WorkspaceInfo;

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

fn lease(w: &WorkspaceInfo) -> String {
    w.lease.as_ref().map_or("-".into(), |l| format!("{} (epoch {})", l.holder, l.epoch))
}

pub async fn run(client: &Client, cmd: WorkspaceCmd) -> anyhow::Result<i32> {
    match cmd {
        WorkspaceCmd::Create { name, size, json } => {
            let w = client.create_workspace(&name, &size).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&w)?);
            } else {
                println!("{}", w.name);
            }
        }
        WorkspaceCmd::Ls { json } => {
            let all = client.list_workspaces().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                println!("{:<24} {:>12} {:>12} {}", "NAME", "SIZE", "USED", "WRITER");
                for w in all {
                    println!("{:<24} {:>12} {:>12} {}", w.name, mib(w.size_bytes), mib(w.used_bytes), lease(&w));
                }
            }
        }
        WorkspaceCmd::Inspect { name, json } => {
            let w = client.get_workspace(&name).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&w)?);
            } else {
                println!(
                    "workspace {}: {} of {} used, created {}",
                    w.name,
                    mib(w.used_bytes),
                    mib(w.size_bytes),
                    w.created_at
                );
                println!("  writer lease: {}; last epoch granted {}", lease(&w), w.epoch);
            }
        }
        WorkspaceCmd::Rm { names } => {
            let mut failed = 0;
            for n in names {
                match client.delete_workspace(&n).await {
                    Ok(()) => println!("{n}"),
                    Err(e) => {
                        eprintln!("ember: {n}: {e}");
                        failed += 1;
                    }
                }
            }
            return Ok(i32::from(failed > 0));
        }
    }
    Ok(0)
}
