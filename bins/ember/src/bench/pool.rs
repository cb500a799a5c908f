//! What `bench claim` and `bench density` share: a pool of their own (created,
//! filled, removed), bulk removal of what they claimed, and Ctrl-C.
use anyhow::Context;
use ember_client::Client;
use ember_types::api::{CreatePoolRequest, PoolInfo, ResizePoolRequest};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// The template every bench measures; a pool of it is what a claim matches.
pub const TEMPLATE: &str = "host";
/// Removals in flight at once: enough to finish 1,000 in seconds, few enough
/// not to turn teardown into a benchmark of its own.
const REMOVE_PARALLEL: usize = 4;
/// A pool whose idle count has not grown for this long is not going to fill.
const STALL: Duration = Duration::from_secs(30);

/// A pool this run created; [`BenchPool::remove`] it on every way out.
pub struct BenchPool {
    pub name: String,
}

impl BenchPool {
    /// A fixed-target pool of [`TEMPLATE`] named after this process.
    pub async fn create(client: &Client, kind: &str, target: u32) -> anyhow::Result<BenchPool> {
        let name = format!("bench-{kind}-{}", std::process::id());
        let req = CreatePoolRequest {
            name: Some(name.clone()),
            template: TEMPLATE.into(),
            min: 0,
            max: target,
            target: Some(target.into()),
            ..Default::default()
        };
        client.create_pool(&req).await.with_context(|| format!("creating pool {name}"))?;
        Ok(BenchPool { name })
    }

    pub async fn resize(&self, client: &Client, target: u32) -> anyhow::Result<()> {
        let req = ResizePoolRequest { min: Some(0), max: Some(target), target: Some(target.into()) };
        client
            .resize_pool(&self.name, &req)
            .await
            .with_context(|| format!("resizing pool {} to {target}", self.name))?;
        Ok(())
    }

    /// Polls until at least `want` are idle and none is starting (a quiet
    /// daemon to measure against); fails when the pool stops growing.
    pub async fn wait_full(&self, client: &Client, want: u32) -> anyhow::Result<PoolInfo> {
        let (mut best, mut since) = (0, Instant::now());
        loop {
            let p = client.get_pool(&self.name).await.with_context(|| format!("reading pool {}", self.name))?;
            if p.idle >= want && p.starting == 0 {
                return Ok(p);
            }
            if p.idle > best {
                (best, since) = (p.idle, Instant::now());
            } else if since.elapsed() > STALL {
                anyhow::bail!(
                    "pool {} stopped filling at {}/{want} idle ({} creates failed)",
                    self.name,
                    p.idle,
                    p.create_failures
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Removes the pool and with it its idle sandboxes.
    pub async fn remove(self, client: &Client) -> anyhow::Result<()> {
        client.delete_pool(&self.name).await.with_context(|| format!("removing pool {}", self.name))
    }
}

/// Refuses to run beside a pool that already serves [`TEMPLATE`]: its claims
/// would mix with ours, and "cold" creates would be warm.
pub async fn check_no_pool(client: &Client) -> anyhow::Result<()> {
    let pools = client.list_pools().await.context("listing pools")?;
    if let Some(p) = pools.iter().find(|p| p.template == TEMPLATE) {
        anyhow::bail!(
            "pool {} already serves template {TEMPLATE}; remove it (`ember pool rm {}`) or use another daemon",
            p.name,
            p.name
        );
    }
    Ok(())
}

/// Every sandbox this run created and has not removed yet, kept outside the
/// measuring futures so an error or Ctrl-C cannot lose one.
#[derive(Clone, Default)]
pub struct Claimed(Arc<Mutex<Vec<String>>>);

impl Claimed {
    pub fn push(&self, id: String) {
        self.0.lock().push(id);
    }

    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock())
    }

    /// Removes them all; returns the ids that could not be removed.
    pub async fn remove(&self, client: &Client) -> Vec<String> {
        remove_all(client, self.take()).await
    }
}

/// Removes sandboxes a few at a time; returns the ids that could not be removed.
pub async fn remove_all(client: &Client, ids: Vec<String>) -> Vec<String> {
    let mut failed = Vec::new();
    let mut set = JoinSet::new();
    for id in ids {
        if set.len() >= REMOVE_PARALLEL {
            if let Some(Ok(Err(id))) = set.join_next().await {
                failed.push(id);
            }
        }
        let c = client.clone();
        set.spawn(async move { c.delete_sandbox(&id).await.map_err(|_| id) });
    }
    while let Some(r) = set.join_next().await {
        if let Ok(Err(id)) = r {
            failed.push(id);
        }
    }
    failed
}

/// Runs `f`, or stops it at Ctrl-C with an error (so the caller's clean-up runs).
pub async fn interruptible<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::select! {
        r = f => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    }
}

/// The daemon address as given on the command line (the client keeps it to itself).
pub fn url() -> String {
    <crate::cli::Cli as clap::Parser>::try_parse().map(|c| c.url).unwrap_or_default()
}
