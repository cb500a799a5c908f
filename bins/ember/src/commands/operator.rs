//! `ember operator`: runs ember's Kubernetes operator against one ember node
//! (crates/ember-operator, docs/kubernetes.md); `ember operator crds` prints
//! its CRDs.
use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct OperatorArgs {
    #[command(subcommand)]
    cmd: Option<OperatorCmd>,
    /// A kubeconfig file; without it, the in-cluster config or $KUBECONFIG.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The ember node whose pools and sandboxes the resources drive.
    #[arg(long, env = "EMBER_URL", default_value = "http://127.0.0.1:8080")]
    ember_url: String,
    /// A file holding the node's API key (kept out of the process list).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// How often a settled resource is read again from the node.
    #[arg(long, default_value = "10s", value_parser = super::parse_duration)]
    resync: std::time::Duration,
    /// Reconcile only while holding a coordination.k8s.io Lease, so that
    /// several replicas run with one leader.
    #[arg(long)]
    leader_elect: bool,
    /// The Lease's namespace (in a pod: its own, from POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// The Lease's name (one per operator deployment).
    #[arg(long, default_value = "ember-operator")]
    lease_name: String,
    /// How long a leader that stopped renewing keeps the lease.
    #[arg(long, default_value = "15s", value_parser = super::parse_duration)]
    lease_duration: std::time::Duration,
    /// Do not serve kubernetes-sigs/agent-sandbox's resources (SandboxWarmPool,
    /// SandboxClaim of extensions.agents.x-k8s.io): for a cluster where
    /// agent-sandbox's own controller serves them. Without their CRDs the
    /// operator leaves them off by itself, with one warning.
    #[arg(long)]
    no_agent_sandbox: bool,
}

#[derive(Subcommand)]
enum OperatorCmd {
    /// Print the CRDs (group ember.run, and agent-sandbox's agents.x-k8s.io
    /// and extensions.agents.x-k8s.io) as YAML, for `kubectl apply -f -`.
    Crds,
}

pub async fn run(args: OperatorArgs, api_key: Option<String>) -> anyhow::Result<i32> {
    if let Some(OperatorCmd::Crds) = args.cmd {
        print!("{}", ember_operator::crd::yaml()?);
        print!("{}", ember_operator::agents::crd::yaml()?);
        return Ok(0);
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env("EMBER_LOG").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    let api_key = match &args.api_key_file {
        // A key file of more than a few KiB is not a key: refuse to read on.
        Some(p) => Some(read_key(p)?),
        None => api_key,
    };
    let kube = kube_client(args.kubeconfig.as_deref()).await?;
    tracing::info!(ember = %args.ember_url, "ember operator running");
    let leader = args.leader_elect.then(|| ember_operator::Leader {
        namespace: args.lease_namespace.clone(),
        name: args.lease_name.clone(),
        identity: identity(),
        lease: args.lease_duration,
    });
    let cfg = ember_operator::Config {
        kube,
        ember_url: args.ember_url,
        api_key,
        resync: args.resync,
        leader,
        agent_sandbox: !args.no_agent_sandbox,
    };
    ember_operator::run(cfg).await?;
    Ok(0)
}

/// A client of the API server of `kubeconfig`, else of the in-cluster
/// config or `$KUBECONFIG`.
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    kube::Client::try_from(kube_config(kubeconfig).await?).context("kubernetes client")
}

/// The client's config: `kubeconfig`, else the in-cluster config or $KUBECONFIG.
pub async fn kube_config(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Config> {
    ember_operator::tls_provider();
    match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p).with_context(|| format!("kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {}", p.display()))
        }
        None => kube::Config::infer().await.context("no kubeconfig (in-cluster config or $KUBECONFIG)"),
    }
}

/// This replica's name in the Lease: the host (the pod's name in a pod) and pid.
fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{}-{}", host.trim(), std::process::id())
}

fn read_key(p: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(p)
        .and_then(|f| f.take(4096).read_to_string(&mut s))
        .with_context(|| format!("api key file {}", p.display()))?;
    Ok(s.trim().to_string())
}
