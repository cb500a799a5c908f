//! Boot and shutdown: the PID 1 duties around the HTTP server.
//!
//! Boot: 1. become a subreaper unless PID 1; 2. register SIGCHLD before any
//! child exists; 3. start the reaper and the entrypoint; 4. serve.
//! Shutdown (SIGTERM/SIGINT, or the entrypoint exiting): SIGTERM everyone,
//! wait up to 2 s for them to go, SIGKILL the rest, exit.
use crate::commands;
use crate::commands::registry::Registry;
use crate::commands::run::{Run, DRAIN};
use crate::config::AgentConfig;
use crate::metrics::Sampler;
use crate::reaper::{Reaper, Remaining};
use crate::server::{self, App};
use ember_sys::process::{self as sys, ExitKind};
use ember_types::execd::RunCommandRequest;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long processes get between SIGTERM and SIGKILL at shutdown.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Runs the agent to its end and returns the process exit code.
pub async fn run(config: AgentConfig) -> i32 {
    if !config.is_pid1 {
        // Orphans of our commands get reparented to us, not to the host's init.
        if let Err(e) = sys::set_child_subreaper() {
            eprintln!("ember-agent: cannot become a subreaper: {e}");
        }
    }
    let signals = (signal(SignalKind::child()), signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    let (Ok(sigchld), Ok(mut sigterm), Ok(mut sigint)) = signals else {
        eprintln!("ember-agent: cannot install signal handlers");
        return 1;
    };
    let app = App {
        sampler: Arc::new(Sampler::new(&config)),
        config: Arc::new(config),
        reaper: Arc::new(Reaper::default()),
        registry: Arc::new(Registry::default()),
        sessions: Arc::default(),
        contexts: Arc::default(),
        ptys: Arc::default(),
    };
    if app.config.is_pid1 {
        prepare_execd_envs(&app.config);
        // Only inside a sandbox: on a shared host the port may be anyone's.
        let port = app.config.env_var("JUPYTER_PORT").and_then(|p| p.parse().ok()).unwrap_or(44771);
        tokio::spawn(crate::code::readiness_port(port));
    }
    let reaper = app.reaper.clone();
    tokio::spawn(async move { reaper.run(sigchld).await });
    if let Some(argv) = app.config.entrypoint.clone() {
        if app.config.await_secrets {
            // Its create asked for secrets: they are written before it runs.
            let app = app.clone();
            tokio::spawn(async move {
                app.config.binding.secrets.opened().await;
                app.config.binding.set_entrypoint(start_entrypoint(&app, argv));
            });
        } else {
            app.config.binding.set_entrypoint(start_entrypoint(&app, argv));
        }
    }
    let binding = app.config.binding.clone();
    let entry_exit = binding.entrypoint_exit();
    let code = tokio::select! {
        r = server::serve(&app.config, server::router(app.clone())) => {
            eprintln!("ember-agent: server stopped: {}", r.err().map_or("no error".to_string(), |e| e.to_string()));
            1
        }
        _ = sigterm.recv() => 0,
        _ = sigint.recv() => 0,
        exit = entry_exit => exit.code(),
    };
    stop_everything(&app).await;
    code
}

/// Starts an entrypoint (`EMBER_AGENT_ENTRYPOINT` at boot, or one bound by a
/// claim) as the default user, its output kept in the log of the command
/// named "entrypoint" (`/command/entrypoint/logs`). The handle resolves when
/// it exits.
pub fn start_entrypoint(app: &App, argv: Vec<String>) -> JoinHandle<ExitKind> {
    let req = RunCommandRequest {
        argv: Some(argv),
        // The image's working directory is the agent's own.
        cwd: std::env::current_dir().ok().map(|d| d.display().to_string()),
        ..Default::default()
    };
    match commands::start(app, &req, Some("entrypoint")) {
        Ok((id, spawned)) => {
            let run = Run {
                registry: app.registry.clone(),
                reaper: app.reaper.clone(),
                id,
                started: Instant::now(),
                timeout: None,
                drain: Some(DRAIN),
                grace: Duration::ZERO,
            };
            tokio::spawn(run.watch(spawned, None))
        }
        Err((_, msg)) => {
            eprintln!("ember-agent: entrypoint: {msg}");
            tokio::spawn(async { ExitKind::Exited(127) })
        }
    }
}

/// Creates the `EXECD_ENVS` file (and its directory) if missing, owned by the
/// default user, so `commands.set_env` run as that user can append to it.
fn prepare_execd_envs(config: &AgentConfig) {
    let Some(file) = &config.execd_envs else { return };
    if file.exists() {
        return;
    }
    let made = file.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|_| std::fs::write(file, b""));
    let owner = config.default_identity.map(|i| (i.uid, i.gid.unwrap_or(i.uid)));
    let owned = match (&made, owner) {
        (Ok(()), Some((uid, gid))) => std::os::unix::fs::chown(file, Some(uid), Some(gid)),
        _ => Ok(()),
    };
    if let Err(e) = made.and(owned) {
        eprintln!("ember-agent: EXECD_ENVS file {}: {e}", file.display());
    }
}

/// SIGTERM, up to [`STOP_GRACE`] to exit, then SIGKILL. As PID 1 that is
/// every process of the sandbox; otherwise the commands we started.
async fn stop_everything(app: &App) {
    let pid1 = app.config.is_pid1;
    let signal_all = |sig| {
        if pid1 {
            let _ = sys::kill_all(sig);
        } else {
            app.reaper.signal_all_groups(sig);
        }
    };
    signal_all(sys::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        let gone = if pid1 { app.reaper.reap() == Remaining::None } else { app.reaper.tracked() == 0 };
        if gone {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    signal_all(sys::SIGKILL);
}
