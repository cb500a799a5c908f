//! ember-agent: PID 1 of every ember sandbox, speaking the OpenSandbox execd
//! HTTP protocol natively (shared/docs/opensandbox-protocol.md §3).
//!
//! Layout: `config` (flags and env, frozen at start), `lifecycle` (boot,
//! signals, shutdown), `server` (routes, listener), `reaper` (the only
//! waitpid), `commands/` (run, interrupt, status, logs), `files/` (file and
//! directory routes), `metrics`, `sessions` (bash sessions), `pty/` (interactive terminals), `code/` (code
//! interpreter), `proxy` (in-sandbox ports), `quiesce` (checkpoints), `stream` (event framing), `mount_workspace` (the
//! one-shot verb that binds a workspace under gVisor), and the helpers
//! `error`, `query`, `paths`, `users`. Every syscall the agent needs beyond
//! std goes through `ember_sys::process` (`ember_sys::slot` for the mount verb).
#![forbid(unsafe_code)]

mod claim;
mod code;
mod commands;
mod config;
mod envfile;
mod error;
mod files;
mod lifecycle;
mod metrics;
mod mount_workspace;
mod paths;
mod proxy;
mod pty;
mod query;
mod quiesce;
mod reaper;
mod secrets;
mod server;
mod sessions;
mod stream;
mod users;

use config::AgentConfig;

fn main() {
    // A one-shot helper verb, not an agent: it must not touch the exit file.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(mount_workspace::VERB) {
        std::process::exit(mount_workspace::run(&args[1..]));
    }
    let config = match AgentConfig::from_parts(std::env::args().skip(1), std::env::vars_os(), std::process::id()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ember-agent: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = ember_sys::process::set_non_dumpable() {
        eprintln!("ember-agent: cannot mark itself non-dumpable: {e}");
    }
    let exit_file = exit_file(&config.listen);
    // One thread serves everything: the agent is mostly idle and must stay
    // small. File IO goes to a few blocking threads, started on demand.
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_io().enable_time().max_blocking_threads(8).build();
    let code = match runtime {
        Ok(rt) => rt.block_on(lifecycle::run(config)),
        Err(e) => {
            eprintln!("ember-agent: cannot start the runtime: {e}");
            1
        }
    };
    if let Some(path) = exit_file {
        // Best effort: without it the daemon reports the sandbox as Killed.
        let _ = std::fs::write(&path, format!("{code}\n"));
    }
    std::process::exit(code);
}

/// Where the agent leaves its exit code for the daemon when it listens on a
/// socket path: under an OCI runtime the agent is not the daemon's child, so
/// the daemon cannot `waitid` it and reads `exit` beside the socket instead
/// (see `ember_runtime::oci`). An inherited fd means the native class, whose
/// daemon reaps the agent itself.
fn exit_file(listen: &config::ListenAddr) -> Option<std::path::PathBuf> {
    match listen {
        config::ListenAddr::Unix(sock) => sock.parent().map(|d| d.join(EXIT_FILE)),
        _ => None,
    }
}

/// The file name of the agent's exit code beside its socket (`ember_runtime::oci::EXIT_FILE`).
const EXIT_FILE: &str = "exit";
