//! `ember pool`.
use clap::Subcommand;

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per process")]
pub enum PoolCmd {
    /// Keep sandboxes of a template started ahead of demand.
    Create {
        /// Template of the pool's sandboxes (required unless --from-snapshot or --from-checkpoint).
        #[arg(long, required_unless_present_any = ["from_snapshot", "from_checkpoint"])]
        template: Option<String>,
        /// Pool name (default: the template's; required with --from-snapshot or --from-checkpoint).
        #[arg(long)]
        name: Option<String>,
        /// A golden pool: every member starts with this sandbox snapshot's
        /// writable layer and a copy of each of its workspaces, and `ember
        /// sandbox create --snapshot SNAP` claims one (template, runtime class
        /// and network are the snapshot's; the snapshot cannot be removed
        /// while the pool exists).
        #[arg(long, value_name = "SNAP", conflicts_with_all = ["network", "allow"])]
        from_snapshot: Option<String>,
        /// A golden pool restored from a gVisor checkpoint of this Running
        /// runsc sandbox: every member starts with its processes and memory
        /// (and its files, through a snapshot `pool-NAME` the pool owns).
        /// The sandbox is left checkpointed (`ember sandbox resume` brings it
        /// back); `ember sandbox create --snapshot SNAP` of the pool's
        /// snapshot claims a member (`ember pool inspect` names it).
        #[arg(long, value_name = "SANDBOX", conflicts_with_all = ["from_snapshot", "network", "allow"])]
        from_checkpoint: Option<String>,
        /// Idle auto-pause of the sandboxes claimed from the pool, e.g. 5m
        /// (a claim's own --auto-pause wins; default: none).
        #[arg(long, value_name = "DURATION")]
        auto_pause: Option<String>,
        /// Idle sandboxes kept at least.
        #[arg(long, default_value_t = 0)]
        min: u32,
        /// Sandboxes (idle and claimed) at most.
        #[arg(long)]
        max: u32,
        /// `auto` (sized from demand) or an idle count.
        #[arg(long, default_value = "auto")]
        target: String,
        /// Memory limit, e.g. 512Mi (default: the template's).
        #[arg(long)]
        memory: Option<String>,
        /// CPU limit in cores, e.g. 1 or 0.5 (default: the template's).
        #[arg(long)]
        cpus: Option<String>,
        /// Process limit (default: the template's).
        #[arg(long)]
        pids: Option<u64>,
        /// Writable layer size, e.g. 1Gi (default: the template's).
        #[arg(long)]
        disk: Option<String>,
        /// Network of the pool's sandboxes: none or egress.
        #[arg(long, value_name = "none|egress")]
        network: Option<String>,
        /// Allow-list of the pool's sandboxes (repeatable; implies egress).
        #[arg(long = "allow", value_name = "CIDR|DOMAIN[:PORT]")]
        allow: Vec<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the pools.
    Ls {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show a pool and the arithmetic behind its target.
    Inspect {
        /// The pool's name.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Change a pool's min, max or target.
    Resize {
        /// The pool's name.
        name: String,
        /// New minimum (default: unchanged).
        #[arg(long)]
        min: Option<u32>,
        /// New maximum (default: unchanged).
        #[arg(long)]
        max: Option<u32>,
        /// New target: auto or an idle count (default: unchanged).
        #[arg(long)]
        target: Option<String>,
    },
    /// Remove a pool and its idle sandboxes.
    Rm {
        /// Pools to remove (at least one).
        #[arg(required = true)]
        names: Vec<String>,
    },
}
