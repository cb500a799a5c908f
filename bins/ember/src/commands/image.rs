//! `ember image ...` and `ember template ...`: thin wrappers over ember-client.
use super::parse_kv;
use crate::cli::{ImageCmd, TemplateCmd};
use anyhow::Context;
use ember_client::Client;
use ember_types::image::{ImageInfo, PullRequest, RegistryAuth, TemplateRequest};
use ember_types::ResourcesSpec;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::time::Duration;

pub async fn image(client: &Client, cmd: ImageCmd) -> anyhow::Result<i32> {
    match cmd {
        ImageCmd::Pull { reference, username, password, token, json } => {
            let auth = (username.is_some() || token.is_some()).then_some(RegistryAuth { username, password, token });
            let info = pull_with_progress(client, &PullRequest { image: reference, auth }, !json).await?;
            print_image(&info, json)?;
        }
        ImageCmd::Import { path, name, json } => {
            let bar = (!json).then(|| spinner(&format!("packing {}", path.display())));
            let p = path.clone();
            let tar = tokio::task::spawn_blocking(move || tar_of(&p)).await??;
            if let Some(b) = &bar {
                b.set_message(format!("importing {} ({:.1} MB)", name, tar.len() as f64 / 1e6));
            }
            let info = client.import_image(&name, tar.into()).await?;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            print_image(&info, json)?;
        }
        ImageCmd::Ls { json } => {
            let list = client.list_images().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("{:<50} {:<20} {:>7} {:>10}", "NAME", "DIGEST", "LAYERS", "SIZE");
                for i in &list.items {
                    let d = i.digest.get(..19).unwrap_or(&i.digest);
                    println!("{:<50} {:<20} {:>7} {:>8.1}MB", i.name, d, i.layers.len(), i.size as f64 / 1e6);
                }
                let shared = list.layers.iter().filter(|l| l.images > 1).count();
                println!("{} layers on this node, {} shared by several images", list.layers.len(), shared);
            }
        }
        ImageCmd::Rm { names } => {
            return super::for_each_name(names, |n| async move { client.remove_image(&n).await }).await;
        }
        ImageCmd::Prune { json } => {
            let r = client.prune_images().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!("removed {} layers, {:.1} MB", r.removed_layers.len(), r.freed_bytes as f64 / 1e6);
            }
        }
    }
    Ok(0)
}

fn spinner(msg: &str) -> ProgressBar {
    let b = ProgressBar::new_spinner();
    b.set_message(msg.to_string());
    b.enable_steady_tick(Duration::from_millis(120));
    b
}

/// Pulls, drawing one bar for the bytes of all layers from the daemon's
/// `GET /v1/images/pulls` while the pull request is pending.
pub async fn pull_with_progress(client: &Client, req: &PullRequest, show: bool) -> anyhow::Result<ImageInfo> {
    let pull = client.pull_image(req);
    tokio::pin!(pull);
    let bar = show.then(|| {
        let b = ProgressBar::new(0);
        let style = ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar());
        b.set_style(style.progress_chars("=> "));
        b.set_message(format!("pulling {}", req.image));
        b
    });
    let mut tick = tokio::time::interval(Duration::from_millis(150));
    let res = loop {
        tokio::select! {
            r = &mut pull => break r,
            _ = tick.tick() => {
                let Some(b) = &bar else { continue };
                if let Ok(pulls) = client.image_pulls().await {
                    for p in pulls.iter().filter(|p| p.reference.ends_with(req.image.as_str()) || req.image.ends_with(p.reference.as_str()) || pulls.len() == 1) {
                        b.set_length(p.layers.iter().map(|l| l.size).sum());
                        b.set_position(p.layers.iter().map(|l| l.downloaded).sum());
                        let unpacking = p.layers.iter().filter(|l| l.state == "unpacking").count();
                        let done = p.layers.iter().filter(|l| l.state == "done" || l.state == "cached").count();
                        b.set_message(format!("{} {done}/{} layers{}", req.image, p.layers.len(), if unpacking > 0 { ", unpacking" } else { "" }));
                    }
                }
            }
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(res?)
}

fn print_image(info: &ImageInfo, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(info)?);
    } else {
        println!("{} {}", info.name, info.digest);
        for w in &info.warnings {
            eprintln!("ember: warning: {w}");
        }
    }
    Ok(())
}

/// A directory (a root filesystem or an OCI layout) as a tar, ownership and
/// symlinks kept; a file is sent as it is (a tar, maybe compressed).
fn tar_of(path: &Path) -> anyhow::Result<Vec<u8>> {
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    if !meta.is_dir() {
        return std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    }
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", path).with_context(|| format!("packing {}", path.display()))?;
    Ok(b.into_inner()?)
}

pub async fn template(client: &Client, cmd: TemplateCmd) -> anyhow::Result<i32> {
    match cmd {
        TemplateCmd::Create {
            name,
            image,
            memory,
            cpus,
            pids,
            disk,
            runtime,
            network,
            user,
            workdir,
            env,
            entrypoint,
            json,
        } => {
            let entrypoint = entrypoint
                .map(|e| {
                    serde_json::from_str::<Vec<String>>(&e).context("--entrypoint must be a JSON array of strings")
                })
                .transpose()?;
            let env = parse_kv(&env, "--env")?;
            let req = TemplateRequest {
                name,
                image,
                auth: None,
                resources: Some(ResourcesSpec { memory, cpu: cpus, pids, disk }),
                runtime_class: runtime,
                network,
                user,
                workdir,
                env: (!env.is_empty()).then_some(env),
                entrypoint,
            };
            let bar = (!json).then(|| spinner(&format!("creating template {} (pulling its image)", req.name)));
            let t = client.create_template(&req).await;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            let t = t?;
            if json {
                println!("{}", serde_json::to_string_pretty(&t)?);
            } else {
                println!("{}", t.name);
            }
        }
        TemplateCmd::Ls { json } => {
            let list = client.list_templates().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                println!("{:<24} {:<50} {:>8} {:>6}", "NAME", "IMAGE", "MEMORY", "CPUS");
                for t in list {
                    let img = t.image.unwrap_or_else(|| "(host rootfs)".into());
                    let mem = format!("{}Mi", t.resources.memory_bytes >> 20);
                    println!("{:<24} {:<50} {:>8} {:>6}", t.name, img, mem, t.resources.cpu_millis as f64 / 1000.0);
                }
            }
        }
        TemplateCmd::Inspect { name } => {
            println!("{}", serde_json::to_string_pretty(&client.get_template(&name).await?)?)
        }
        TemplateCmd::Rm { names } => {
            return super::for_each_name(names, |n| async move { client.delete_template(&n).await }).await;
        }
    }
    Ok(0)
}
