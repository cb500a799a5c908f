//! `ember serve`: the daemon's flags, its cluster mode and egress networking.
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on; a non-loopback address needs --api-key.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Where records, layers, workspaces and snapshots live (docs/operations.md).
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
    /// native, crun and runc sandboxes at once. 16,384 from the default
    /// `--uid-base` end near 2.07·10⁹ (the last uid is 2³²-2): room for the
    /// 10,000 idle sandboxes one 24 GiB host holds.
    #[arg(long, default_value_t = 16_384)]
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
    /// The weight in contended CPU of the parent group of this daemon's
    /// native sandboxes, in v1 `cpu.shares` (2-262144; v2: its `cpu.weight` by
    /// runc's conversion): what all of them together weigh against the
    /// daemon's own threads and whatever else runs beside the group. Unset:
    /// the kernel's default (1024, v2 100). Lower puts the daemon's work
    /// (API calls, claims) ahead of the sandboxes' own on a saturated host,
    /// at their cost (docs/performance.md, "The control plane's weight").
    #[arg(long, value_parser = clap::value_parser!(u64).range(2..=262_144))]
    pub sandboxes_cpu_shares: Option<u64>,
    /// How often unreferenced snapshot chunks are swept (also about a minute
    /// after a delete, except on a cluster's nodes, which share the store);
    /// `off`: only by `ember snapshot gc`.
    #[arg(long, default_value = "1h")]
    pub snapshot_gc_interval: String,
    /// Workspace volumes kept made ahead (image, filesystem and mounts) for
    /// each size created lately, so that a create or a rebind's restore of
    /// that size is a rename (default 4 on a cluster node, else 0).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(0..=64))]
    pub workspace_spares: Option<u64>,
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
    /// The hash that names new snapshot chunks: `blake3`, or `sha256` as the
    /// builds before BLAKE3 wrote, whose manifests they can read. Use
    /// `sha256` while a cluster's nodes are upgraded one by one, then drop it.
    #[arg(long, value_name = "HASH", default_value = "blake3", value_parser = ["blake3", "sha256"])]
    pub snapshot_hash: String,
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
    /// Largest workspace a create, restore or fork may ask for (at most
    /// 8Ti, ext4's file-size limit on the host less headroom); a larger one is
    /// refused with WORKSPACE::INVALID_PARAMETER.
    #[arg(long, value_name = "SIZE", value_parser = parse_workspace_size, default_value = "8Ti")]
    pub max_workspace_size: u64,
    /// Disk space of the data dir's filesystem that new workspace volumes
    /// never take, left for the daemon's state and snapshots (default: 5 % of
    /// the filesystem, at most 1Gi); a create, restore or fork that would cut
    /// into it is refused with 507 WORKSPACE::NO_SPACE.
    #[arg(long, value_name = "SIZE", value_parser = crate::commands::parse_size)]
    pub disk_reserve: Option<u64>,
    /// Most bytes an image's layers may decompress to, summed (pulls and
    /// imports); past it the image is refused with IMAGE::TOO_LARGE.
    #[arg(long = "max-image-size", alias = "max-image-bytes", value_name = "SIZE",
          value_parser = crate::commands::parse_size, default_value = "8Gi")]
    pub max_image_bytes: u64,
    /// Largest image config blob (and JSON file of an imported OCI layout).
    #[arg(long = "max-image-config-size", alias = "max-image-config-bytes", value_name = "SIZE",
          value_parser = crate::commands::parse_size, default_value = "4Mi")]
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
    #[command(flatten)]
    pub observe: super::observe::ObserveArgs,
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
    /// How many dead nodes' rebind sandboxes this node restores and starts at
    /// once; it claims no more than that (docs/cluster.md).
    #[arg(long, value_name = "N", default_value_t = ember_cluster::node::REBINDS_AT_ONCE, requires = "cluster",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub rebinds_at_once: usize,
    /// How many standbys this node keeps at most for other nodes' rebind
    /// sandboxes: the launch of each sandbox this node would re-create
    /// first if its node died, done ahead, so that the rebind claims it
    /// rather than starting cold (docs/cluster.md). 0: none.
    #[arg(long, value_name = "N", default_value_t = ember_cluster::node::REBIND_STANDBYS, requires = "cluster",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=4096))]
    pub rebind_standbys: usize,
    /// The weight (v1 `cpu.shares`, as `--sandboxes-cpu-shares`) of this
    /// node's sandboxes while it re-creates a dead node's rebind sandboxes:
    /// its daemon's steps go first for those seconds, then the weight is
    /// set back (docs/cluster.md). Given the value of
    /// `--sandboxes-cpu-shares`: unchanged.
    #[arg(long, value_name = "SHARES", default_value_t = 128, requires = "cluster",
          value_parser = clap::value_parser!(u64).range(2..=262_144))]
    pub recovery_cpu_shares: u64,
    /// How long a call for a rebind sandbox that is being re-created
    /// elsewhere (or whose dead node's copy no survivor has claimed yet)
    /// waits for it before it answers 503 (`10s`, at most 60s; 0: at once).
    #[arg(long, value_name = "DURATION", default_value = "10s", requires = "cluster", value_parser = rebind_hold)]
    pub rebind_hold: std::time::Duration,
}

/// `--rebind-hold`: a held call keeps its connection, so a minute at most.
fn rebind_hold(s: &str) -> Result<std::time::Duration, String> {
    let d = crate::commands::duration_arg(s)?;
    match d <= std::time::Duration::from_secs(60) {
        true => Ok(d),
        false => Err(format!("{s}: at most 60s")),
    }
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

fn parse_workspace_size(s: &str) -> Result<u64, String> {
    let n = crate::commands::parse_size(s)?;
    if !(ember_workspace::MIN_SIZE..=ember_workspace::MAX_SIZE).contains(&n) {
        return Err(format!("{s} is outside {}..={} bytes", ember_workspace::MIN_SIZE, ember_workspace::MAX_SIZE));
    }
    Ok(n)
}
