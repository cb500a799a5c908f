//! Command-line grammar: the top level here, each subcommand family in a
//! module of its own.
use clap::{Parser, Subcommand};

mod bench;
mod images;
mod observe;
mod pools;
mod sandbox;
mod serve;
mod workspaces;

pub use bench::*;
pub use images::*;
pub use observe::*;
pub use pools::*;
pub use sandbox::*;
pub use serve::*;
pub use workspaces::*;

#[derive(Parser)]
#[command(name = "ember", version, about = "ember: isolated sandboxes for long-running AI agents")]
pub struct Cli {
    /// The daemon's address.
    #[arg(long, global = true, env = "EMBER_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// API key, when the daemon requires one.
    #[arg(long, global = true, env = "EMBER_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per process; `serve`'s flags are the largest")]
pub enum Cmd {
    /// Run the daemon (embedded single-node mode).
    Serve(ServeArgs),
    /// Manage sandboxes.
    #[command(subcommand)]
    Sandbox(SandboxCmd),
    /// Run a command in a sandbox, streaming its output; exits with its code.
    /// With -i its stdin is streamed too; with -t it runs on a terminal
    /// (with -it the local terminal is raw and ctrl-c goes to the command; it
    /// is resized with the window; the detach sequence leaves it running).
    /// Without a raw terminal, ctrl-c ends the command and exits 130.
    Exec(ExecArgs),
    /// An interactive shell (bash, else sh) on a terminal in a sandbox, as
    /// the sandbox's user: `ember exec -it` without a command.
    Shell {
        /// The sandbox's id.
        id: String,
        /// Keys that leave the session running (reattach: `ember attach ID --session S`).
        #[arg(long, default_value = "ctrl-p,ctrl-q")]
        detach_keys: String,
    },
    /// Follow a sandbox's entrypoint. ember's entrypoint runs without a
    /// terminal and with stdin from /dev/null, so this streams its output
    /// (stdout and stderr, as `ember logs -f` from now on) until it exits.
    /// With --session: reattach to a terminal session left by the detach
    /// sequence of `ember exec -it` / `ember shell`, stdin included.
    Attach(AttachArgs),
    /// Print a sandbox's entrypoint output (stdout and stderr in one stream).
    /// The sandbox's agent keeps the last 8 MiB of it, so it survives daemon
    /// restarts while the sandbox runs.
    Logs {
        /// The sandbox's id.
        id: String,
        /// Keep printing new output until the entrypoint exits.
        #[arg(short, long)]
        follow: bool,
        /// Only the last N lines of what is kept (default: all).
        #[arg(long, value_name = "N")]
        tail: Option<usize>,
    },
    /// Live cpu, memory, pids and block IO of a sandbox, from its cgroup (a
    /// line a second; CPU % is of one core).
    Stats {
        /// The sandbox's id.
        id: String,
        /// Print one line and exit.
        #[arg(long)]
        no_stream: bool,
        /// One JSON object per reading (the API's figures plus cpuPercent).
        #[arg(long)]
        json: bool,
    },
    /// Copy a file into or out of a sandbox (`ID:/path` names the sandbox side).
    Cp {
        /// Source: a local path, or ID:/path in a sandbox.
        src: String,
        /// Destination: a local path, or ID:/path in a sandbox.
        dst: String,
    },
    /// Create a sandbox, run one command in it, remove it.
    Run {
        #[command(flatten)]
        create: CreateArgs,
        #[command(flatten)]
        exec: ExecOpts,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Manage workspaces: durable volumes that outlive sandboxes.
    #[command(subcommand)]
    Workspace(WorkspaceCmd),
    /// Workspace snapshots.
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Manage OCI images: pull, import, list, remove, prune.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Manage templates: named image + resources + runtime settings.
    #[command(subcommand)]
    Template(TemplateCmd),
    /// Manage warm pools.
    #[command(subcommand)]
    Pool(PoolCmd),
    /// Runtime classes (native, runsc, crun, runc, ...).
    #[command(subcommand)]
    Runtime(RuntimeCmd),
    /// Queue commands for the node's workers to pull and run.
    #[command(subcommand)]
    Task(crate::commands::task::TaskCmd),
    /// Tenants, their keys and quotas (admin key).
    #[command(subcommand)]
    Tenant(crate::commands::tenant::TenantCmd),
    /// Read the audit log (admin key).
    Audit(crate::commands::tenant::AuditArgs),
    /// Measure ember beside a reference in the same run.
    #[command(subcommand)]
    Bench(BenchCmd),
    /// The labs: each breaks something, then measures what answers it.
    #[command(subcommand)]
    Lab(crate::lab::LabCmd),
    /// A local cluster out of network namespaces (up, status, down).
    #[command(subcommand)]
    Cluster(crate::cluster::ClusterCmd),
    /// The chaos drill against a local cluster.
    #[command(subcommand)]
    Chaos(crate::chaos::ChaosCmd),
    /// ember's Kubernetes operator (CRDs of group ember.run) for one node.
    Operator(crate::commands::operator::OperatorArgs),
    /// Remove everything `ember serve` made on the host (sandboxes, cgroups,
    /// mounts, the egress network, the data dir) once no daemon runs.
    Uninstall(crate::commands::uninstall::UninstallArgs),
}

/// Commands that never call the API (a path of subcommands), and the global
/// flags their help does not offer (`serve` keeps `--api-key`: the key it requires).
const NO_API: [(&[&str], &[&str]); 5] = [
    (&["serve"], &["url"]),
    (&["uninstall"], &["url", "api_key"]),
    (&["cluster"], &["url", "api_key"]),
    (&["chaos"], &["url", "api_key"]),
    (&["bench", "snapshot"], &["url", "api_key"]),
];

/// The grammar, with `--url` and `--api-key` hidden where they mean nothing:
/// each such command gets hidden flags of the same ids, which the global
/// ones then skip (clap propagates a global flag only where its id is
/// free), so they are still accepted there and nothing that passes them breaks.
pub fn command() -> clap::Command {
    let mut c = <Cli as clap::CommandFactory>::command();
    for (path, args) in NO_API {
        c = at(c, path, args);
    }
    c
}

fn at(c: clap::Command, path: &[&str], args: &'static [&'static str]) -> clap::Command {
    match path {
        [] => args.iter().fold(c, |c, id| {
            let long = if *id == "api_key" { "api-key" } else { id };
            c.arg(clap::Arg::new(*id).long(long).global(true).hide(true))
        }),
        [first, rest @ ..] => c.mut_subcommand(*first, |s| at(s, rest, args)),
    }
}

/// Parses the command line against [`command`]; exits on a usage error or
/// `--help`, as `Parser::parse` does.
pub fn parse() -> Cli {
    let m = command().get_matches();
    <Cli as clap::FromArgMatches>::from_arg_matches(&m).unwrap_or_else(|e| e.exit())
}

#[derive(Subcommand)]
pub enum RuntimeCmd {
    /// Each runtime class, its kernel boundary and whether it is available here.
    Ls {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}
