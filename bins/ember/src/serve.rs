//! `ember serve`: builds the runtime, engine and API from flags and serves until
//! SIGINT/SIGTERM. Sandboxes keep running across a daemon restart and are
//! re-adopted by the next `ember serve` on the same data dir.
use crate::cli::ServeArgs;
use crate::commands::parse_duration;
use anyhow::{bail, Context};
use ember_api::{ApiConfig, ApiState};
use ember_engine::{Engine, EngineConfig};
use ember_runtime::native::{NativeConfig, NativeRuntime};
use ember_runtime::oci::{OciClass, OciConfig, OciRuntime};
use ember_runtime::Runtimes;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub async fn run(mut args: ServeArgs, api_key: Option<String>) -> anyhow::Result<i32> {
    crate::logging::init(&args.observe)?;
    // Paths reach OCI bundles, whose runtimes resolve a relative one against
    // the bundle's dir: made absolute against the daemon's own.
    args.data_dir = std::path::absolute(&args.data_dir).context("--data-dir")?;

    // Flags that refuse the start outright are checked before the data dir is touched.
    let addr: SocketAddr =
        args.listen.parse().with_context(|| format!("--listen {:?} is not host:port", args.listen))?;
    if !addr.ip().is_loopback() && api_key.as_deref().is_none_or(str::is_empty) {
        bail!("listening on non-loopback {addr} needs an API key (--api-key or EMBER_API_KEY)");
    }
    let retention = parse_duration(&args.retention).context("--retention")?;
    let max_ttl = args.max_ttl.as_deref().map(parse_duration).transpose().context("--max-ttl")?;
    let ready_timeout = parse_duration(&args.ready_timeout).context("--ready-timeout")?;
    if ready_timeout.is_zero() {
        bail!("--ready-timeout must be more than 0");
    }
    args.tasks.config()?;
    let sandbox_domain = args
        .sandbox_domain
        .as_deref()
        .map(|d| {
            ember_api::origin::normalize_domain(d).with_context(|| format!("--sandbox-domain {d:?} is not a DNS name"))
        })
        .transpose()?;
    // Then, before anything reads or changes the data dir's state: one daemon per data dir.
    let _lock = crate::datadir::lock(&args.data_dir)?;
    // runsc sandboxes run in the storage range, native, crun and runc ones in the ranges after it.
    crate::datadir::check_traversable(&args.data_dir, args.uid_base)?;
    crate::datadir::check_traversable(&args.data_dir, args.uid_base.saturating_add(ember_runtime::idrange::RANGE))?;
    ember_runtime::become_subreaper().context("becoming the subreaper of the OCI runtimes' processes")?;
    // A live sandbox holds one descriptor of the daemon's (its pidfd).
    match ember_runtime::raise_open_files() {
        Ok(n) => tracing::info!(open_files = n, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "the open-file limit could not be raised"),
    }
    let agent = match args.agent.clone() {
        Some(p) => std::fs::canonicalize(&p).with_context(|| format!("--agent {}", p.display()))?,
        None => default_agent()?,
    };

    let cgroups: Arc<dyn ember_cgroups::Cgroups> =
        ember_cgroups::detect("/sys/fs/cgroup".as_ref(), &args.cgroup_parent).context("cgroups")?.into();
    // Set every start, unset included: a node that died mid-rebind left
    // its recovery weight behind (`ember_cluster::node::RecoveryWeight`).
    cgroups.set_group_cpu_shares(args.sandboxes_cpu_shares).context("--sandboxes-cpu-shares")?;
    let native = NativeConfig {
        data_dir: args.data_dir.clone(),
        agent_path: agent.clone(),
        uid_base: args.uid_base,
        id_ranges: args.id_ranges,
        ready_timeout,
    };
    let runtime = Arc::new(NativeRuntime::new(native, cgroups.clone()).context("native runtime")?);
    let recovery =
        recovery_weight(runtime.clone(), cgroups, args.sandboxes_cpu_shares, args.cluster.recovery_cpu_shares);
    let images = ember_image::ImageStore::open(ember_image::StoreConfig {
        root: ember_engine::templates::images_dir(&args.data_dir),
        uid_base: args.uid_base,
        insecure_registries: args.insecure_registry.clone(),
        max_unpacked_bytes: args.max_image_bytes,
        max_config_bytes: args.max_image_config_bytes,
    })
    .context("image store")?;
    let runtimes = runtimes(runtime, &args, &agent, ready_timeout);
    let network = crate::netsetup::open(&args.net)?;
    let cfg = EngineConfig {
        data_dir: args.data_dir.clone(),
        retention,
        max_ttl,
        allowed_host_paths: allowed_host_paths(&args.allow_host_path)?,
        snapshot_store: cluster_snapshot_store(&args).await?,
        snapshot_key_file: args.snapshot_key_file.clone(),
        snapshot_accept_unsigned: args.snapshot_accept_unsigned,
        snapshot_hash: match args.snapshot_hash.as_str() {
            "sha256" => ember_snapshot::ChunkHash::Sha256,
            _ => ember_snapshot::ChunkHash::Blake3,
        },
        snapshot_gc_interval: match args.snapshot_gc_interval.as_str() {
            "off" => None,
            every => Some(parse_duration(every).context("--snapshot-gc-interval")?).filter(|d| !d.is_zero()),
        },
        // A cluster's store is shared: its sweeps follow the interval only.
        snapshot_gc_after_delete: args.cluster.cluster.is_empty(),
        // A cluster node restores dead nodes' workspaces on its rebinds' path.
        workspace_spares: args
            .workspace_spares
            .map_or(if args.cluster.cluster.is_empty() { 0 } else { 4 }, |n| n as usize),
        workspace_limits: ember_workspace::Limits { max_size: args.max_workspace_size, reserve: args.disk_reserve },
    };
    let engine = Engine::start_networked(cfg, runtimes, Arc::new(images), network).await.context("engine")?;
    let (tasks, queue) = task_queue(&args.cluster, args.tasks.config()?).await?;
    engine.start_tasks_on(tasks, queue).context("tasks")?;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("bind {addr}"))?;
    let local = listener.local_addr()?;
    tracing::info!(%local, data_dir = %args.data_dir.display(), agent = %agent.display(), "ember serving");
    // One line on stdout so scripts (and tests binding port 0) learn the address.
    println!("ember listening on http://{local}");
    let tenants = engine.tenants();
    let engine: Arc<dyn ember_engine::ControlPlane> = Arc::new(engine);
    let engine = cluster_plane(&args.cluster, engine, local, api_key.clone(), &tenants, recovery).await?;
    let state = ApiState {
        // The API sees the engine only through the seam.
        engine,
        tenants,
        cfg: Arc::new(ApiConfig {
            api_key: api_key.filter(|k| !k.is_empty()),
            allowed_hosts: args.allowed_host,
            public_host: args.public_host,
            sandbox_domain,
            ui: args.observe.ui.then(|| ember_api::ui::UiConfig::new(args.observe.ui_reports.clone())),
        }),
    };
    ember_api::serve(listener, state, shutdown_signal()).await.context("serve")?;
    tracing::info!("ember stopped; sandboxes keep running and are re-adopted on the next start");
    crate::logging::flush();
    Ok(0)
}

/// The task queue: the embedded journal (`None`), or with --cluster the
/// cluster's `JetStreamQueue`, whose workers are named after this node (an
/// attempt's worker names the node that holds its log). An API-only node
/// runs no workers.
async fn task_queue(
    c: &crate::cli::ClusterArgs,
    mut cfg: ember_engine::tasks::TaskConfig,
) -> anyhow::Result<(ember_engine::tasks::TaskConfig, Option<Arc<dyn ember_queue::TaskQueue>>)> {
    if c.cluster.is_empty() {
        return Ok((cfg, None));
    }
    let Some(name) = c.node.clone() else { bail!("--cluster needs --node NAME") };
    cfg.node = name;
    if c.api_only {
        cfg.workers = 0;
    }
    let q = &cfg.queue;
    if q.tier_caps.iter().any(Option::is_some) || q.tenant_cap.is_some() || !q.tenant_caps.is_empty() {
        bail!("--task-cap and --task-tenant-cap are not supported with --cluster yet");
    }
    let mut js = ember_cluster::JetStreamConfig::new(c.cluster.clone());
    js.ack_wait = cfg.lease;
    let queue = cfg.queue.clone();
    // Opening connects and may wait through an election: off the async workers.
    let q = tokio::task::spawn_blocking(move || {
        ember_cluster::JetStreamQueue::open(js, queue, ember_queue::system_clock())
    })
    .await
    .context("opening the cluster's task queue")?
    .context("--cluster: opening the cluster's task queue")?;
    Ok((cfg, Some(Arc::new(q))))
}

/// With --cluster: this node joins the cluster, its tenants (keys, owner
/// entries, tokens) and their sandbox quotas become the cluster's, and the API gets the plane that routes between
/// nodes; else the engine itself.
async fn cluster_plane(
    c: &crate::cli::ClusterArgs,
    engine: Arc<dyn ember_engine::ControlPlane>,
    local: SocketAddr,
    api_key: Option<String>,
    tenants: &Arc<ember_engine::Tenants>,
    recovery: ember_cluster::node::RecoveryWeight,
) -> anyhow::Result<Arc<dyn ember_engine::ControlPlane>> {
    if c.cluster.is_empty() {
        return Ok(engine);
    }
    let Some(name) = c.node.clone() else { bail!("--cluster needs --node NAME") };
    let cfg = ember_cluster::NodeConfig {
        servers: c.cluster.clone(),
        name,
        advertise: c.advertise.clone().unwrap_or_else(|| format!("http://{local}")),
        api_only: c.api_only,
        api_key: api_key.filter(|k| !k.is_empty()),
        prefix: "ember".into(),
        checkpoint_every: c.checkpoint_every,
        rebinds_at_once: c.rebinds_at_once,
        rebind_standbys: c.rebind_standbys,
        rebind_hold: c.rebind_hold,
        recovery: Some(recovery),
    };
    tracing::info!(node = %cfg.name, advertise = %cfg.advertise, api_only = cfg.api_only, "joining the cluster");
    let plane = ember_cluster::node::join(cfg, engine).await.context("--cluster")?;
    // Tenants, keys, owners and tokens are the cluster's, read whole before serving.
    ember_cluster::node::tenants::share_tenants(&plane, tenants.clone()).await.context("--cluster: tenants")?;
    // A tenant's running sandboxes, memory and cpu are counted cluster-wide.
    ember_cluster::node::quota::share_quotas(&plane, tenants.clone()).await.context("--cluster: tenant quotas")?;
    Ok(plane)
}

/// The native sandboxes' group at `rebinding` shares while this node
/// re-creates a dead node's sandboxes, at `normal` (`None`: the kernel's
/// default) once the last has ended; the sandboxes launched meanwhile for
/// someone waiting keep their launch's weight until then
/// ([`NativeRuntime::recovering`]).
fn recovery_weight(
    native: Arc<NativeRuntime>,
    cgroups: Arc<dyn ember_cgroups::Cgroups>,
    normal: Option<u64>,
    rebinding: u64,
) -> ember_cluster::node::RecoveryWeight {
    ember_cluster::node::RecoveryWeight(Arc::new(move |on| {
        native.recovering(on);
        let shares = if on { Some(rebinding) } else { normal };
        match cgroups.set_group_cpu_shares(shares) {
            Ok(()) => tracing::debug!(rebinding = on, ?shares, "the sandboxes' CPU weight"),
            Err(e) => tracing::warn!(rebinding = on, error = %e, "setting the sandboxes' CPU weight"),
        }
    }))
}

/// The runtime classes of this daemon: native, and each OCI class whose
/// binary runs here (the others are listed as unavailable, with the reason).
fn runtimes(native: Arc<NativeRuntime>, args: &ServeArgs, agent: &std::path::Path, ready: Duration) -> Runtimes {
    let ranges = native.id_ranges();
    let mut rts = Runtimes::new(native, "ember's own namespaces, cgroups, seccomp and overlay rootfs");
    for class in OciClass::ALL {
        let boundary = class.kernel_boundary();
        let made = class.detect().and_then(|binary| {
            let group = format!("{}-{}", args.cgroup_parent, class.name());
            let cgroups = ember_cgroups::detect("/sys/fs/cgroup".as_ref(), &group).map_err(|e| e.to_string())?;
            let cfg = OciConfig {
                class,
                binary: binary.clone(),
                data_dir: args.data_dir.clone(),
                agent_path: agent.to_path_buf(),
                uid_base: args.uid_base,
                ranges: ranges.clone(),
                cgroup_group: group,
                ready_timeout: ready,
            };
            let rt = OciRuntime::new(cfg, Arc::from(cgroups)).map_err(|e| format!("{:#}", anyhow::Error::new(e)))?;
            Ok((rt, binary))
        });
        match made {
            Ok((rt, binary)) => rts.add(Arc::new(rt), boundary, format!("OCI runtime {}", binary.display())),
            Err(why) => {
                tracing::info!(class = class.name(), why = %why, "runtime class unavailable");
                rts.unavailable(class.name(), boundary, why)
            }
        }
    }
    rts.unavailable("firecracker", "microVM (guest kernel under KVM)", ember_runtime::microvm_unavailable_reason());
    rts
}

/// `--allow-host-path` values, canonical (so a symlink cannot widen them).
fn allowed_host_paths(raw: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    raw.iter().map(|p| p.canonicalize().with_context(|| format!("--allow-host-path {}", p.display()))).collect()
}

pub(crate) fn default_agent() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the ember executable")?;
    let dir = exe.parent().context("executable has no directory")?;
    for cand in [dir.join("ember-agent-static"), dir.join("ember-agent")] {
        if cand.exists() {
            return Ok(cand);
        }
    }
    bail!("no ember-agent next to {}; build it with scripts/build-agent.sh or pass --agent", exe.display())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// `--snapshot-store` of a cluster node: by default (or `nats`) the
/// cluster's JetStream object store, bucket `ember_snapshots`, so a snapshot
/// taken on one node restores on any other; a directory or `s3://...` as
/// without `--cluster`. Nodes sharing a store must share the manifest key:
/// without `--snapshot-key-file` each would sign with a key of its own and
/// refuse the others' snapshots as tampered, so the start is refused.
async fn cluster_snapshot_store(args: &ServeArgs) -> anyhow::Result<ember_engine::SnapshotStoreConfig> {
    let flag = args.snapshot_store.as_deref();
    let servers = &args.cluster.cluster;
    if servers.is_empty() || flag.is_some_and(|f| f != "nats") {
        if flag == Some("nats") {
            bail!("--snapshot-store nats needs --cluster");
        }
        return snapshot_store(flag, &args.data_dir);
    }
    if args.snapshot_key_file.is_none() {
        bail!(
            "--cluster keeps snapshots in the cluster's object store: every node needs the same \
             --snapshot-key-file (64 hex digits, mode 0600), or give --snapshot-store DIR|s3://..."
        );
    }
    let cfg = ember_cluster::NatsStoreConfig::new(servers.clone());
    let name = format!("nats bucket {}", cfg.bucket);
    // Connecting may wait through an election: off the async workers.
    let bucket = tokio::task::spawn_blocking(move || ember_cluster::NatsBucket::connect(cfg))
        .await
        .context("opening the cluster's snapshot store")?
        .context("--cluster: opening the cluster's snapshot store")?;
    let open = Arc::new(move |key| Ok(Arc::new(bucket.store(key)) as Arc<dyn ember_snapshot::ObjectStore>));
    Ok(ember_engine::SnapshotStoreConfig::Opener(ember_engine::StoreOpener { name, open }))
}

/// `--snapshot-store`: a directory (default `<data-dir>/snapshots`) or
/// `s3://bucket[/prefix]` with `EMBER_S3_ENDPOINT`, `AWS_REGION`,
/// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` from the environment.
pub(crate) fn snapshot_store(
    flag: Option<&str>,
    data_dir: &std::path::Path,
) -> anyhow::Result<ember_engine::SnapshotStoreConfig> {
    use ember_engine::SnapshotStoreConfig as C;
    let Some(v) = flag else { return Ok(C::Local(data_dir.join("snapshots"))) };
    let Some(rest) = v.strip_prefix("s3://") else { return Ok(C::Local(PathBuf::from(v))) };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        bail!("--snapshot-store {v:?}: expected s3://bucket[/prefix]");
    }
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let endpoint = env("EMBER_S3_ENDPOINT");
    Ok(C::S3(ember_snapshot::S3Config {
        allow_http: endpoint.starts_with("http://"),
        endpoint,
        bucket: bucket.to_string(),
        region: std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
        access_key_id: env("AWS_ACCESS_KEY_ID"),
        secret_access_key: env("AWS_SECRET_ACCESS_KEY"),
        prefix: prefix.to_string(),
    }))
}
