//! Client verbs. Each one is a thin wrapper over an ember-client call.
mod files;
pub mod image;
mod interactive;
mod logs;
mod network;
pub mod operator;
mod pool;
mod sandbox;
mod snapshot_progress;
mod stats;
pub mod task;
pub mod tenant;
pub mod uninstall;
mod workspace;

use crate::cli::{Cli, Cmd, ExecOpts};
use anyhow::{bail, Context};
use ember_client::Client;
use ember_types::execd::RunCommandRequest;
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

pub async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    let client = || Client::new(&cli.url, cli.api_key.clone()).context("EMBER_URL");
    match cli.cmd {
        Cmd::Serve(args) => crate::serve::run(args, cli.api_key.clone()).await,
        Cmd::Sandbox(c) => sandbox::run(&client()?, c).await,
        Cmd::Exec(mut a) => {
            a.opts.exec_env.extend(std::mem::take(&mut a.env));
            match a.io.interactive || a.io.tty {
                true => interactive::exec(&client()?, &a.id, &a.opts, &a.io, a.argv).await,
                false => exec(&client()?, &a.id, &a.opts, a.argv).await,
            }
        }
        Cmd::Shell { id, detach_keys } => interactive::shell(&client()?, &id, &detach_keys).await,
        Cmd::Attach(a) => interactive::attach(&client()?, &a).await,
        Cmd::Logs { id, follow, tail } => logs::logs(&client()?, &id, follow, tail).await,
        Cmd::Stats { id, no_stream, json } => stats::stats(&client()?, &id, no_stream, json).await,
        Cmd::Cp { src, dst } => files::cp(&client()?, &src, &dst).await,
        Cmd::Run { create, exec: opts, argv } => sandbox::run_once(&client()?, &create, &opts, argv).await,
        Cmd::Image(c) => image::image(&client()?, c).await,
        Cmd::Template(c) => image::template(&client()?, c).await,
        Cmd::Snapshot(c) => workspace::snapshots(&client()?, c).await,
        Cmd::Workspace(c) => workspace::run(&client()?, c).await,
        Cmd::Pool(c) => pool::run(&client()?, c).await,
        Cmd::Runtime(crate::cli::RuntimeCmd::Ls { json }) => runtime_ls(&client()?, json).await,
        Cmd::Task(c) => task::run(&client()?, c).await,
        Cmd::Tenant(c) => tenant::run(&client()?, c).await,
        Cmd::Audit(a) => tenant::audit(&client()?, a).await,
        Cmd::Bench(b) => crate::bench::run(&client()?, b).await,
        Cmd::Lab(c) => crate::lab::run(c, client).await,
        Cmd::Cluster(c) => crate::cluster::run(c).await,
        Cmd::Chaos(c) => crate::chaos::run(c).await,
        Cmd::Operator(a) => operator::run(a, cli.api_key.clone()).await,
        Cmd::Uninstall(a) => uninstall::run(a),
    }
}

/// A duration as humantime reads it (`250ms`, `30s`, `10m`, `1h 30m`, `2d`),
/// or plain seconds. Out of range is an error, never a wrapped value.
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim();
    let hint = || format!("duration {s:?}: expected e.g. 30s, 10m, 1h");
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(Duration::from_secs(s.parse().with_context(hint)?));
    }
    humantime::parse_duration(s).with_context(hint)
}

/// A size flag's value (bytes): the API's quantities, `512Mi`, `1Gi`, `500M`,
/// or plain bytes; for clap's `value_parser`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    ember_types::parse_memory_bytes(s).map_err(|e| e.to_string())
}

/// `parse_duration` for clap's `value_parser`.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| format!("{e:#}"))
}

/// `--auto-pause DURATION` as the API's `autoPause` (whole seconds, at least 1).
pub fn auto_pause(s: Option<&str>) -> anyhow::Result<Option<ember_types::api::AutoPause>> {
    let secs = s.map(parse_duration).transpose().context("--auto-pause")?.map(|d| d.as_secs().max(1));
    Ok(secs.map(|after_seconds| ember_types::api::AutoPause { after_seconds, checkpoint: false }))
}

pub fn parse_kv(items: &[String], what: &str) -> anyhow::Result<BTreeMap<String, String>> {
    items
        .iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').with_context(|| format!("{what} {kv:?} is not K=V"))?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect()
}

pub fn exec_request(opts: &ExecOpts, argv: Vec<String>) -> anyhow::Result<RunCommandRequest> {
    let (uid, gid) = match &opts.user {
        None => (None, None),
        Some(u) => {
            let (a, b) = u.split_once(':').map_or((u.as_str(), None), |(a, b)| (a, Some(b)));
            (Some(a.parse().context("--user uid")?), b.map(|g| g.parse().context("--user gid")).transpose()?)
        }
    };
    let env = parse_kv(&opts.exec_env, "--env")?;
    Ok(RunCommandRequest {
        argv: Some(argv),
        cwd: opts.cwd.clone(),
        timeout: opts.timeout.as_deref().map(parse_duration).transpose()?.map(|d| d.as_millis() as u64),
        uid,
        gid,
        envs: (!env.is_empty()).then_some(env),
        ..Default::default()
    })
}

/// Streams a command's output to our stdout/stderr; returns its exit code.
pub async fn exec(client: &Client, id: &str, opts: &ExecOpts, argv: Vec<String>) -> anyhow::Result<i32> {
    let req = exec_request(opts, argv)?;
    let out = match client
        .exec(id, &req, |ev| {
            // Byte for byte: binary output and exact line ends survive.
            let _ = match ev.kind.as_str() {
                "stdout" => {
                    let mut o = std::io::stdout().lock();
                    o.write_all(&ev.output_bytes()).and_then(|()| o.flush())
                }
                "stderr" => std::io::stderr().lock().write_all(&ev.output_bytes()),
                _ => Ok(()),
            };
        })
        .await
    {
        Ok(out) => out,
        Err(e @ (ember_client::ClientError::Protocol { .. } | ember_client::ClientError::Cut { .. })) => {
            // The stream broke: say why if the sandbox itself ended.
            if let Ok(s) = client.get_sandbox(id).await {
                if s.status.state == "Failed" || s.status.state == "Terminated" {
                    let reason = s.status.reason.unwrap_or_default();
                    bail!("sandbox {id} ended while the command ran: {} ({reason})", s.status.state);
                }
            }
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(e) = out.error {
        bail!("command did not start: {e}");
    }
    Ok(out.exit_code.unwrap_or(255))
}

/// `ember runtime ls`.
async fn runtime_ls(client: &ember_client::Client, json: bool) -> anyhow::Result<i32> {
    let items = client.list_runtimes().await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&items)?);
        return Ok(0);
    }
    println!("{:<12} {:<10} {:<52} DETAIL", "CLASS", "AVAILABLE", "KERNEL BOUNDARY");
    for r in items {
        let avail = if r.available { "yes" } else { "no" };
        println!("{:<12} {:<10} {:<52} {}", r.name, avail, r.kernel_boundary, r.detail);
    }
    Ok(0)
}

/// Applies one API call to every name of a multi-name verb (`rm a b c`):
/// prints each name that succeeded, reports each failure on stderr and
/// carries on, and exits 1 if any failed — as `docker rm` does.
pub async fn for_each_name<F, Fut, T>(names: Vec<String>, mut call: F) -> anyhow::Result<i32>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<T, ember_client::ClientError>>,
{
    let mut failed = false;
    for name in names {
        match call(name.clone()).await {
            Ok(_) => println!("{name}"),
            Err(e) => {
                eprintln!("ember: {name}: {e}");
                failed = true;
            }
        }
    }
    Ok(i32::from(failed))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_as_humantime_or_plain_seconds() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("1ns").unwrap(), Duration::from_nanos(1));
        assert_eq!(parse_duration(" 42 ").unwrap(), Duration::from_secs(42));
        for bad in ["", "10x", "m", "-5s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_absurd_duration_is_an_error_not_an_overflow() {
        // 18 digits of hours: more seconds than a u64 holds.
        let e = parse_duration("999999999999999999h").unwrap_err();
        assert!(format!("{e:#}").contains("999999999999999999h"), "{e:#}");
    }
}
