//! The ember side, measured as any client sees it: only through [`Client`].
use super::stats::{Progress, Series};
use anyhow::Context;
use ember_client::Client;
use ember_types::api::CreateSandboxRequest;
use ember_types::execd::RunCommandRequest;
use std::collections::BTreeMap;
use std::time::Instant;

pub const TEMPLATE: &str = "host";
/// The server's launch phases, as `launch.phases` names them.
pub const PHASES: [&str; 3] = ["cgroup", "spawn", "agentReady"];

#[derive(Default)]
pub struct EmberFigures {
    /// `X-Ember-Launch-Micros`: request to ready agent, server side.
    pub create_server: Series,
    /// The create call as this client saw it.
    pub create_wall: Series,
    pub delete: Series,
    /// `launch.phases`, each as its own series.
    pub phases: BTreeMap<String, Series>,
    pub exec_argv: Series,
    pub exec_bash: Series,
    /// Creates that were claims from a warm pool: left out of the cold figure.
    pub warm: usize,
    /// Sandboxes this run could not remove.
    pub leftovers: Vec<String>,
}

fn create_req() -> CreateSandboxRequest {
    CreateSandboxRequest { template: Some(TEMPLATE.into()), ..Default::default() }
}

/// Fails only when not even one sandbox can be created and removed: then the
/// daemon is unreachable or broken, and there is nothing to measure.
pub async fn measure(client: &Client, runs: usize) -> anyhow::Result<EmberFigures> {
    let mut f = EmberFigures::default();
    // One discarded round first: connection set-up, page cache, first-use costs.
    let (info, _) = client.create_sandbox(&create_req()).await.context("creating the warm-up sandbox")?;
    client.delete_sandbox(&info.id).await.with_context(|| format!("removing warm-up sandbox {}", info.id))?;

    create_loop(client, runs, &mut f).await;
    exec_loops(client, runs, &mut f).await;
    Ok(f)
}

async fn create_loop(client: &Client, runs: usize, f: &mut EmberFigures) {
    let p = Progress::new("ember create+rm", runs);
    for i in 0..runs {
        let t0 = Instant::now();
        let res = client.create_sandbox(&create_req()).await;
        let wall = t0.elapsed();
        match res {
            Ok((info, header_us)) => {
                let launch = info.launch.clone().unwrap_or_default();
                if launch.kind == "warm" {
                    f.warm += 1;
                } else {
                    let us = if header_us > 0 { header_us } else { launch.micros };
                    if us > 0 {
                        f.create_server.push_ms(us as f64 / 1000.0);
                    } else {
                        f.create_server.fail("the reply had no X-Ember-Launch-Micros and no launch.micros");
                    }
                    f.create_wall.push(wall);
                    for name in PHASES {
                        if let Some(us) = launch.phases.get(name) {
                            f.phases.entry(name.to_string()).or_default().push_ms(*us as f64 / 1000.0);
                        }
                    }
                }
                let t1 = Instant::now();
                match client.delete_sandbox(&info.id).await {
                    Ok(()) => f.delete.push(t1.elapsed()),
                    Err(e) => {
                        f.delete.fail(format!("{}: {e}", info.id));
                        f.leftovers.push(info.id);
                    }
                }
            }
            Err(e) => {
                f.create_server.fail(&e);
                f.create_wall.fail(&e);
            }
        }
        p.tick(i + 1);
        if f.create_wall.gave_up() {
            break;
        }
    }
    p.finish(&f.create_wall);
}

async fn exec_loops(client: &Client, runs: usize, f: &mut EmberFigures) {
    let id = match client.create_sandbox(&create_req()).await {
        Ok((info, _)) => info.id,
        Err(e) => {
            let msg = format!("creating the exec sandbox: {e}");
            f.exec_argv.fail(&msg);
            f.exec_bash.fail(&msg);
            return;
        }
    };
    let argv = RunCommandRequest { argv: Some(vec!["true".into()]), ..Default::default() };
    let bash = RunCommandRequest { command: Some("true".into()), ..Default::default() };
    for (label, req, series) in
        [("ember exec argv true", &argv, &mut f.exec_argv), ("ember exec bash -c true", &bash, &mut f.exec_bash)]
    {
        // Discarded first call, as for create.
        let _ = exec_once(client, &id, req).await;
        let p = Progress::new(label, runs);
        for i in 0..runs {
            let t0 = Instant::now();
            match exec_once(client, &id, req).await {
                Ok(()) => series.push(t0.elapsed()),
                Err(e) => series.fail(format!("{e:#}")),
            }
            p.tick(i + 1);
            if series.gave_up() {
                break;
            }
        }
        p.finish(series);
    }
    if let Err(e) = client.delete_sandbox(&id).await {
        eprintln!("ember: removing exec sandbox {id}: {e}");
        f.leftovers.push(id);
    }
}

/// One command to completion; anything but exit code 0 is a failure.
async fn exec_once(client: &Client, id: &str, req: &RunCommandRequest) -> anyhow::Result<()> {
    let out = client.exec(id, req, |_| {}).await?;
    if let Some(e) = out.error {
        anyhow::bail!("command did not start: {e}");
    }
    match out.exit_code {
        Some(0) => Ok(()),
        Some(c) => anyhow::bail!("exit code {c}"),
        None => anyhow::bail!("the stream ended without an exit code"),
    }
}
