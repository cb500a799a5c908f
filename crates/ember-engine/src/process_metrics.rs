//! The daemon's own process figures (`process_*`, the names Prometheus's
//! client libraries use), read from `/proc/self` at scrape time.
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// /proc's tick unit: the kernel ABI fixes USER_HZ at 100 whatever its HZ.
const USER_HZ: f64 = 100.0;

/// `body` (an OpenMetrics exposition) with the process figures appended;
/// unchanged when `/proc/self` cannot be read.
pub fn append_process(body: String) -> String {
    match encode() {
        Some(ours) => splice(body, &ours),
        None => body,
    }
}

/// Two expositions as one: `body`'s `# EOF` dropped, `ours` (which ends with
/// its own) appended.
pub fn splice(mut body: String, ours: &str) -> String {
    if let Some(cut) = body.rfind("# EOF") {
        body.truncate(cut);
    }
    body.push_str(ours);
    body
}

fn encode() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<i64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let rss_kib = field("VmRSS:")?;
    let threads = field("Threads:")?;
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command name's closing paren: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    let open_fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as i64).unwrap_or(0);

    let mut r = Registry::default();
    let rss = Gauge::<i64>::default();
    rss.set(rss_kib * 1024);
    r.register("process_resident_memory_bytes", "Resident memory of ember serve", rss);
    let cpu = Counter::<f64, AtomicU64>::default();
    cpu.inc_by(ticks / USER_HZ);
    r.register("process_cpu_seconds", "User and system CPU time of ember serve", cpu);
    let t = Gauge::<i64>::default();
    t.set(threads);
    r.register("process_threads", "Threads of ember serve", t);
    let fds = Gauge::<i64>::default();
    fds.set(open_fds);
    r.register("process_open_fds", "Open file descriptors of ember serve", fds);
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, &r).ok()?;
    Some(s)
}
