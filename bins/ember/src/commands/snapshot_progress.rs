//! Progress of a snapshot, restore or fork while its request runs: the CLI
//! names the operation (`operationId`) and polls
//! `GET /v1/workspace-snapshots/operations/{id}`, drawing an indicatif bar on
//! a terminal and a plain line per phase (and every few seconds) otherwise,
//! the same shape as image pulls.
use std::future::Future;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use ember_client::Client;
use ember_types::api::SnapshotOperation;
use indicatif::{ProgressBar, ProgressStyle};

/// An operation id unique enough for one CLI invocation.
pub fn new_op_id(kind: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("cli-{kind}-{}-{nanos}", std::process::id())
}

fn summary(o: &SnapshotOperation) -> String {
    let mut s = format!("{} {}: {}", o.kind, o.target, o.phase);
    if o.chunks_done > 0 {
        s += &format!(", {} chunks", o.chunks_done);
        if o.kind == "snapshot" {
            s += &format!(" ({} new)", o.chunks_new);
        }
    }
    if o.items_total > 1 {
        s += &format!(", {}/{} workspaces", o.items_done, o.items_total);
    }
    s
}

/// Awaits `fut` while showing the progress of operation `op` on stderr
/// (nothing when `show` is false). Polling errors are ignored: the request's
/// own result is what counts.
pub async fn with_progress<T>(client: &Client, op: &str, show: bool, fut: impl Future<Output = T>) -> T {
    tokio::pin!(fut);
    let tty = std::io::stderr().is_terminal();
    let bar = (show && tty).then(|| {
        let b = ProgressBar::new(0);
        let style = ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        b.set_style(style.progress_chars("=> "));
        b
    });
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let (mut last_phase, mut last_line) = (String::new(), Instant::now());
    let out = loop {
        tokio::select! {
            r = &mut fut => break r,
            _ = tick.tick() => {
                if !show {
                    continue;
                }
                let Ok(o) = client.snapshot_operation(op).await else { continue };
                if let Some(b) = &bar {
                    b.set_length(o.bytes_total);
                    b.set_position(o.bytes_done);
                    b.set_message(summary(&o));
                } else if o.phase != last_phase || last_line.elapsed() > Duration::from_secs(5) {
                    eprintln!("{} {:.1}/{:.1} MB", summary(&o), o.bytes_done as f64 / 1e6, o.bytes_total as f64 / 1e6);
                    (last_phase, last_line) = (o.phase.clone(), Instant::now());
                }
            }
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    out
}
