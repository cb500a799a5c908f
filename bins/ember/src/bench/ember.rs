//! The ember side, measured as any client sees it: only through [`Client`].
use super::stats::Series;
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

/// ember's side of `bench create`, one measured step at a time, so that the
/// caller can alternate each step with the crun reference's (load that drifts
/// during the run then weighs on both alike).
pub struct EmberBench<'a> {
    client: &'a Client,
    pub f: EmberFigures,
    /// The sandbox the exec figures run in.
    exec_id: Option<String>,
}

impl<'a> EmberBench<'a> {
    /// Fails only when not even one sandbox can be created and removed: then
    /// the daemon is unreachable or broken, and there is nothing to measure.
    pub async fn start(client: &'a Client) -> anyhow::Result<EmberBench<'a>> {
        // One discarded round first: connection set-up, page cache, first-use costs.
        let (info, _) = client.create_sandbox(&create_req()).await.context("creating the warm-up sandbox")?;
        client.delete_sandbox(&info.id).await.with_context(|| format!("removing warm-up sandbox {}", info.id))?;
        Ok(EmberBench { client, f: EmberFigures::default(), exec_id: None })
    }

    /// One cold create and its removal.
    pub async fn create_once(&mut self) {
        let f = &mut self.f;
        let t0 = Instant::now();
        let res = self.client.create_sandbox(&create_req()).await;
        let wall = t0.elapsed();
        let (info, header_us) = match res {
            Ok(r) => r,
            Err(e) => {
                f.create_server.fail(&e);
                f.create_wall.fail(&e);
                return;
            }
        };
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
        match self.client.delete_sandbox(&info.id).await {
            Ok(()) => f.delete.push(t1.elapsed()),
            Err(e) => {
                f.delete.fail(format!("{}: {e}", info.id));
                f.leftovers.push(info.id);
            }
        }
    }

    /// The sandbox the exec steps use; a failure to make it fails both exec figures.
    pub async fn exec_start(&mut self) {
        match self.client.create_sandbox(&create_req()).await {
            Ok((info, _)) => self.exec_id = Some(info.id),
            Err(e) => {
                let msg = format!("creating the exec sandbox: {e}");
                self.f.exec_argv.fail(&msg);
                self.f.exec_bash.fail(&msg);
            }
        }
    }

    /// One `true` to completion, argv or `bash -c`; `measured: false` is the
    /// discarded first call.
    pub async fn exec_step(&mut self, bash: bool, measured: bool) {
        let Some(id) = self.exec_id.as_deref() else { return };
        let req = if bash {
            RunCommandRequest { command: Some("true".into()), ..Default::default() }
        } else {
            RunCommandRequest { argv: Some(vec!["true".into()]), ..Default::default() }
        };
        let t0 = Instant::now();
        let res = exec_once(self.client, id, &req).await;
        if measured {
            let series = if bash { &mut self.f.exec_bash } else { &mut self.f.exec_argv };
            match res {
                Ok(()) => series.push(t0.elapsed()),
                Err(e) => series.fail(format!("{e:#}")),
            }
        }
    }

    pub async fn finish(mut self) -> EmberFigures {
        if let Some(id) = self.exec_id.take() {
            if let Err(e) = self.client.delete_sandbox(&id).await {
                eprintln!("ember: removing exec sandbox {id}: {e}");
                self.f.leftovers.push(id);
            }
        }
        self.f
    }
}

/// One command to completion; anything but exit code 0 is a failure.
pub(crate) async fn exec_once(client: &Client, id: &str, req: &RunCommandRequest) -> anyhow::Result<()> {
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
