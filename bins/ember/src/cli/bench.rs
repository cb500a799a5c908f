//! `ember bench`.
use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Cold pull+unpack of a >= 100 MB image the bench builds and serves from
    /// a local registry, and create-to-ready from the cached image beside the
    /// `host` template. The daemon needs --insecure-registry 127.0.0.1:PORT.
    Image {
        /// Measured runs.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Image size, e.g. 128Mi (at least 100Mi).
        #[arg(long, default_value = "128Mi", value_parser = crate::commands::parse_size)]
        size: u64,
        /// The old spelling of --size, in MiB (hidden).
        #[arg(long, hide = true, conflicts_with = "size")]
        size_mib: Option<u64>,
        /// Local registry port (the daemon must list it as insecure).
        #[arg(long, default_value_t = 5099)]
        registry_port: u16,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A workspace's mount round trip (loop mount, bind, two unmounts) made
    /// with syscalls as ember does, beside mount(8)/umount(8) in the same
    /// run, at growing sizes of the host's mount table. Local, in this
    /// process (no daemon needed); root.
    Mounts {
        /// Round trips per figure, each way.
        #[arg(long, default_value_t = 100)]
        runs: usize,
        /// Extra mounts on the host for each figure (small tmpfs mounts).
        #[arg(long, value_delimiter = ',', default_value = "0,1000,3000")]
        tables: Vec<usize>,
        /// Where the image, the mount points and the fill are made.
        #[arg(long, default_value = "/var/tmp/ember-bench-mounts")]
        work_dir: std::path::PathBuf,
    },
    /// Workspace snapshots: full, 1% incremental, restore and fork of a tree
    /// the bench builds, beside `tar | zstd -T0 -3` of the same directory. Local, in
    /// this process (no daemon needed).
    Snapshot {
        /// Size of the generated tree, e.g. 500M or 1Gi.
        #[arg(long, default_value = "500M", value_parser = crate::commands::parse_size)]
        size: u64,
        /// The old spelling of --size, in MB (hidden).
        #[arg(long, hide = true, conflicts_with = "size")]
        size_mb: Option<u64>,
        /// Forks of the restored tree.
        #[arg(long, default_value_t = 10)]
        forks: usize,
        /// Where the tree and the local store are made.
        #[arg(long, default_value = "/var/tmp/ember-bench-snapshot")]
        work_dir: std::path::PathBuf,
        /// s3://bucket[/prefix] (an existing bucket; endpoint and credentials
        /// as for `serve --snapshot-store`) instead of a local store.
        #[arg(long)]
        store: Option<String>,
    },
    /// Per available runtime class (native, runsc, crun, runc), in one run:
    /// cold create p50/p99, warm claim p50/p99 (a pool of the class), remove,
    /// exec round trip, 100k stat, idle memory, and the ratio to native.
    Classes {
        /// Measured runs.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Idle sandboxes per class for the memory-overhead row.
        #[arg(long, default_value_t = 8)]
        idle: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Cold create-to-ready and exec round trip, beside crun in the same run,
    /// both timed by this client up to the agent's answer to GET /ping; crun
    /// runs ember's own bundle, rootfs and agent (scripts/bench-setup.sh
    /// installs it).
    Create {
        /// Measured runs.
        #[arg(long, default_value_t = 100)]
        runs: usize,
        /// Skip the crun reference (it needs crun: scripts/bench-setup.sh).
        #[arg(long)]
        no_crun: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Warm-pool claims: server and client latency, bursts, time to first
    /// output and claims/s, beside cold creates, on a pool of its own.
    Claim {
        /// Sequential creates per figure (warm claims, claim + echo, cold reference).
        #[arg(long, default_value_t = 200)]
        runs: usize,
        /// Claims fired at once in each burst.
        #[arg(long, default_value_t = 100)]
        concurrency: usize,
        /// Bursts of --concurrency claims.
        #[arg(long, default_value_t = 3)]
        bursts: usize,
        /// Claims in the claims-per-second figure; the pool is filled to this
        /// many idle first (0 skips the figure).
        #[arg(long, default_value_t = 1000)]
        sustain: usize,
        /// Concurrent tasks claiming in the claims-per-second figure.
        #[arg(long, default_value_t = 16)]
        tasks: usize,
        /// Golden pools instead: claim -> first stdout from a pool started
        /// from sandbox snapshot SNAP (`new`: one the bench primes with
        /// --primed of files), beside a plain pool and a cold restore of the
        /// snapshot, and both pools' refill cost (--runs rounds).
        #[arg(long, value_name = "SNAP")]
        from_snapshot: Option<String>,
        /// With --from-snapshot new: files the snapshotted sandbox is primed with, e.g. 64Mi.
        #[arg(long, default_value = "64Mi", value_parser = crate::commands::parse_size, requires = "from_snapshot")]
        primed: u64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Task throughput, submit→start latency, and MTTD after a worker kill.
    Tasks(crate::bench::tasks::TasksArgs),
    /// Warm claims on a cluster through every node's URL, beside the same
    /// claims through one node (p50/p99 and claims/s), on a cluster pool of its own.
    Cluster(crate::bench::cluster::ClusterArgs),
    /// Claim -> Ready through the Kubernetes API (a SandboxClaim watched to
    /// Ready, answered by a running `ember operator`) beside the same claims
    /// through ember's API, from one SandboxPool (p50/p99 side by side).
    K8s(crate::bench::k8s::K8sArgs),
    /// Warm claims with and without egress networking, and the network slot
    /// refill rate (pools of its own; the daemon needs egress networking on).
    Network {
        /// Claims per figure.
        #[arg(long, default_value_t = 50)]
        runs: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Idle auto-pause: an exec on an auto-paused sandbox (thaw + command)
    /// beside the same exec on a running one, p50/p99, in the same run.
    Autopause {
        /// Rounds: wait for the pause, then one exec on each sandbox.
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Fill a pool with idle sandboxes and report what each costs the host
    /// (the daemon must run on this host).
    Density {
        /// Sandboxes to start.
        #[arg(long, default_value_t = 1000)]
        count: u32,
        /// Stop filling after this long, e.g. 10m (a plain number is seconds).
        #[arg(long, default_value = "10m", value_parser = crate::commands::duration_arg)]
        timeout: std::time::Duration,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}
