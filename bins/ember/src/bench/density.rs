//! `ember bench density`: how many idle pooled sandboxes fit and what each
//! costs the host. It fills a pool of its own to `--count` idle, reads the
//! host's memory counters before and after (so the daemon must run on this
//! host), then removes the pool, on every way out.
use super::pool::{self, BenchPool, TEMPLATE};
use super::procfs::{self, MemInfo, ProcMem};
use ember_client::Client;
use ember_types::api::PoolInfo;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Issue 4's target: 1,000 idle sandboxes within 24 GiB.
const TARGET_COUNT: f64 = 1000.0;
const TARGET_BYTES: f64 = 24.0 * GIB;
const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;
/// Filling stops when the host has less than this available: the machine is
/// shared, and running it out of memory would measure nothing useful.
const MEM_FLOOR: u64 = 2 << 30;
/// Filling stops when the idle count has not grown for this long.
const STALL: Duration = Duration::from_secs(30);
const AGENT: &str = "ember-agent";

/// The host as seen before or after the fill.
#[derive(Default)]
struct Snapshot {
    mem: Option<MemInfo>,
    agents: BTreeSet<i32>,
    daemon: Option<ProcMem>,
}

impl Snapshot {
    fn take(daemon: Option<i32>) -> Snapshot {
        Snapshot {
            mem: procfs::meminfo(),
            agents: daemon.map(|d| procfs::children_named(d, AGENT)).unwrap_or_default(),
            daemon: daemon.and_then(procfs::proc_mem),
        }
    }
}

struct Fill {
    info: Option<PoolInfo>,
    elapsed: Duration,
    /// Why filling stopped short of `--count`.
    stopped: Option<String>,
}

pub async fn run(client: &Client, count: u32, timeout: Duration, json: bool) -> anyhow::Result<i32> {
    if count == 0 {
        anyhow::bail!("--count must be at least 1");
    }
    let url = pool::url();
    let daemon = procfs::port_of(&url).and_then(procfs::listener_pid);
    eprintln!("ember bench density: {count} idle sandboxes of template {TEMPLATE}");
    let load0 = procfs::loadavg();
    let before = Snapshot::take(daemon);
    let p = BenchPool::create(client, "density", count).await?;
    let name = p.name.clone();
    let t0 = Instant::now();
    let fill = match pool::interruptible(fill(client, &p, count, timeout)).await {
        Ok(f) => f,
        Err(e) => {
            let elapsed = t0.elapsed();
            Fill { info: client.get_pool(&name).await.ok(), elapsed, stopped: Some(format!("{e:#}")) }
        }
    };
    let after = Snapshot::take(daemon);
    let agents: Vec<ProcMem> = after.agents.difference(&before.agents).filter_map(|p| procfs::proc_mem(*p)).collect();
    let t1 = Instant::now();
    let removed = p.remove(client).await;
    let removal = t1.elapsed();
    // Give the kernel a moment to free what the sandboxes held before looking again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let end = procfs::meminfo();
    let r = Report {
        url,
        pool: name,
        count,
        daemon,
        fill,
        before,
        after,
        agents,
        removal,
        removed: removed.err().map(|e| format!("{e:#}")),
        end,
        load: (load0, procfs::loadavg()),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&r.to_json())?);
    } else {
        println!();
        r.print();
    }
    Ok(i32::from(r.idle() < count || r.fill.stopped.is_some() || r.removed.is_some()))
}

async fn fill(client: &Client, p: &BenchPool, count: u32, timeout: Duration) -> anyhow::Result<Fill> {
    let t0 = Instant::now();
    let (mut best, mut since) = (0, Instant::now());
    let tty = std::io::stderr().is_terminal();
    let stop = |info: PoolInfo, why: Option<String>| {
        if tty {
            eprint!("\r\x1b[2K");
        }
        eprintln!("  pool idle {}/{count} after {:.1} s", info.idle, t0.elapsed().as_secs_f64());
        Ok(Fill { info: Some(info), elapsed: t0.elapsed(), stopped: why })
    };
    loop {
        let info = client.get_pool(&p.name).await?;
        if tty {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2K  pool idle {}/{count}", info.idle);
        }
        if info.idle >= count && info.starting == 0 {
            return stop(info, None);
        }
        let avail = procfs::meminfo().map_or(u64::MAX, |m| m.available);
        if avail < MEM_FLOOR {
            let why = format!("host MemAvailable fell below {} GiB", MEM_FLOOR >> 30);
            return stop(info, Some(why));
        }
        if info.idle > best {
            (best, since) = (info.idle, Instant::now());
        } else if since.elapsed() > STALL {
            let why =
                format!("no new idle sandbox for {} s ({} creates failed)", STALL.as_secs(), info.create_failures);
            return stop(info, Some(why));
        }
        if t0.elapsed() > timeout {
            return stop(info, Some(format!("--timeout {} s", timeout.as_secs())));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

struct Report {
    url: String,
    pool: String,
    count: u32,
    daemon: Option<i32>,
    fill: Fill,
    before: Snapshot,
    after: Snapshot,
    agents: Vec<ProcMem>,
    removal: Duration,
    removed: Option<String>,
    end: Option<MemInfo>,
    load: (String, String),
}

/// One line of the memory table: bytes per sandbox (and in total).
struct Line {
    key: &'static str,
    label: String,
    per: Option<f64>,
    total: Option<f64>,
}

impl Report {
    fn idle(&self) -> u32 {
        self.fill.info.as_ref().map_or(0, |i| i.idle)
    }

    /// (before − after) of a meminfo counter that falls as sandboxes are added,
    /// or (after − before) of one that grows, in bytes (may be negative: noise).
    fn mem_delta(&self, pick: fn(&MemInfo) -> u64, grows: bool) -> Option<f64> {
        let (b, a) = (pick(self.before.mem.as_ref()?) as f64, pick(self.after.mem.as_ref()?) as f64);
        Some(if grows { a - b } else { b - a })
    }

    fn lines(&self) -> Vec<Line> {
        let idle = self.idle() as f64;
        let per = |total: Option<f64>| total.filter(|_| idle > 0.0).map(|t| t / idle);
        let line = |key, label: String, total: Option<f64>| Line { key, label, per: per(total), total };
        let n = self.agents.len() as f64;
        let agent_sum = |pick: fn(&ProcMem) -> Option<u64>| -> Option<f64> {
            let v: Option<Vec<u64>> = self.agents.iter().map(pick).collect();
            v.filter(|v| !v.is_empty()).map(|v| v.iter().sum::<u64>() as f64)
        };
        let per_agent = |total: Option<f64>| total.filter(|_| n > 0.0).map(|t| t / n);
        let agent = |key, label: String, total: Option<f64>| Line { key, label, per: per_agent(total), total };
        let daemon = self.before.daemon.zip(self.after.daemon).map(|(b, a)| a.rss as f64 - b.rss as f64);
        let daemon_now = self.after.daemon.map_or(0.0, |d| d.rss as f64);
        let cgroup = self.fill.info.as_ref().map(|i| i.idle_memory_bytes as f64);
        let mut v = vec![
            line("host", "host memory (MemAvailable drop)".into(), self.mem_delta(|m| m.available, false)),
            line("cgroup", "charged to the sandbox cgroups".into(), cgroup),
            agent(
                "agentRss",
                format!("agent RSS ({} {AGENT} processes)", self.agents.len()),
                agent_sum(|m| Some(m.rss)),
            ),
            agent("agentPss", "agent PSS (shared pages split)".into(), agent_sum(|m| m.pss)),
            agent("agentUss", "agent private (USS)".into(), agent_sum(|m| m.uss)),
            line("slab", "kernel: slab".into(), self.mem_delta(|m| m.slab, true)),
            line(
                "slabUnreclaimable",
                "  of which unreclaimable".into(),
                self.mem_delta(|m| m.slab_unreclaimable, true),
            ),
            line("pageTables", "kernel: page tables".into(), self.mem_delta(|m| m.page_tables, true)),
            line("kernelStack", "kernel: stacks".into(), self.mem_delta(|m| m.kernel_stack, true)),
            line("percpu", "kernel: per-cpu".into(), self.mem_delta(|m| m.percpu, true)),
            line("daemon", format!("daemon RSS growth (now {:.0} MiB)", daemon_now / MIB), daemon),
        ];
        // What the parts explain of the host figure (agent PSS, not RSS: shared text counts once).
        let parts = ["agentPss", "slab", "pageTables", "kernelStack", "percpu", "daemon"];
        let sum: Option<f64> = v.iter().filter(|l| parts.contains(&l.key)).map(|l| l.per).sum();
        v.push(Line { key: "parts", label: "sum: agent PSS + kernel + daemon".into(), per: sum, total: None });
        v
    }

    /// Host bytes 1,000 idle sandboxes take, from this run: the larger of the
    /// host figure and the sum of the parts (other work moves MemAvailable
    /// either way, so neither alone is trusted).
    fn thousand(&self) -> Option<f64> {
        let per = |key| self.lines().into_iter().find(|l| l.key == key).and_then(|l| l.per);
        let worst = match (per("host"), per("parts")) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        worst.map(|p| p * TARGET_COUNT)
    }

    fn notes(&self) -> Vec<String> {
        let mut n = vec![format!(
            "load average {} at the start, {} at the end; other work on this host moves MemAvailable, so the host figure is noisy",
            self.load.0, self.load.1
        )];
        n.push("MemAvailable counts reclaimable slab (dentries, inodes) as available, so the host figure can be below the sum of the parts".into());
        n.push("the agent is a static binary: its text pages are shared by every agent, so RSS overstates, PSS/USS is the real cost".into());
        if self.daemon.is_none() {
            n.push("no process on this host listens on the daemon's port: agent and daemon figures unavailable (host figures assume the daemon runs here)".into());
        } else if self.agents.len() as u32 != self.idle() {
            n.push(format!("{} new agent processes for {} idle sandboxes", self.agents.len(), self.idle()));
        }
        if let Some(s) = &self.fill.stopped {
            n.push(format!("filling stopped early: {s}"));
        }
        if let Some(e) = &self.removed {
            n.push(format!("could not remove the pool: {e}"));
        }
        n
    }

    fn print(&self) {
        let daemon = self.daemon.map_or("not on this host".into(), |p| format!("pid {p}"));
        println!("ember bench density: template {TEMPLATE}, daemon {} ({daemon}), pool {}", self.url, self.pool);
        let secs = self.fill.elapsed.as_secs_f64();
        println!(
            "idle sandboxes: {} of {} in {secs:.2} s ({:.0}/s)",
            self.idle(),
            self.count,
            self.idle() as f64 / secs.max(1e-9)
        );
        println!();
        println!("{:<40}{:>14}{:>12}", "memory", "per sandbox", "total");
        for l in self.lines() {
            let per = l.per.map_or("—".into(), |v| format!("{:.2} MiB", v / MIB));
            let total = l.total.map_or("—".into(), |v| format!("{:.0} MiB", v / MIB));
            println!("{:<40}{per:>14}{total:>12}", l.label);
        }
        println!();
        match self.thousand() {
            Some(b) => println!(
                "1,000 idle sandboxes: {:.2} GiB of host memory ({}the larger of host and sum; target ≤ 24 GiB {})",
                b / GIB,
                if self.idle() as f64 == TARGET_COUNT { "" } else { "scaled from this run, " },
                if b <= TARGET_BYTES { "✓" } else { "✗" }
            ),
            None => println!("1,000 idle sandboxes: not measurable (no idle sandbox or no /proc/meminfo)"),
        }
        let back = self.before.mem.zip(self.end).map(|(b, e)| (b.available as f64 - e.available as f64) / MIB);
        println!(
            "pool removed in {:.2} s; MemAvailable 1 s later: {}",
            self.removal.as_secs_f64(),
            back.map_or("?".into(), |v| format!(
                "{:.0} MiB {} the start",
                v.abs(),
                if v >= 0.0 { "below" } else { "above" }
            ))
        );
        println!();
        println!("  host = MemAvailable before − after the fill, per idle sandbox (everything: agent, kernel, daemon)");
        println!("  cgroups = the pool's idleMemoryBytes (memory charged to the idle sandboxes' cgroups) / idle");
        println!("  agent = VmRSS, smaps_rollup Pss and Private_* of the daemon's new {AGENT}* children / their count");
        println!("  kernel = growth of /proc/meminfo Slab, PageTables, KernelStack, Percpu / idle (not only the sandboxes': noisy)");
        for n in self.notes() {
            println!("note: {n}");
        }
    }

    fn to_json(&self) -> Value {
        let mem: serde_json::Map<String, Value> = self
            .lines()
            .into_iter()
            .map(|l| (l.key.into(), json!({ "perSandboxBytes": l.per, "totalBytes": l.total })))
            .collect();
        let t = self.thousand();
        json!({
            "url": self.url,
            "template": TEMPLATE,
            "pool": self.pool,
            "daemonPid": self.daemon,
            "count": self.count,
            "idle": self.idle(),
            "fillSecs": self.fill.elapsed.as_secs_f64(),
            "agents": self.agents.len(),
            "memory": mem,
            "target": { "count": TARGET_COUNT, "maxBytes": TARGET_BYTES, "bytesFor1000": t, "met": t.map(|b| b <= TARGET_BYTES) },
            "removalSecs": self.removal.as_secs_f64(),
            "stopped": self.fill.stopped,
            "notes": self.notes(),
        })
    }
}
