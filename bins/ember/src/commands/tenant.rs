//! `ember tenant ...` and `ember audit` (the admin key's commands;
//! docs/tenancy.md).
use crate::commands::parse_duration;
use clap::{Args, Subcommand};
use ember_client::Client;
use ember_types::tenant::{CreateTenantRequest, Quotas, QuotasPatch, TenantInfo, UpdateTenantRequest};

#[derive(Subcommand)]
pub enum TenantCmd {
    /// Create a tenant, with its quotas (none given: no limit).
    Create {
        /// The tenant's name (letters, digits, `-`).
        name: String,
        #[command(flatten)]
        quotas: QuotaArgs,
        /// Print the tenant as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Change a tenant's quotas: those given are set, those named by
    /// --unset removed (no limit), the others kept.
    Set {
        /// The tenant's name.
        name: String,
        #[command(flatten)]
        quotas: QuotaArgs,
        /// A quota to remove (no limit); repeat it for several.
        #[arg(long, value_enum, value_name = "QUOTA")]
        unset: Vec<QuotaName>,
        /// Print the tenant as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the tenants with their quotas and use.
    Ls {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A tenant's quotas, what it uses of them now, and its keys.
    Inspect {
        /// The tenant's name.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove tenants and their keys (their objects stay, the admin's to remove).
    Rm {
        /// The tenants' names (at least one).
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Manage a tenant's API keys.
    #[command(subcommand)]
    Key(KeyCmd),
}

#[derive(Subcommand)]
pub enum KeyCmd {
    /// A new key for a tenant, printed once: only its hash is kept.
    Create {
        /// The tenant the key belongs to.
        tenant: String,
    },
    /// List a tenant's keys by prefix (the keys themselves are never shown again).
    Ls {
        /// The tenant whose keys to list.
        tenant: String,
    },
    /// Revoke a tenant's key: calls with it are refused from then on.
    Revoke {
        /// The tenant the key belongs to.
        tenant: String,
        /// The key's prefix, as `ember tenant key ls` shows it.
        prefix: String,
    },
}

#[derive(Args)]
pub struct QuotaArgs {
    /// Sandboxes not ended (pending, running, paused).
    #[arg(long)]
    max_sandboxes: Option<u64>,
    /// Memory limits of those sandboxes, summed, e.g. 8Gi.
    #[arg(long)]
    max_memory: Option<String>,
    /// Cpu limits of those sandboxes, summed, e.g. 4 or 2500m.
    #[arg(long)]
    max_cpus: Option<String>,
    /// Maximum sizes of the tenant's warm pools, summed.
    #[arg(long)]
    max_pool_size: Option<u64>,
    /// Sizes of the tenant's workspaces, summed, e.g. 10Gi.
    #[arg(long = "max-workspace-size", alias = "max-workspace-bytes", value_name = "SIZE")]
    max_workspace_bytes: Option<String>,
    /// Tasks not finished (queued, leased, running).
    #[arg(long)]
    max_tasks: Option<u64>,
    /// Sizes of the tenant's sandbox and workspace snapshots, summed, e.g. 20Gi.
    #[arg(long = "max-snapshot-size", alias = "max-snapshot-bytes", value_name = "SIZE")]
    max_snapshot_bytes: Option<String>,
    /// Sandbox creates per second.
    #[arg(long)]
    creates_per_second: Option<u32>,
}

impl QuotaArgs {
    fn quotas(self) -> anyhow::Result<Quotas> {
        Ok(Quotas {
            running_sandboxes: self.max_sandboxes,
            memory_bytes: self.max_memory.as_deref().map(ember_types::parse_memory_bytes).transpose()?,
            cpu_millis: self.max_cpus.as_deref().map(ember_types::parse_cpu_millis).transpose()?,
            pool_size: self.max_pool_size,
            workspace_bytes: self.max_workspace_bytes.as_deref().map(ember_types::parse_memory_bytes).transpose()?,
            tasks: self.max_tasks,
            snapshot_bytes: self.max_snapshot_bytes.as_deref().map(ember_types::parse_memory_bytes).transpose()?,
            creates_per_second: self.creates_per_second,
        })
    }
}

/// A quota by the name of its flag, without `max-`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum QuotaName {
    Sandboxes,
    Memory,
    Cpus,
    PoolSize,
    WorkspaceSize,
    Tasks,
    SnapshotSize,
    CreatesPerSecond,
}

impl QuotaArgs {
    /// The change `ember tenant set` asks: each quota given set, each of
    /// `unset` removed; one both given and unset is an error.
    fn patch(self, unset: &[QuotaName]) -> anyhow::Result<QuotasPatch> {
        let q = self.quotas()?;
        let mut p = QuotasPatch {
            running_sandboxes: q.running_sandboxes.map(Some),
            memory_bytes: q.memory_bytes.map(Some),
            cpu_millis: q.cpu_millis.map(Some),
            pool_size: q.pool_size.map(Some),
            workspace_bytes: q.workspace_bytes.map(Some),
            tasks: q.tasks.map(Some),
            snapshot_bytes: q.snapshot_bytes.map(Some),
            creates_per_second: q.creates_per_second.map(Some),
        };
        for name in unset {
            let given = match name {
                QuotaName::Sandboxes => p.running_sandboxes.replace(None).flatten().is_some(),
                QuotaName::Memory => p.memory_bytes.replace(None).flatten().is_some(),
                QuotaName::Cpus => p.cpu_millis.replace(None).flatten().is_some(),
                QuotaName::PoolSize => p.pool_size.replace(None).flatten().is_some(),
                QuotaName::WorkspaceSize => p.workspace_bytes.replace(None).flatten().is_some(),
                QuotaName::Tasks => p.tasks.replace(None).flatten().is_some(),
                QuotaName::SnapshotSize => p.snapshot_bytes.replace(None).flatten().is_some(),
                QuotaName::CreatesPerSecond => p.creates_per_second.replace(None).flatten().is_some(),
            };
            if given {
                let flag = clap::ValueEnum::to_possible_value(name).map(|v| v.get_name().to_string());
                anyhow::bail!("--unset {}: that quota is also given a value", flag.unwrap_or_default());
            }
        }
        if p == QuotasPatch::default() {
            anyhow::bail!("no quota to change: give one (--max-sandboxes N ...) or --unset QUOTA");
        }
        Ok(p)
    }
}

#[derive(Args)]
pub struct AuditArgs {
    /// Only this tenant's records (default: every tenant's).
    #[arg(long)]
    tenant: Option<String>,
    /// Records of the last D (e.g. 10m, 2h); all kept records without it.
    #[arg(long, value_name = "D")]
    since: Option<String>,
    /// Print the records as JSON instead of lines of text.
    #[arg(long)]
    json: bool,
}

fn limit(v: Option<u64>) -> String {
    v.map_or("-".into(), |n| n.to_string())
}

fn print_inspect(t: &TenantInfo) {
    let (q, u) = (&t.quotas, t.usage.clone().unwrap_or_default());
    println!("tenant {}", t.name);
    println!("  {:<20} {:>14} {:>14}", "QUOTA", "USED", "LIMIT");
    println!("  {:<20} {:>14} {:>14}", "sandboxes", u.running_sandboxes, limit(q.running_sandboxes));
    println!("  {:<20} {:>14} {:>14}", "memory bytes", u.memory_bytes, limit(q.memory_bytes));
    println!("  {:<20} {:>14} {:>14}", "cpu millis", u.cpu_millis, limit(q.cpu_millis));
    println!("  {:<20} {:>14} {:>14}", "pool size", u.pool_size, limit(q.pool_size));
    println!("  {:<20} {:>14} {:>14}", "workspace bytes", u.workspace_bytes, limit(q.workspace_bytes));
    println!("  {:<20} {:>14} {:>14}", "tasks", u.tasks, limit(q.tasks));
    println!("  {:<20} {:>14} {:>14}", "snapshot bytes", u.snapshot_bytes, limit(q.snapshot_bytes));
    println!("  {:<20} {:>14} {:>14}", "creates per second", "-", limit(q.creates_per_second.map(u64::from)));
    for k in &t.keys {
        println!("  key {}", k.prefix);
    }
}

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub async fn run(client: &Client, cmd: TenantCmd) -> anyhow::Result<i32> {
    match cmd {
        TenantCmd::Create { name, quotas, json } => {
            let t = client.create_tenant(&CreateTenantRequest { name, quotas: quotas.quotas()? }).await?;
            if json {
                print_json(&t)?;
            } else {
                println!("{}", t.name);
            }
        }
        TenantCmd::Set { name, quotas, unset, json } => {
            let req = UpdateTenantRequest { quotas: quotas.patch(&unset)? };
            let t = client.update_tenant(&name, &req).await?;
            if json {
                print_json(&t)?;
            } else {
                print_inspect(&t);
            }
        }
        TenantCmd::Ls { json } => {
            let all = client.list_tenants().await?;
            if json {
                return print_json(&all).map(|_| 0);
            }
            println!("{:<24} {:>5}", "NAME", "KEYS");
            for t in all {
                println!("{:<24} {:>5}", t.name, t.keys.len());
            }
        }
        TenantCmd::Inspect { name, json } => {
            let t = client.get_tenant(&name).await?;
            if json {
                print_json(&t)?;
            } else {
                print_inspect(&t);
            }
        }
        TenantCmd::Rm { names } => {
            for n in names {
                client.delete_tenant(&n).await?;
                println!("{n}");
            }
        }
        TenantCmd::Key(KeyCmd::Create { tenant }) => {
            let k = client.create_tenant_key(&tenant).await?;
            eprintln!("key {} of {tenant}: shown once, keep it now", k.prefix);
            println!("{}", k.key);
        }
        TenantCmd::Key(KeyCmd::Ls { tenant }) => {
            for k in client.tenant_keys(&tenant).await? {
                println!("{}", k.prefix);
            }
        }
        TenantCmd::Key(KeyCmd::Revoke { tenant, prefix }) => client.revoke_tenant_key(&tenant, &prefix).await?,
    }
    Ok(0)
}

pub async fn audit(client: &Client, a: AuditArgs) -> anyhow::Result<i32> {
    let since = match a.since.as_deref() {
        None => 0,
        Some(d) => {
            let back = parse_duration(d)?;
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
            now.saturating_sub(back).as_millis() as i64
        }
    };
    let recs = client.audit(a.tenant.as_deref(), since).await?;
    if a.json {
        return print_json(&recs).map(|_| 0);
    }
    for r in recs {
        let argv = r.argv.as_deref().map(|a| format!(" argv={a:?}")).unwrap_or_default();
        println!(
            "{} {} key={} from={} req={} {} {} {} {}{argv}",
            r.ts_ms, r.tenant, r.key, r.source, r.request_id, r.action, r.path, r.status, r.outcome
        );
    }
    Ok(0)
}
