//! `ember sandbox`, `ember exec` and `ember attach`: creating and running sandboxes.
use clap::{Args, Subcommand};

#[derive(Args, Clone, Default)]
pub struct CreateArgs {
    /// Template to use (default: host).
    #[arg(long)]
    pub template: Option<String>,
    /// Restore a sandbox snapshot (`ember sandbox snapshot`): its rootfs
    /// changes, workspaces (as new copies), template and resources.
    #[arg(long, conflicts_with_all = ["template", "image"])]
    pub snapshot: Option<String>,
    /// An image reference instead of a template (pulled if missing).
    #[arg(long)]
    pub image: Option<String>,
    /// Memory limit, e.g. 512Mi.
    #[arg(long)]
    pub memory: Option<String>,
    /// CPU limit in cores, e.g. 1 or 0.5.
    #[arg(long)]
    pub cpus: Option<String>,
    /// Process limit (default: the template's).
    #[arg(long)]
    pub pids: Option<u64>,
    /// Size of the writable layer, e.g. 1Gi.
    #[arg(long)]
    pub disk: Option<String>,
    /// Time to live, e.g. 10m (default: until removed).
    #[arg(long)]
    pub ttl: Option<String>,
    /// Freeze the sandbox after this long without API or proxy calls, e.g.
    /// 5m; the next call thaws it (default: never, or the pool's when claimed).
    #[arg(long, value_name = "DURATION")]
    pub auto_pause: Option<String>,
    /// Environment variable for every command, K=V (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Metadata label, K=V (repeatable).
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Runtime class: native (default), runsc (gVisor), crun, runc; see `ember runtime ls`.
    #[arg(long)]
    pub runtime: Option<String>,
    /// Mount a workspace: NAME[:/mount/path][:ro] (repeatable; default path /workspace).
    #[arg(long = "workspace", value_name = "NAME[:/PATH][:ro]")]
    pub workspaces: Vec<String>,
    /// Take read-write workspace leases from live holders, fencing them.
    #[arg(long)]
    pub steal: bool,
    /// `none` (loopback only, the default) or `egress` (outbound through NAT;
    /// the host, other sandboxes and private ranges stay denied).
    #[arg(long, value_name = "none|egress")]
    pub network: Option<String>,
    /// Allow only these destinations: CIDR, IP, DOMAIN or *.DOMAIN, each with
    /// an optional :PORT (repeatable; implies --network egress).
    #[arg(long = "allow", value_name = "CIDR|DOMAIN[:PORT]")]
    pub allow: Vec<String>,
}

#[derive(Args, Clone, Default)]
pub struct ExecOpts {
    /// Working directory inside the sandbox.
    #[arg(long)]
    pub cwd: Option<String>,
    /// uid[:gid] to run as (default: the sandbox's user).
    #[arg(long)]
    pub user: Option<String>,
    /// Kill the command after this long, e.g. 30s.
    #[arg(long)]
    pub timeout: Option<String>,
    /// The old spelling of `ember exec --env` (`ember run`: its --env covers
    /// the command too); hidden, kept so scripts do not break.
    #[arg(long = "exec-env", value_name = "K=V", hide = true)]
    pub exec_env: Vec<String>,
}

/// `-i`, `-t` and the detach sequence of `ember exec`.
#[derive(Args, Clone, Default)]
pub struct InteractiveOpts {
    /// Stream stdin to the command (end of input closes its stdin).
    #[arg(short, long)]
    pub interactive: bool,
    /// Run the command on a terminal (needs a terminal on stdin); stdout and
    /// stderr arrive merged, as on any terminal.
    #[arg(short, long)]
    pub tty: bool,
    /// With -t: keys that leave the session running (`ctrl-<letter>` or a
    /// character, comma separated; empty: none). Reattach with
    /// `ember attach ID --session S`.
    #[arg(long, default_value = "ctrl-p,ctrl-q")]
    pub detach_keys: String,
}

#[derive(Args)]
pub struct AttachArgs {
    /// The sandbox's id.
    pub id: String,
    /// A terminal session id, as printed when it was detached.
    #[arg(long)]
    pub session: Option<String>,
    /// With --session: take the session over from a client attached to it.
    #[arg(long, requires = "session")]
    pub takeover: bool,
    /// With --session: keys that leave the session running again.
    #[arg(long, default_value = "ctrl-p,ctrl-q")]
    pub detach_keys: String,
}

#[derive(Args)]
pub struct ExecArgs {
    /// The sandbox's id.
    pub id: String,
    #[command(flatten)]
    pub opts: ExecOpts,
    /// Extra environment for this command, K=V (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    #[command(flatten)]
    pub io: InteractiveOpts,
    /// The command and its arguments (after --).
    #[arg(last = true, required = true)]
    pub argv: Vec<String>,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per process")]
pub enum SandboxCmd {
    /// Create a sandbox and print its id.
    Create {
        #[command(flatten)]
        args: CreateArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List sandboxes.
    Ls {
        /// Only sandboxes in this state (repeatable).
        #[arg(long)]
        state: Vec<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Print only the ids, one a line (for scripts: `ember sandbox rm $(ember sandbox ls -q)`).
        #[arg(short, long, conflicts_with = "json")]
        quiet: bool,
    },
    /// Show a sandbox, with the boundary actually enforced on it.
    Inspect {
        /// The sandbox's id.
        id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove sandboxes.
    Rm {
        /// Sandboxes to remove (at least one).
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Freeze a Running sandbox.
    Pause {
        /// The sandbox's id.
        id: String,
    },
    /// Save a Running gVisor (runsc) sandbox's processes and memory to disk and
    /// stop them; `ember sandbox resume ID` restores it.
    Checkpoint {
        /// The sandbox's id.
        id: String,
    },
    /// Thaw a paused sandbox, or restore a checkpointed one.
    Resume {
        /// The sandbox's id.
        id: String,
    },
    /// Show a sandbox's network policy, or replace it while it runs.
    Policy {
        /// The sandbox's id.
        id: String,
        /// Replace the policy with this allow-list (repeatable).
        #[arg(long = "allow", value_name = "CIDR|DOMAIN[:PORT]")]
        allow: Vec<String>,
        /// Replace the policy with open egress (no allow-list).
        #[arg(long, conflicts_with = "allow")]
        open: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Blocked connection attempts and DNS queries of a sandbox.
    Events {
        /// The sandbox's id.
        id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Snapshot a running sandbox (its rootfs changes and read-write
    /// workspaces) and print the snapshot id; `ember sandbox create
    /// --snapshot ID` restores it.
    Snapshot {
        /// The sandbox's id.
        id: String,
        /// A name for the snapshot (default: none).
        #[arg(long)]
        name: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List, inspect or remove sandbox snapshots.
    #[command(subcommand)]
    Snapshots(SandboxSnapshotCmd),
}

#[derive(Subcommand)]
pub enum SandboxSnapshotCmd {
    /// List sandbox snapshots.
    Ls {
        /// Only snapshots of this sandbox.
        #[arg(long)]
        sandbox: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show a sandbox snapshot.
    Inspect {
        /// The sandbox snapshot's id.
        id: String,
    },
    /// Remove sandbox snapshots (their chunks go at the next `ember snapshot gc`,
    /// which the daemon also runs on a schedule and soon after a delete).
    Rm {
        /// Sandbox snapshots to delete (at least one).
        #[arg(required = true)]
        ids: Vec<String>,
    },
}
