//! JetStream requests to the local cluster's nats-servers: readiness of the
//! meta group, and the server leading the task stream (the drill's
//! `--kill-queue-leader` target), from `$JS.API.STREAM.INFO`.
use super::state::State;
use anyhow::{bail, Context};
use std::time::{Duration, Instant};

/// The standard tier's work-queue stream of `ember serve --cluster`'s queue
/// (`<NAME>_TASKS_<TIER>`, ember-cluster's `queue/mod.rs`; name `ember`):
/// where the drill's tasks go.
pub const TASK_STREAM: &str = "EMBER_TASKS_STANDARD";

/// One core request with an empty body to any of `urls`; its JSON reply.
pub async fn request(urls: &[String], subject: &str) -> anyhow::Result<serde_json::Value> {
    let client = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(2))
        .max_reconnects(Some(1))
        .connect(urls)
        .await
        .with_context(|| format!("connecting to {}", urls.join(",")))?;
    let reply = tokio::time::timeout(Duration::from_secs(3), client.request(subject.to_string(), "".into()))
        .await
        .with_context(|| format!("{subject}: no answer within 3 s"))?
        .with_context(|| subject.to_string())?;
    serde_json::from_slice(&reply.payload).with_context(|| format!("{subject}: reply not JSON"))
}

/// Waits until JetStream answers through every nats-server of the cluster.
pub async fn wait_ready(st: &State) -> anyhow::Result<()> {
    for url in st.nats_urls() {
        let start = Instant::now();
        loop {
            let r = request(std::slice::from_ref(&url), "$JS.API.INFO").await;
            if r.as_ref().is_ok_and(|v| v["error"].is_null()) {
                break;
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("JetStream never answered on {url}: {r:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// The server name (a host's name) leading `stream`'s Raft group, asked of
/// the servers in `urls`.
pub async fn stream_leader(urls: &[String], stream: &str) -> anyhow::Result<String> {
    let v = request(urls, &format!("$JS.API.STREAM.INFO.{stream}")).await?;
    match v["cluster"]["leader"].as_str() {
        Some(l) => Ok(l.to_string()),
        None => bail!("stream {stream} has no leader now: {v}"),
    }
}

pub async fn task_stream_leader(st: &State) -> anyhow::Result<String> {
    stream_leader(&st.nats_urls(), TASK_STREAM).await
}
