//! `ember workspace ...`.
use super::snapshot_progress::{new_op_id, with_progress};
use crate::cli::{SnapshotCmd, WorkspaceCmd};
use ember_client::Client;
use ember_types::api::{ForkSnapshotRequest, RestoreSnapshotRequest, SnapshotWorkspaceRequest, WorkspaceInfo};

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
                println!("{:<24} {:>12} {:>12} WRITER", "NAME", "SIZE", "USED");
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
        WorkspaceCmd::Snapshot { name, holder, epoch, json } => {
            let op = new_op_id("snapshot");
            let req = SnapshotWorkspaceRequest { holder, epoch, operation_id: Some(op.clone()) };
            let s = with_progress(client, &op, !json, client.snapshot_workspace_with(&name, &req)).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("{}", s.id);
                eprintln!(
                    "{} in {} files; uploaded {} in {} new chunks, reused {} chunks (dedup {:.1}x)",
                    mib(s.logical_bytes),
                    s.files,
                    mib(s.stored_bytes_uploaded),
                    s.chunks_uploaded,
                    s.chunks_reused,
                    s.dedup_ratio
                );
            }
        }
        WorkspaceCmd::Restore { snapshot, name, size } => {
            let op = new_op_id("restore");
            let req = RestoreSnapshotRequest { name, size, operation_id: Some(op.clone()) };
            let w = with_progress(client, &op, true, client.restore_snapshot_with(&snapshot, &req)).await?;
            println!("{}", w.name);
        }
        WorkspaceCmd::Fork { snapshot, count, prefix } => {
            let op = new_op_id("fork");
            let req = ForkSnapshotRequest { count, prefix, operation_id: Some(op.clone()) };
            for w in with_progress(client, &op, true, client.fork_snapshot_with(&snapshot, &req)).await? {
                println!("{}", w.name);
            }
        }
        WorkspaceCmd::Rm { names } => {
            return super::for_each_name(names, |n| async move { client.delete_workspace(&n).await }).await;
        }
    }
    Ok(0)
}

pub async fn snapshots(client: &Client, cmd: SnapshotCmd) -> anyhow::Result<i32> {
    match cmd {
        SnapshotCmd::Ls { workspace, json } => {
            let all = client.list_snapshots(workspace.as_deref()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                println!("{:<40} {:<20} {:>12} {:>8} {:>8}", "ID", "WORKSPACE", "SIZE", "CHUNKS", "DEDUP");
                for s in all {
                    println!(
                        "{:<40} {:<20} {:>12} {:>8} {:>7.1}x",
                        s.id,
                        s.workspace,
                        mib(s.logical_bytes),
                        s.chunks,
                        s.dedup_ratio
                    );
                }
            }
        }
        SnapshotCmd::Inspect { id, json } => {
            let s = client.get_snapshot(&id).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("snapshot {} of workspace {} at {}", s.id, s.workspace, s.created_at);
                println!(
                    "  {} in {} files; {} chunks ({} distinct)",
                    mib(s.logical_bytes),
                    s.files,
                    s.chunks,
                    s.unique_chunks
                );
                let stored = if s.stored_bytes > 0 { mib(s.stored_bytes) } else { "not recorded".into() };
                println!("  stored size {stored} (compressed, distinct chunks)");
                println!(
                    "  new chunks {} ({} uploaded, {} stored, compression {:.1}x); reused chunks {}; dedup {:.1}x",
                    s.chunks_uploaded,
                    mib(s.bytes_uploaded),
                    mib(s.stored_bytes_uploaded),
                    s.compression_ratio,
                    s.chunks_reused,
                    s.dedup_ratio
                );
            }
        }
        SnapshotCmd::Rm { ids } => {
            return super::for_each_name(ids, |id| async move { client.delete_snapshot(&id).await }).await;
        }
        SnapshotCmd::Gc { min_age, json } => {
            let min_age = min_age.as_deref().map(super::parse_duration).transpose()?.map(|d| d.as_secs());
            let r = client.gc_snapshots(min_age).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "{} manifests, {} chunks ({} referenced): deleted {} chunks, {} bytes; {} kept as too young",
                    r.manifests,
                    r.chunks_seen,
                    r.chunks_referenced,
                    r.chunks_deleted,
                    r.bytes_deleted,
                    r.chunks_spared_young
                );
                if !r.missing_chunks.is_empty() {
                    eprintln!("warning: {} referenced chunks are missing from the store", r.missing_chunks.len());
                }
            }
        }
    }
    Ok(0)
}
