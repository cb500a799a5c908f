//! `ember sandbox ...` and `ember run`.
use super::{exec, parse_duration, parse_kv};
use crate::cli::{CreateArgs, ExecOpts, SandboxCmd, SandboxSnapshotCmd};
use anyhow::Context;
use ember_client::Client;
use ember_types::api::{CreateSandboxRequest, ImageSpec, ResourcesSpec, SandboxInfo, WorkspaceMountSpec};

pub fn create_request(a: &CreateArgs) -> anyhow::Result<CreateSandboxRequest> {
    let env = parse_kv(&a.env, "--env")?;
    let labels = parse_kv(&a.labels, "--label")?;
    Ok(CreateSandboxRequest {
        template: a.template.clone(),
        snapshot_id: a.snapshot.clone(),
        image: a.image.clone().map(|uri| ImageSpec { uri, auth: None }),
        resources: Some(ResourcesSpec {
            memory: a.memory.clone(),
            cpu: a.cpus.clone(),
            pids: a.pids,
            disk: a.disk.clone(),
        }),
        timeout: a.ttl.as_deref().map(parse_duration).transpose().context("--ttl")?.map(|d| d.as_secs().max(1)),
        env: (!env.is_empty()).then(|| env.into_iter().map(|(k, v)| (k, Some(v))).collect()),
        metadata: (!labels.is_empty()).then_some(labels),
        runtime_class: a.runtime.clone(),
        workspaces: a.workspaces.iter().map(|w| workspace_mount(w, a.steal)).collect::<anyhow::Result<_>>()?,
        network: a.network.clone(),
        allow: a.allow.clone(),
        auto_pause: super::auto_pause(a.auto_pause.as_deref())?,
        ..Default::default()
    })
}

/// `NAME[:/path][:ro]`.
fn workspace_mount(s: &str, steal: bool) -> anyhow::Result<WorkspaceMountSpec> {
    let mut parts = s.split(':');
    let name = parts.next().filter(|n| !n.is_empty()).context("--workspace needs a name")?.to_string();
    let mut spec = WorkspaceMountSpec { name, steal, ..Default::default() };
    for p in parts {
        match p {
            "ro" => spec.read_only = true,
            "rw" => spec.read_only = false,
            path if path.starts_with('/') => spec.mount_path = Some(path.to_string()),
            other => anyhow::bail!("--workspace {s:?}: {other:?} is neither an absolute path nor ro/rw"),
        }
    }
    Ok(spec)
}

pub async fn run(client: &Client, cmd: SandboxCmd) -> anyhow::Result<i32> {
    match cmd {
        SandboxCmd::Create { args, json } => {
            let (info, micros) = client.create_sandbox(&create_request(&args)?).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&info)?);
            } else {
                println!("{}", info.id);
                eprintln!(
                    "created in {:.2} ms ({})",
                    micros as f64 / 1000.0,
                    info.launch.map(|l| l.kind).unwrap_or_default()
                );
            }
        }
        SandboxCmd::Ls { state, json, quiet } => {
            let q = ember_client::query(state.iter().map(|s| ("state", s.as_str())));
            let list = client.list_sandboxes(&q).await?;
            if quiet {
                list.iter().for_each(|s| println!("{}", s.id));
            } else if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print_table(&list);
            }
        }
        SandboxCmd::Inspect { id, json } => {
            let info = client.get_sandbox(&id).await?;
            let boundary = client.boundary(&id).await.ok();
            let v = serde_json::json!({ "sandbox": info, "boundary": boundary });
            if json {
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                println!("{}", serde_yaml_like(&v, 0));
            }
        }
        SandboxCmd::Policy { id, allow, open, json } => {
            return super::network::policy(client, &id, allow, open, json).await
        }
        SandboxCmd::Events { id, json } => return super::network::events(client, &id, json).await,
        SandboxCmd::Snapshot { id, name, json } => {
            let s = client.snapshot_sandbox(&id, name.as_deref()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!("{}", s.id);
            }
        }
        SandboxCmd::Snapshots(cmd) => return snapshots(client, cmd).await,
        SandboxCmd::Pause { id } => client.pause_sandbox(&id).await?,
        SandboxCmd::Checkpoint { id } => client.checkpoint_sandbox(&id).await?,
        SandboxCmd::Resume { id } => client.resume_sandbox(&id).await?,
        SandboxCmd::Rm { ids } => {
            return super::for_each_name(ids, |id| async move { client.delete_sandbox(&id).await }).await;
        }
    }
    Ok(0)
}

async fn snapshots(client: &Client, cmd: SandboxSnapshotCmd) -> anyhow::Result<i32> {
    match cmd {
        SandboxSnapshotCmd::Ls { sandbox, json } => {
            let q = sandbox.map(|s| ember_client::query([("sandboxId", s.as_str())])).unwrap_or_default();
            let list = client.list_sandbox_snapshots(&q).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(0);
            }
            println!("{:<38} {:<8} {:<38} {:<12} {:>10} CREATED", "ID", "STATE", "SANDBOX", "NAME", "BYTES");
            for s in list {
                println!(
                    "{:<38} {:<8} {:<38} {:<12} {:>10} {}",
                    s.id,
                    s.status.state,
                    s.sandbox_id,
                    s.name.as_deref().unwrap_or("-"),
                    s.layer_bytes.map_or("-".to_string(), |b| b.to_string()),
                    s.created_at
                );
            }
        }
        SandboxSnapshotCmd::Inspect { id } => {
            println!("{}", serde_json::to_string_pretty(&client.get_sandbox_snapshot(&id).await?)?);
        }
        SandboxSnapshotCmd::Rm { ids } => {
            let mut failed = 0;
            for id in ids {
                match client.delete_sandbox_snapshot(&id).await {
                    Ok(()) => println!("{id}"),
                    Err(e) => {
                        eprintln!("ember: {id}: {e}");
                        failed += 1;
                    }
                }
            }
            return Ok(if failed > 0 { 1 } else { 0 });
        }
    }
    Ok(0)
}

fn print_table(list: &[SandboxInfo]) {
    println!("{:<38} {:<11} {:<12} {:<10} {:<25} EXPIRES", "ID", "STATE", "REASON", "TEMPLATE", "CREATED");
    for s in list {
        println!(
            "{:<38} {:<11} {:<12} {:<10} {:<25} {}",
            s.id,
            s.status.state,
            s.status.reason.as_deref().unwrap_or("-"),
            s.template,
            s.created_at,
            s.expires_at.as_deref().unwrap_or("never")
        );
    }
}

/// Indented `key: value` rendering of a JSON value, for human eyes.
fn serde_yaml_like(v: &serde_json::Value, indent: usize) -> String {
    let pad = " ".repeat(indent);
    match v {
        serde_json::Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
                    format!("{pad}{k}:\n{}", serde_yaml_like(v, indent + 2))
                }
                _ => format!("{pad}{k}: {}", scalar(v)),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        serde_json::Value::Array(a) => a.iter().map(|x| format!("{pad}- {}", scalar(x))).collect::<Vec<_>>().join("\n"),
        _ => format!("{pad}{}", scalar(v)),
    }
}

fn scalar(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `ember run`: create, exec, remove (the sandbox goes even if the command fails).
pub async fn run_once(client: &Client, create: &CreateArgs, opts: &ExecOpts, argv: Vec<String>) -> anyhow::Result<i32> {
    let (info, _) = client.create_sandbox(&create_request(create)?).await?;
    let res = exec(client, &info.id, opts, argv).await;
    let rm = client.delete_sandbox(&info.id).await;
    let code = res?;
    rm.with_context(|| format!("removing sandbox {}", info.id))?;
    Ok(code)
}
