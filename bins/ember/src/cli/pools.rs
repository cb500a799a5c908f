//! `ember pool`.
use clap::Subcommand;

#[derive(Subcommand)]
pub enum PoolCmd {
    /// Keep sandboxes of a template started ahead of demand.
    Create {
        #[arg(long)]
        template: String,
        /// Pool name (default: the template's).
        #[arg(long)]
        name: Option<String>,
        #[arg(long, default_value_t = 0)]
        min: u32,
        #[arg(long)]
        max: u32,
        /// `auto` (sized from demand) or an idle count.
        #[arg(long, default_value = "auto")]
        target: String,
        #[arg(long)]
        memory: Option<String>,
        #[arg(long)]
        cpus: Option<String>,
        #[arg(long)]
        pids: Option<u64>,
        #[arg(long)]
        disk: Option<String>,
        /// Network of the pool's sandboxes: none or egress.
        #[arg(long, value_name = "none|egress")]
        network: Option<String>,
        /// Allow-list of the pool's sandboxes (repeatable; implies egress).
        #[arg(long = "allow", value_name = "CIDR|DOMAIN[:PORT]")]
        allow: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Show a pool and the arithmetic behind its target.
    Inspect {
        name: String,
        #[arg(long)]
        json: bool,
    },
    Resize {
        name: String,
        #[arg(long)]
        min: Option<u32>,
        #[arg(long)]
        max: Option<u32>,
        #[arg(long)]
        target: Option<String>,
    },
    /// Remove a pool and its idle sandboxes.
    Rm { names: Vec<String> },
}
