//! `ember task ...` and the task flags of `ember serve`.
use crate::commands::parse_duration;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use ember_client::Client;
use ember_types::task::{SubmitTaskRequest, TaskRecord, Tier};
use std::io::Write;

#[derive(Subcommand)]
pub enum TaskCmd {
    /// Queue a command; prints the task id (the existing one for a known --key).
    Submit {
        /// Template of the attempts' sandboxes (default: host).
        #[arg(long)]
        template: Option<String>,
        /// Mounted read-write at /workspace for each attempt.
        #[arg(long)]
        workspace: Option<String>,
        /// interactive, standard or batch.
        #[arg(long, default_value = "standard")]
        tier: String,
        /// Idempotency key: resubmitting with it returns the same task.
        #[arg(long)]
        key: Option<String>,
        /// How long one attempt may run, e.g. 10m.
        #[arg(long)]
        timeout: Option<String>,
        /// Attempts before the task is dead-lettered.
        #[arg(long)]
        attempts: Option<u32>,
        /// Lease (ack wait) of each attempt, e.g. 10s.
        #[arg(long)]
        lease: Option<String>,
        /// Heartbeat interval, shorter than the lease.
        #[arg(long)]
        heartbeat: Option<String>,
        /// Environment for the command, K=V (repeatable).
        #[arg(long = "env", value_name = "K=V")]
        env: Vec<String>,
        /// Whose task it is (running tasks per tenant are capped by the daemon).
        #[arg(long)]
        tenant: Option<String>,
        /// Allow running in a sandbox an earlier task of the same tenant and
        /// template left (its processes killed, its files kept); no workspace.
        #[arg(long)]
        reuse_sandbox: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// List tasks.
    Ls {
        /// Only tasks in this state (repeatable; default: all).
        #[arg(long)]
        state: Vec<String>,
        /// Only tasks of this tier (repeatable; default: all).
        #[arg(long)]
        tier: Vec<String>,
        /// Only tasks on this workspace (default: all).
        #[arg(long)]
        workspace: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show a task with every transition and attempt.
    Inspect {
        /// The task's id.
        id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Cancel tasks: queued ones never run, a running attempt is stopped.
    Cancel {
        /// Tasks to cancel (at least one).
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Print an attempt's output (default: the latest); -f follows it live.
    Logs {
        /// The task's id.
        id: String,
        /// Keep printing new output until the attempt ends.
        #[arg(short, long)]
        follow: bool,
        /// The attempt's number (default: the latest).
        #[arg(long)]
        attempt: Option<u32>,
        /// Start at this byte of the log (resume a follow that was cut).
        #[arg(long, default_value_t = 0)]
        offset: u64,
    },
}

/// Task flags of `ember serve`.
#[derive(Args, Clone)]
pub struct TaskFlags {
    /// Worker slots on this node: at most this many task attempts at once.
    #[arg(long, default_value_t = 4)]
    pub task_workers: u32,
    /// Default lease (ack wait) of an attempt.
    #[arg(long, default_value = "10s")]
    pub task_lease: String,
    /// Default heartbeat interval (shorter than the lease).
    #[arg(long, default_value = "2s")]
    pub task_heartbeat: String,
    /// A task waiting this long moves up one tier.
    #[arg(long, default_value = "30s")]
    pub task_aging: String,
    /// Cap on running tasks of a tier, TIER=N (repeatable).
    #[arg(long = "task-cap", value_name = "TIER=N")]
    pub task_caps: Vec<String>,
    /// Default attempts of a task before it is dead-lettered.
    #[arg(long, default_value_t = 3)]
    pub task_attempts: u32,
    /// Cap on running tasks per tenant: N for every tenant, TENANT=N for one
    /// (repeatable; a tenant's own cap wins).
    #[arg(long = "task-tenant-cap", value_name = "[TENANT=]N")]
    pub task_tenant_caps: Vec<String>,
    /// Finished tasks (and their logs) are dropped this long after they ended.
    #[arg(long, default_value = "7d")]
    pub task_retention: String,
    /// At most this many finished tasks are kept; the oldest are dropped first.
    #[arg(long, default_value_t = 100_000)]
    pub task_retention_count: usize,
    /// Cap on one attempt's log (bytes, or 16Mi, 1Gi...); output past it is
    /// dropped after a `[ember: log truncated ...]` line.
    #[arg(long, default_value = "16Mi")]
    pub task_log_limit: String,
}

impl TaskFlags {
    pub fn config(&self) -> anyhow::Result<ember_engine::tasks::TaskConfig> {
        let lease = parse_duration(&self.task_lease).context("--task-lease")?;
        let heartbeat = parse_duration(&self.task_heartbeat).context("--task-heartbeat")?;
        if heartbeat >= lease || heartbeat.is_zero() {
            bail!("--task-heartbeat must be shorter than --task-lease");
        }
        let mut caps = [None; 3];
        for c in &self.task_caps {
            let (t, n) = c.split_once('=').with_context(|| format!("--task-cap {c:?} is not TIER=N"))?;
            let tier = Tier::parse(t).with_context(|| format!("--task-cap: unknown tier {t:?}"))?;
            caps[tier.rank()] = Some(n.parse().with_context(|| format!("--task-cap {c:?}"))?);
        }
        let (mut tenant_cap, mut tenant_caps) = (None, std::collections::BTreeMap::new());
        for c in &self.task_tenant_caps {
            let bad = || format!("--task-tenant-cap {c:?} is not N or TENANT=N");
            match c.split_once('=') {
                Some((t, n)) => {
                    ember_engine::tasks::check_tenant(t).map_err(anyhow::Error::msg).with_context(bad)?;
                    tenant_caps.insert(t.to_string(), n.parse().with_context(bad)?);
                }
                None => tenant_cap = Some(c.parse().with_context(bad)?),
            }
        }
        if !(1..=100).contains(&self.task_attempts) {
            bail!("--task-attempts must be between 1 and 100");
        }
        let node = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
        Ok(ember_engine::tasks::TaskConfig {
            workers: self.task_workers,
            node: if node.is_empty() { "node0".into() } else { node },
            lease,
            heartbeat,
            queue: ember_engine::tasks::QueueConfig {
                aging_ms: millis(parse_duration(&self.task_aging).context("--task-aging")?, "--task-aging")?,
                tier_caps: caps,
                tenant_cap,
                tenant_caps,
                retention: ember_engine::tasks::Retention {
                    max_age_ms: Some(millis(
                        parse_duration(&self.task_retention).context("--task-retention")?,
                        "--task-retention",
                    )?),
                    max_finished: Some(self.task_retention_count),
                },
            },
            default_attempts: self.task_attempts,
            log_limit: ember_types::parse_memory_bytes(&self.task_log_limit)
                .map_err(|e| anyhow::anyhow!("--task-log-limit {:?}: {e}", self.task_log_limit))?,
            ..Default::default()
        })
    }
}

fn ms(d: Option<String>, what: &str) -> anyhow::Result<Option<u64>> {
    d.map(|d| {
        let d = parse_duration(&d).with_context(|| what.to_string())?;
        Ok(millis(d, what)? as u64)
    })
    .transpose()
}

/// A duration in milliseconds for the queue's signed millisecond clock, at
/// most a century: one longer is refused, never wrapped into a negative age
/// (or multiplied past `i64` by the tier aging).
fn millis(d: std::time::Duration, flag: &str) -> anyhow::Result<i64> {
    const CENTURY_MS: u128 = 100 * 365 * 24 * 3600 * 1000;
    match d.as_millis() {
        ms if ms <= CENTURY_MS => Ok(ms as i64),
        _ => anyhow::bail!("{flag}: {d:?} is too long (at most 100 years)"),
    }
}

fn line(t: &TaskRecord) -> String {
    let reason = t.attempts.last().and_then(|a| a.reason.clone()).unwrap_or_default();
    format!("{:<20} {:<13} {:<12} {:>7}  {}", t.id, t.state.as_str(), t.spec.tier.as_str(), t.attempt(), reason)
}

pub async fn run(client: &Client, cmd: TaskCmd) -> anyhow::Result<i32> {
    match cmd {
        TaskCmd::Submit {
            template,
            workspace,
            tier,
            key,
            timeout,
            attempts,
            lease,
            heartbeat,
            env,
            tenant,
            reuse_sandbox,
            json,
            argv,
        } => {
            let req = SubmitTaskRequest {
                command: argv,
                template,
                workspace,
                tier: Some(
                    Tier::parse(&tier).with_context(|| format!("--tier {tier:?}: interactive, standard or batch"))?,
                ),
                key,
                timeout: ms(timeout, "--timeout")?.map(|m| m.div_ceil(1000)),
                attempts,
                lease_ms: ms(lease, "--lease")?,
                heartbeat_ms: ms(heartbeat, "--heartbeat")?,
                env: super::parse_kv(&env, "--env")?,
                tenant,
                reuse_sandbox: reuse_sandbox.then_some(true),
            };
            let (t, _) = client.submit_task(&req).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&t)?);
            } else {
                println!("{}", t.id);
            }
        }
        TaskCmd::Ls { state, tier, workspace, json } => {
            let mut q: Vec<String> = state.iter().map(|s| format!("state={s}")).collect();
            q.extend(tier.iter().map(|t| format!("tier={t}")));
            q.extend(workspace.iter().map(|w| format!("workspace={w}")));
            let all = client.list_tasks(&q.join("&")).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                println!("{:<20} {:<13} {:<12} {:>7}  LAST REASON", "ID", "STATE", "TIER", "ATTEMPT");
                all.iter().for_each(|t| println!("{}", line(t)));
            }
        }
        TaskCmd::Inspect { id, json } => {
            let t = client.get_task(&id).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&t)?);
                return Ok(0);
            }
            println!("task {} ({}, {}): {:?}", t.id, t.state.as_str(), t.spec.tier.as_str(), t.spec.command);
            for tr in &t.transitions {
                println!(
                    "  {:>15} ms  {:<13} attempt {} {}",
                    tr.at_ms,
                    tr.state.as_str(),
                    tr.attempt,
                    tr.worker.as_deref().unwrap_or("")
                );
            }
            for a in &t.attempts {
                let why = a.reason.as_deref().unwrap_or(if a.exit_code == Some(0) { "succeeded" } else { "" });
                println!("  attempt {} by {} in {}: {why}", a.attempt, a.worker, a.sandbox.as_deref().unwrap_or("-"));
            }
        }
        TaskCmd::Cancel { ids } => {
            return super::for_each_name(ids, |id| async move { client.cancel_task(&id).await }).await;
        }
        TaskCmd::Logs { id, follow, attempt, offset } => {
            client
                .task_logs_from(&id, attempt, follow, offset, |b| {
                    let mut o = std::io::stdout().lock();
                    let _ = o.write_all(b);
                    let _ = o.flush();
                })
                .await?;
        }
    }
    Ok(0)
}
