//! `GET /metrics` and `/metrics/watch` (protocol §3.6), measured over the
//! sandbox's own processes: the agent and its descendants (as PID 1, that is
//! the whole pid namespace).
//!
//! CPU is the growth of user+system ticks between two samples. Ticks of
//! reaped children are folded into the agent's cutime/cstime by the kernel,
//! so the total does not drop when a command ends.
use crate::config::AgentConfig;
use crate::error::{ApiError, ApiResult};
use crate::server::App;
use crate::stream::{event_stream, json_frame, now_ms};
use axum::extract::State;
use axum::response::Response;
use axum::Json;
use ember_types::execd::Metrics;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Shortest interval a CPU percentage is computed over.
const MIN_WINDOW: Duration = Duration::from_millis(100);

pub struct Sampler {
    cpu_count: f64,
    mem_total_mib: f64,
    ticks_per_sec: f64,
    /// Last (time, total ticks). A std Mutex: held only to swap a value.
    last: Mutex<Option<(Instant, u64)>>,
}

/// One reading of /proc.
struct Reading {
    ticks: u64,
    rss_kib: u64,
}

impl Sampler {
    pub fn new(config: &AgentConfig) -> Sampler {
        let cpu_count = match config.cpu_millis {
            Some(m) => m as f64 / 1000.0,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()) as f64,
        };
        let mem_total = config.memory_limit_bytes.unwrap_or_else(|| meminfo_total_kib() * 1024);
        Sampler {
            cpu_count,
            mem_total_mib: mem_total as f64 / (1024.0 * 1024.0),
            ticks_per_sec: ember_sys::process::clock_ticks_per_second() as f64,
            last: Mutex::new(None),
        }
    }

    pub async fn sample(&self) -> ApiResult<Metrics> {
        let mut now = read_blocking().await?;
        let mut at = Instant::now();
        let prev = *self.last.lock();
        let (then, prev_ticks) = match prev {
            Some((t, ticks)) if at.duration_since(t) >= MIN_WINDOW => (t, ticks),
            // No usable earlier sample: take a short window now.
            _ => {
                tokio::time::sleep(MIN_WINDOW).await;
                let first = (at, now.ticks);
                now = read_blocking().await?;
                at = Instant::now();
                first
            }
        };
        *self.last.lock() = Some((at, now.ticks));
        let secs = at.duration_since(then).as_secs_f64().max(1e-3);
        let used = now.ticks.saturating_sub(prev_ticks) as f64 / self.ticks_per_sec;
        let pct = (used / secs / self.cpu_count.max(0.001) * 100.0).clamp(0.0, 100.0);
        Ok(Metrics {
            cpu_count: self.cpu_count,
            cpu_used_pct: (pct * 100.0).round() / 100.0,
            mem_total_mib: self.mem_total_mib,
            mem_used_mib: now.rss_kib as f64 / 1024.0,
            timestamp: now_ms(),
        })
    }
}

async fn read_blocking() -> ApiResult<Reading> {
    tokio::task::spawn_blocking(read_proc).await.map_err(|e| ApiError::runtime(format!("metrics task failed: {e}")))
}

/// Sums CPU ticks and RSS over this process and its descendants.
fn read_proc() -> Reading {
    let me = std::process::id();
    // pid → (ppid, utime+stime, cutime+cstime)
    let mut procs: HashMap<u32, (u32, u64, u64)> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|s| parse_stat(&s)) {
                procs.insert(pid, stat);
            }
        }
    }
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (pid, (ppid, _, _)) in &procs {
        children.entry(*ppid).or_default().push(*pid);
    }
    let mut reading = Reading { ticks: procs.get(&me).map_or(0, |p| p.2), rss_kib: 0 };
    let mut stack = vec![me];
    while let Some(pid) = stack.pop() {
        if let Some((_, ticks, _)) = procs.get(&pid) {
            reading.ticks += ticks;
            reading.rss_kib += rss_kib(pid);
        }
        stack.extend(children.get(&pid).into_iter().flatten());
    }
    reading
}

/// (ppid, utime+stime, cutime+cstime) from a `/proc/<pid>/stat` line. The
/// command name may contain spaces and parentheses, so fields are counted
/// from the last `)`.
fn parse_stat(s: &str) -> Option<(u32, u64, u64)> {
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some((n(1)? as u32, n(11)? + n(12)?, n(13)? + n(14)?))
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    kib_field(&status, "VmRSS:")
}

fn meminfo_total_kib() -> u64 {
    kib_field(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default(), "MemTotal:")
}

fn kib_field(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// `GET /metrics`.
pub async fn get(State(app): State<App>) -> ApiResult<Json<Metrics>> {
    app.sampler.sample().await.map(Json)
}

/// `GET /metrics/watch`: a sample now, then one per second, until the
/// client goes away.
pub async fn watch(State(app): State<App>) -> Response {
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let frame = match app.sampler.sample().await {
                Ok(m) => json_frame(&m),
                Err(e) => json_frame(&serde_json::json!({ "error": e.message })),
            };
            if tx.send(frame).await.is_err() {
                break;
            }
        }
    });
    event_stream(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names() {
        let line = "42 (a b) c)) S 7 42 42 0 -1 4194560 100 0 0 0 30 12 5 6 20 0 1 0 100 1000 50";
        assert_eq!(parse_stat(line), Some((7, 42, 11)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn kib_fields() {
        assert_eq!(kib_field("Name:\tx\nVmRSS:\t  1234 kB\n", "VmRSS:"), 1234);
        assert_eq!(kib_field("", "VmRSS:"), 0);
    }

    #[test]
    fn own_process_is_measured() {
        let r = read_proc();
        assert!(r.rss_kib > 0);
    }
}
