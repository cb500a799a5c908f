//! The warm-claim columns of `ember bench classes`: per class, a pool of the
//! `host` template in that class, claims timed on the server
//! (`X-Ember-Launch-Micros`: pop, bind through the agent, persist) and as the
//! client sees them (the whole HTTP round trip).
//!
//! Claims come in rounds of [`POOL_SIZE`]: wait until the pool is full and
//! quiet, claim that many one after another (the refill of the first overlaps
//! the later ones, as it would in production), remove them untimed. A claim
//! answered cold (the pool ran dry) is counted as a miss, not as a warm figure.
use super::pool::{remove_all, BenchPool, TEMPLATE};
use super::stats::{Progress, Series};
use ember_client::Client;
use ember_types::api::{CreatePoolRequest, CreateSandboxRequest};
use std::time::Instant;

/// Idle sandboxes the bench pool keeps: a few, so a round costs one refill
/// window rather than one per claim, and gVisor's idle memory stays small.
const POOL_SIZE: u32 = 4;

#[derive(Debug, Default)]
pub struct WarmFigures {
    /// Server-side claim time (`X-Ember-Launch-Micros`).
    pub server: Series,
    /// Client round trip of the create call.
    pub wall: Series,
    /// Creates the pool could not serve warm.
    pub misses: usize,
    /// Pool set-up or teardown errors, and sandboxes that could not be removed.
    pub errors: Vec<String>,
}

/// Creates a pool of `class`, measures `runs` claims, removes everything.
pub async fn measure(client: &Client, class: &str, runs: usize) -> WarmFigures {
    let mut f = WarmFigures::default();
    let name = format!("bench-warm-{class}-{}", std::process::id());
    let req = CreatePoolRequest {
        name: Some(name.clone()),
        template: TEMPLATE.into(),
        min: 0,
        max: POOL_SIZE,
        target: Some(POOL_SIZE.into()),
        runtime_class: Some(class.into()),
        ..Default::default()
    };
    if let Err(e) = client.create_pool(&req).await {
        f.errors.push(format!("creating pool {name}: {e}"));
        return f;
    }
    let pool = BenchPool { name };
    let p = Progress::new(format!("{class} warm claim"), runs);
    if let Err(e) = rounds(client, class, runs, &pool, &mut f, &p).await {
        f.errors.push(format!("{e:#}"));
    }
    p.finish(&f.server);
    if let Err(e) = pool.remove(client).await {
        f.errors.push(format!("{e:#}"));
    }
    f
}

async fn rounds(
    client: &Client,
    class: &str,
    runs: usize,
    pool: &BenchPool,
    f: &mut WarmFigures,
    p: &Progress,
) -> anyhow::Result<()> {
    let req = CreateSandboxRequest {
        template: Some(TEMPLATE.into()),
        runtime_class: Some(class.into()),
        ..Default::default()
    };
    let mut done = 0;
    while done < runs && !f.server.gave_up() {
        pool.wait_full(client, POOL_SIZE).await?;
        let mut claimed = Vec::new();
        for _ in 0..(runs - done).min(POOL_SIZE as usize) {
            let t = Instant::now();
            match client.create_sandbox(&req).await {
                Ok((info, header_us)) => {
                    let wall = t.elapsed();
                    let l = info.launch.clone().unwrap_or_default();
                    if l.kind == "warm" {
                        let us = if header_us > 0 { header_us } else { l.micros };
                        f.server.push_ms(us as f64 / 1000.0);
                        f.wall.push(wall);
                    } else {
                        f.misses += 1;
                    }
                    claimed.push(info.id);
                }
                Err(e) => {
                    f.server.fail(&e);
                    f.wall.fail(e);
                }
            }
            done += 1;
            p.tick(done);
        }
        f.errors.extend(remove_all(client, claimed).await.into_iter().map(|id| format!("could not remove {id}")));
    }
    Ok(())
}

/// The lines under the table: what "warm" measured, the client's view, misses
/// and errors per class.
pub fn print_notes<'a>(all: impl Iterator<Item = (&'a str, &'a WarmFigures)>) {
    println!("warm: a claim from a pool of {POOL_SIZE} of the class, server time (X-Ember-Launch-Micros)");
    for (class, w) in all {
        let (s, c) = (w.server.summary(), w.wall.summary());
        let ms = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.2}"));
        println!(
            "{class}: warm claim client round trip p50 {} ms, p99 {} ms; {} claims, {} misses",
            ms(c.p50_ms),
            ms(c.p99_ms),
            s.samples,
            w.misses
        );
        if let Some(e) = s.first_error.as_ref() {
            println!("{class}: warm claim first error: {e}");
        }
        for e in &w.errors {
            println!("{class}: warm claim: {e}");
        }
    }
}
