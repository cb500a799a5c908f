//! Command-line grammar.
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

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
        id: String,
        /// Print one line and exit.
        #[arg(long)]
        no_stream: bool,
        /// One JSON object per reading (the API's figures plus cpuPercent).
        #[arg(long)]
        json: bool,
    },
    /// Copy a file into or out of a sandbox (`ID:/path` names the sandbox side).
    Cp { src: String, dst: String },
    /// Create a sandbox, run one command in it, remove it.
    Run {
        #[command(flatten)]
        create: CreateArgs,
        #[command(flatten)]
        exec: ExecOpts,
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
}

#[derive(Subcommand)]
pub enum RuntimeCmd {
    /// Each runtime class, its kernel boundary and whether it is available here.
    Ls {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on; a non-loopback address needs --api-key.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    #[arg(long, env = "EMBER_DATA_DIR", default_value = "/var/lib/ember")]
    pub data_dir: PathBuf,
    /// The static agent binary (default: `ember-agent` next to this executable).
    #[arg(long, env = "EMBER_AGENT_BIN")]
    pub agent: Option<PathBuf>,
    /// First host uid/gid of the id ranges: the storage range (owner of
    /// layers and workspaces on disk; runsc sandboxes), then one range of
    /// 65,536 ids per native, crun or runc sandbox.
    #[arg(long, default_value_t = 1_000_000_000)]
    pub uid_base: u32,
    /// How many per-sandbox id ranges follow the storage range: the cap on
    /// native, crun and runc sandboxes at once.
    #[arg(long, default_value_t = 4096)]
    pub id_ranges: u32,
    /// How long ended sandboxes stay listed.
    #[arg(long, default_value = "10m")]
    pub retention: String,
    /// How long a new or restored sandbox's agent gets to answer before the
    /// create fails. Raise it where sandboxes start slowly (gVisor under
    /// software emulation, as in scripts/cgroup-v2-guest.sh).
    #[arg(long, env = "EMBER_READY_TIMEOUT", default_value = "10s")]
    pub ready_timeout: String,
    /// Longest TTL a sandbox may ask for; also the TTL of a sandbox created
    /// without a timeout (without this flag, such a sandbox lives until
    /// removed). Timeouts are capped at 30 days in any case.
    #[arg(long)]
    pub max_ttl: Option<String>,
    /// Parent cgroup of this daemon's sandboxes; daemons sharing a host need
    /// different ones.
    #[arg(long, default_value = "ember")]
    pub cgroup_parent: String,
    /// How often unreferenced snapshot chunks are swept (also about a minute
    /// after a delete); `off`: only by `ember snapshot gc`.
    #[arg(long, default_value = "1h")]
    pub snapshot_gc_interval: String,
    /// Where workspace snapshots go: a directory (default <data-dir>/snapshots)
    /// or s3://bucket[/prefix] (endpoint in EMBER_S3_ENDPOINT, credentials in
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), or `nats`: the cluster's
    /// JetStream object store, the default with --cluster (which then needs
    /// --snapshot-key-file, the same on every node).
    #[arg(long)]
    pub snapshot_store: Option<String>,
    /// The key that signs and verifies snapshot manifests: 64 hex digits in a
    /// file only its owner can read (default <data-dir>/snapshot.key, made on
    /// first start). Daemons sharing a snapshot store share this file.
    #[arg(long, value_name = "FILE")]
    pub snapshot_key_file: Option<PathBuf>,
    /// Also accept snapshot manifests without a MAC (written by builds before
    /// manifests were authenticated), to restore and snapshot them again.
    /// Anyone who can write the store can then forge one: migrate, then drop it.
    #[arg(long)]
    pub snapshot_accept_unsigned: bool,
    /// host:port put in endpoint answers (default: the request's Host header).
    #[arg(long)]
    pub public_host: Option<String>,
    /// A host name (no port) the API answers to besides IP addresses and
    /// `localhost` (repeatable); requests naming any other Host get a 421,
    /// against DNS rebinding. `--public-host`'s name is added.
    #[arg(long, value_name = "NAME")]
    pub allowed_host: Vec<String>,
    /// Give each sandbox port a browser origin of its own: a request whose
    /// Host is `<port>-<sandbox id>.DOMAIN` goes whole to that port (never to
    /// the API), and endpoint answers name it for every port but execd's and
    /// the egress port's. DOMAIN and its names must resolve to this server
    /// (a wildcard DNS record, e.g. `*.sandbox.example`).
    #[arg(long, value_name = "DOMAIN")]
    pub sandbox_domain: Option<String>,
    /// A registry (host:port) to reach over plain http (repeatable).
    #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
    pub insecure_registry: Vec<String>,
    /// Most bytes an image's layers may decompress to, summed (pulls and
    /// imports); past it the image is refused with IMAGE::TOO_LARGE.
    #[arg(long, value_name = "BYTES", default_value_t = ember_image::DEFAULT_MAX_UNPACKED_BYTES)]
    pub max_image_bytes: u64,
    /// Largest image config blob (and JSON file of an imported OCI layout).
    #[arg(long, value_name = "BYTES", default_value_t = ember_image::DEFAULT_MAX_CONFIG_BYTES)]
    pub max_image_config_bytes: u64,
    /// A host directory that `host` volumes may bind (it and everything under
    /// it); repeatable. Without it, host volumes are refused.
    #[arg(long, value_name = "DIR")]
    pub allow_host_path: Vec<PathBuf>,
    #[command(flatten)]
    pub tasks: crate::commands::task::TaskFlags,
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Cluster mode of `ember serve` (docs/cluster.md). Without --cluster the
/// daemon is one node on its own and needs no NATS.
#[derive(Args, Clone, Default)]
pub struct ClusterArgs {
    /// The cluster's NATS servers, comma-separated
    /// (nats://a:4222,nats://b:4222,nats://c:4222): this daemon becomes a
    /// node of that cluster.
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    pub cluster: Vec<String>,
    /// This node's name, unique in the cluster (letters, digits, - and _).
    #[arg(long, value_name = "NAME", requires = "cluster")]
    pub node: Option<String>,
    /// http://host:port the other nodes reach this node's API at (default:
    /// the address it listens on).
    #[arg(long, value_name = "URL", requires = "cluster")]
    pub advertise: Option<String>,
    /// Run no sandboxes here: only route calls to the nodes that do.
    #[arg(long, requires = "cluster")]
    pub api_only: bool,
    /// Checkpoint the workspaces of this node's rebind sandboxes
    /// (`extensions.restartPolicy: rebind`) this often (`10s`); 0: never.
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = crate::commands::parse_duration)]
    pub checkpoint_every: std::time::Duration,
}

/// Egress networking of `ember serve`.
#[derive(Args, Clone)]
pub struct NetArgs {
    /// Sandbox address range (/16../28), one /30 per sandbox with egress;
    /// `none` turns egress networking off. Default 10.203.0.0/16 (off, with a
    /// warning, when nft or ip is missing).
    #[arg(long)]
    pub network_range: Option<String>,
    /// Names the nftables table and the slots' namespaces and veths; daemons
    /// sharing a host need different tags.
    #[arg(long, default_value = "ember")]
    pub network_tag: String,
    /// Where the sandboxes' resolver forwards allowed queries, IP[:PORT]
    /// (default: the first IPv4 nameserver of /etc/resolv.conf).
    #[arg(long)]
    pub dns_upstream: Option<String>,
    /// nflog group of the denied-flow log (one daemon per group).
    #[arg(long, default_value_t = 4721)]
    pub nflog_group: u16,
    /// Network slots kept ready ahead of creates with egress.
    #[arg(long, default_value_t = 4)]
    pub network_slots: usize,
}

#[derive(Args, Clone, Default)]
pub struct CreateArgs {
    #[arg(long)]
    pub template: Option<String>,
    /// Restore a sandbox snapshot (`ember sandbox snapshot`): its rootfs
    /// changes, workspaces (as new copies), template and resources.
    #[arg(long, conflicts_with_all = ["template", "image"])]
    pub snapshot: Option<String>,
    #[arg(long)]
    pub image: Option<String>,
    /// Memory limit, e.g. 512Mi.
    #[arg(long)]
    pub memory: Option<String>,
    /// CPU limit in cores, e.g. 1 or 0.5.
    #[arg(long)]
    pub cpus: Option<String>,
    #[arg(long)]
    pub pids: Option<u64>,
    /// Size of the writable layer, e.g. 1Gi.
    #[arg(long)]
    pub disk: Option<String>,
    /// Time to live, e.g. 10m (default: until removed).
    #[arg(long)]
    pub ttl: Option<String>,
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
    /// Extra environment for this command, K=V (repeatable).
    #[arg(long = "exec-env", value_name = "K=V")]
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
    pub id: String,
    #[command(flatten)]
    pub opts: ExecOpts,
    #[command(flatten)]
    pub io: InteractiveOpts,
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
        #[arg(long)]
        json: bool,
    },
    /// List sandboxes.
    Ls {
        /// Only sandboxes in this state (repeatable).
        #[arg(long)]
        state: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Show a sandbox, with the boundary actually enforced on it.
    Inspect {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove sandboxes.
    Rm { ids: Vec<String> },
    /// Freeze a Running sandbox.
    Pause { id: String },
    /// Save a Running gVisor (runsc) sandbox's processes and memory to disk and
    /// stop them; `ember sandbox resume ID` restores it.
    Checkpoint { id: String },
    /// Thaw a paused sandbox, or restore a checkpointed one.
    Resume { id: String },
    /// Show a sandbox's network policy, or replace it while it runs.
    Policy {
        id: String,
        /// Replace the policy with this allow-list (repeatable).
        #[arg(long = "allow", value_name = "CIDR|DOMAIN[:PORT]")]
        allow: Vec<String>,
        /// Replace the policy with open egress (no allow-list).
        #[arg(long, conflicts_with = "allow")]
        open: bool,
        #[arg(long)]
        json: bool,
    },
    /// Blocked connection attempts and DNS queries of a sandbox.
    Events {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Snapshot a running sandbox (its rootfs changes and read-write
    /// workspaces) and print the snapshot id; `ember sandbox create
    /// --snapshot ID` restores it.
    Snapshot {
        id: String,
        #[arg(long)]
        name: Option<String>,
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
        #[arg(long)]
        json: bool,
    },
    /// Show a sandbox snapshot.
    Inspect { id: String },
    /// Remove sandbox snapshots (their chunks go at the next `ember snapshot gc`,
    /// which the daemon also runs on a schedule and soon after a delete).
    Rm { ids: Vec<String> },
}

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Cold pull+unpack of a >= 100 MB image the bench builds and serves from
    /// a local registry, and create-to-ready from the cached image beside the
    /// `host` template. The daemon needs --insecure-registry 127.0.0.1:PORT.
    Image {
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Image size in MiB.
        #[arg(long, default_value_t = 128)]
        size_mib: u64,
        /// Local registry port (the daemon must list it as insecure).
        #[arg(long, default_value_t = 5099)]
        registry_port: u16,
        #[arg(long)]
        json: bool,
    },
    /// Workspace snapshots: full, 1% incremental, restore and fork of a tree
    /// the bench builds, beside `tar | zstd -T0 -3` of the same directory. Local, in
    /// this process (no daemon needed).
    Snapshot {
        /// Size of the generated tree in MB.
        #[arg(long, default_value_t = 500)]
        size_mb: u64,
        #[arg(long, default_value_t = 10)]
        forks: usize,
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
        #[arg(long, default_value_t = 20)]
        runs: usize,
        /// Idle sandboxes per class for the memory-overhead row.
        #[arg(long, default_value_t = 8)]
        idle: usize,
        #[arg(long)]
        json: bool,
    },
    /// Cold create-to-ready and exec round trip, beside crun in the same run,
    /// both timed by this client up to the agent's answer to GET /ping; crun
    /// runs ember's own bundle, rootfs and agent (scripts/bench-setup.sh
    /// installs it).
    Create {
        #[arg(long, default_value_t = 100)]
        runs: usize,
        /// Skip the crun reference (it needs crun: scripts/bench-setup.sh).
        #[arg(long)]
        no_crun: bool,
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
        #[arg(long)]
        json: bool,
    },
    /// Fill a pool with idle sandboxes and report what each costs the host
    /// (the daemon must run on this host).
    Density {
        #[arg(long, default_value_t = 1000)]
        count: u32,
        /// Stop filling after this many seconds.
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        #[arg(long)]
        json: bool,
    },
}

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

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Pull an image from its registry (shows progress; `--json` for scripts).
    Pull {
        reference: String,
        /// Registry user (basic auth); the password comes from EMBER_REGISTRY_PASSWORD.
        #[arg(long)]
        username: Option<String>,
        #[arg(long, env = "EMBER_REGISTRY_PASSWORD", hide_env_values = true)]
        password: Option<String>,
        /// Bearer token instead of a user and password.
        #[arg(long, env = "EMBER_REGISTRY_TOKEN", hide_env_values = true)]
        token: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Import a root filesystem dir, a tar, or an OCI image layout (dir or tar).
    Import {
        path: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List images and the layers on this node.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Forget images (their layers go with the next prune).
    Rm { names: Vec<String> },
    /// Remove layers that no image and no running sandbox uses.
    Prune {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant, reason = "parsed once per process")]
pub enum TemplateCmd {
    /// Create a template (pulls its image first).
    Create {
        name: String,
        #[arg(long)]
        image: Option<String>,
        #[arg(long)]
        memory: Option<String>,
        #[arg(long)]
        cpus: Option<String>,
        #[arg(long)]
        pids: Option<u64>,
        #[arg(long)]
        disk: Option<String>,
        /// Runtime class (only "native" is installed).
        #[arg(long)]
        runtime: Option<String>,
        /// Network mode (only "none": loopback only).
        #[arg(long)]
        network: Option<String>,
        /// user, uid, user:group or uid:gid, looked up in the image.
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        workdir: Option<String>,
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        /// Entrypoint argv as JSON, e.g. '["sleep","inf"]'; '[]' runs none.
        #[arg(long)]
        entrypoint: Option<String>,
        #[arg(long)]
        json: bool,
    },
    Ls {
        #[arg(long)]
        json: bool,
    },
    Inspect {
        name: String,
    },
    Rm {
        names: Vec<String>,
    },
}
