//! `ember workspace` and `ember snapshot`.
use clap::Subcommand;

#[derive(Subcommand)]
pub enum WorkspaceCmd {
    /// Create a workspace with a size quota.
    Create {
        name: String,
        #[arg(long, default_value = "1Gi")]
        size: String,
        #[arg(long)]
        json: bool,
    },
    Ls {
        #[arg(long)]
        json: bool,
    },
    Inspect {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete workspaces and their data (refused while a sandbox writes them).
    Rm { names: Vec<String> },
    /// Snapshot a workspace into the snapshot store; prints the snapshot id.
    Snapshot {
        name: String,
        /// Commit only while this sandbox holds the writer lease at --epoch.
        #[arg(long, requires = "epoch")]
        holder: Option<String>,
        #[arg(long, requires = "holder")]
        epoch: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// A new workspace from a snapshot (every chunk verified).
    Restore {
        snapshot: String,
        #[arg(long)]
        name: String,
        #[arg(long)]
        size: Option<String>,
    },
    /// N new workspaces <prefix>-1..N from one snapshot.
    Fork {
        snapshot: String,
        #[arg(long)]
        count: u32,
        #[arg(long)]
        prefix: String,
    },
}

#[derive(Subcommand)]
pub enum SnapshotCmd {
    Ls {
        #[arg(long)]
        workspace: Option<String>,
        #[arg(long)]
        json: bool,
    },
    Inspect {
        id: String,
        #[arg(long)]
        json: bool,
    },
    Rm {
        ids: Vec<String>,
    },
    /// Reclaim storage: delete every chunk that no snapshot (workspace or
    /// sandbox) references any more. The daemon also does this on a schedule
    /// (`serve --snapshot-gc-interval`) and soon after a delete. Waits for
    /// snapshots being written; they wait for it.
    Gc {
        /// Keep unreferenced chunks younger than this (e.g. 0s, 10m; the
        /// daemon's default is 10m).
        #[arg(long)]
        min_age: Option<String>,
        #[arg(long)]
        json: bool,
    },
}
