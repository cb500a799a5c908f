//! `ember workspace` and `ember snapshot`.
use clap::Subcommand;

#[derive(Subcommand)]
pub enum WorkspaceCmd {
    /// Create a workspace with a size quota.
    Create {
        /// The workspace's name.
        name: String,
        /// Size (quota), e.g. 1Gi.
        #[arg(long, default_value = "1Gi")]
        size: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List the workspaces.
    Ls {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show one workspace.
    Inspect {
        /// The workspace's name.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Delete workspaces and their data (refused while a sandbox writes them).
    Rm {
        /// Workspaces to delete (at least one).
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Snapshot a workspace into the snapshot store; prints the snapshot id.
    Snapshot {
        /// The workspace to snapshot.
        name: String,
        /// Commit only while this sandbox holds the writer lease at --epoch.
        #[arg(long, requires = "epoch")]
        holder: Option<String>,
        /// Fencing epoch of the lease holder snapshotting (default: none, the workspace must be unleased).
        #[arg(long, requires = "holder")]
        epoch: Option<u64>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A new workspace from a snapshot (every chunk verified).
    Restore {
        /// The workspace snapshot's id.
        snapshot: String,
        /// Name of the new workspace (default: the snapshot's workspace).
        #[arg(long)]
        name: String,
        /// Size (quota), e.g. 1Gi (default: the snapshot's).
        #[arg(long)]
        size: Option<String>,
    },
    /// N new workspaces <prefix>-1..N from one snapshot.
    Fork {
        /// The workspace snapshot's id.
        snapshot: String,
        /// How many copies.
        #[arg(long)]
        count: u32,
        /// Names of the copies: PREFIX-1, PREFIX-2, ...
        #[arg(long)]
        prefix: String,
    },
}

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// List the workspace snapshots.
    Ls {
        /// Only this workspace's snapshots (default: all).
        #[arg(long, value_name = "NAME")]
        workspace: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show one workspace snapshot.
    Inspect {
        /// The snapshot's id.
        id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Delete workspace snapshots.
    Rm {
        /// Snapshots to delete (at least one).
        #[arg(required = true)]
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
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}
