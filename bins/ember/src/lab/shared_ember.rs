//! Lab 1, after: research, coder and hog each in an ember sandbox of the same
//! memory limit, created through the API. The credentials stay where an
//! orchestrator keeps them, on the host: the key file at the same path, and
//! the environment variable in a host process (`sleep`) that runs meanwhile.
use super::shared::{Secrets, TaskOutcome, ENV_NAME, PAYLOAD_CAP};
use super::worker::STEP;
use anyhow::Context;
use ember_client::Client;
use ember_types::api::{CreateSandboxRequest, ResourcesSpec};
use ember_types::execd::RunCommandRequest;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long the hog's sandbox may take to be reported ended after its exec.
const END_WITHIN: Duration = Duration::from_secs(30);

pub struct Sandboxed {
    pub tasks: Vec<TaskOutcome>,
    /// `Failed (OOMKilled)` or whatever state the hog's sandbox is in.
    pub hog_state: String,
    pub hog_reason: Option<String>,
    pub neighbours_running: bool,
    pub payload: Vec<u8>,
}

pub async fn run(
    client: &Client,
    secrets: &Secrets,
    steps: u32,
    limit_mib: u64,
    dir: &Path,
) -> anyhow::Result<Sandboxed> {
    // The orchestrator's credential lives in a host process's environment.
    let mut holder = std::process::Command::new("sleep")
        .arg("600")
        .env(ENV_NAME, &secrets.env)
        .spawn()
        .context("starting the credential holder (sleep)")?;
    let mut ids = Vec::new();
    // Ctrl-C ends the phase with an error, so the clean-up below still runs.
    let r = crate::bench::pool::interruptible(sandboxes(client, secrets, steps, limit_mib, &mut ids)).await;
    let _ = holder.kill();
    let _ = holder.wait();
    for id in &ids {
        let _ = client.delete_sandbox(id).await;
    }
    let r = r?;
    let p = dir.join("payload-sandbox.out");
    std::fs::write(&p, &r.payload).with_context(|| format!("writing {}", p.display()))?;
    Ok(r)
}

async fn sandboxes(
    client: &Client,
    secrets: &Secrets,
    steps: u32,
    limit_mib: u64,
    ids: &mut Vec<String>,
) -> anyhow::Result<Sandboxed> {
    let req = CreateSandboxRequest {
        template: Some("host".into()),
        resources: Some(ResourcesSpec { memory: Some(format!("{limit_mib}Mi")), pids: Some(64), ..Default::default() }),
        ..Default::default()
    };
    for name in ["research", "coder", "hog"] {
        let (info, _) = client.create_sandbox(&req).await.with_context(|| format!("creating the {name} sandbox"))?;
        ids.push(info.id);
    }
    let steady = format!(
        "i=0; while [ $i -lt {steps} ]; do sleep {:.1}; i=$((i+1)); echo step $i; done; echo done",
        STEP.as_secs_f64()
    );
    let hog = format!("dd if=/dev/zero of=/dev/null bs={}M count=1", limit_mib * 4);
    let coder = async {
        let payload = sh(client, &ids[1], &secrets.payload()).await?;
        Ok::<_, anyhow::Error>((payload, sh(client, &ids[1], &steady).await?))
    };
    let (research, coder, _) = tokio::join!(sh(client, &ids[0], &steady), coder, sh(client, &ids[2], &hog));
    let (payload, coder) = coder?;
    let research = research?;
    let hog_info = wait_ended(client, &ids[2]).await?;
    let mut neighbours_running = true;
    for id in &ids[..2] {
        let s = client.get_sandbox(id).await.with_context(|| format!("reading sandbox {id}"))?;
        neighbours_running &= s.status.state == "Running";
    }
    let tasks = [("research", research), ("coder", coder)]
        .into_iter()
        .map(|(name, out)| {
            let s = String::from_utf8_lossy(&out);
            let steps_done = s.lines().filter(|l| l.starts_with("step ")).count() as u32;
            TaskOutcome { name: name.into(), steps, steps_done, finished: s.lines().any(|l| l == "done") }
        })
        .collect();
    let reason = hog_info.status.reason.clone();
    Ok(Sandboxed {
        tasks,
        hog_state: format!("{} ({})", hog_info.status.state, reason.as_deref().unwrap_or("no reason")),
        hog_reason: reason,
        neighbours_running,
        payload,
    })
}

/// `sh -c script`'s stdout, at most [`PAYLOAD_CAP`] bytes. (The hog's stream
/// may end either way when its sandbox ends under it: the caller ignores it.)
async fn sh(client: &Client, id: &str, script: &str) -> anyhow::Result<Vec<u8>> {
    let req = RunCommandRequest { command: Some(script.into()), ..Default::default() };
    let mut out = Vec::new();
    let r = client
        .exec(id, &req, |ev| {
            if ev.kind == "stdout" {
                let t = ev.text.as_deref().unwrap_or("");
                let room = (PAYLOAD_CAP as usize).saturating_sub(out.len());
                out.extend_from_slice(&t.as_bytes()[..t.len().min(room)]);
                if !t.ends_with('\n') && out.len() < PAYLOAD_CAP as usize {
                    out.push(b'\n');
                }
            }
        })
        .await;
    r.with_context(|| format!("running a command in sandbox {id}"))?;
    Ok(out)
}

/// Polls the hog's sandbox until it is no longer running.
async fn wait_ended(client: &Client, id: &str) -> anyhow::Result<ember_types::api::SandboxInfo> {
    let deadline = Instant::now() + END_WITHIN;
    loop {
        let s = client.get_sandbox(id).await.with_context(|| format!("reading sandbox {id}"))?;
        if s.status.state != "Running" || Instant::now() > deadline {
            return Ok(s);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
