//! What a burst costs the Kubernetes control plane, read from its own
//! counters before and after: kube-apiserver's CPU seconds (utime + stime of
//! `/proc/<pid>/stat`), its `apiserver_request_total` by verb (its /metrics,
//! with the kubeconfig's credentials), and etcd's writes and write latency
//! (etcd's /metrics: `etcd_mvcc_put_total`, the WAL fsync and backend commit
//! histograms, p50/p99 interpolated in the buckets as Prometheus'
//! `histogram_quantile` does).
//!
//! The API server is the `kube-apiserver` process of this host listening on
//! the kubeconfig's port (or `--apiserver-pid`); etcd's metrics are read at
//! the first of its `--etcd-servers` when that is plain http (or
//! `--etcd-metrics URL`: kubeadm's etcd serves them on
//! `--listen-metrics-urls`, http://127.0.0.1:2381).
use anyhow::Context;
use std::collections::BTreeMap;
use std::io::Read;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A /metrics page larger than this is not read (a live apiserver's is a few MiB).
const MAX_METRICS: u64 = 64 << 20;
/// /proc files of the API server: its cmdline and stat are far smaller.
const MAX_PROC: u64 = 1 << 20;

/// Where the control plane's figures come from, and how it was found.
pub struct Target {
    pub pid: Option<u32>,
    pub pid_from: String,
    pub etcd: Option<String>,
    pub etcd_from: String,
}

/// One reading of every counter.
pub struct Reading {
    cpu_ticks: Option<u64>,
    apiserver: Metrics,
    etcd: Metrics,
}

/// Prometheus text format: one sample per series (name and sorted labels).
#[derive(Default)]
pub struct Metrics(BTreeMap<(String, Vec<(String, String)>), f64>);

fn read_bounded(path: &str) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_PROC).read_to_end(&mut buf))
        .with_context(|| format!("reading {path}"))?;
    Ok(buf)
}

fn cmdline(pid: u32) -> Vec<String> {
    let raw = read_bounded(&format!("/proc/{pid}/cmdline")).unwrap_or_default();
    raw.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

/// `--name=value` or `--name value` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let eq = format!("{name}=");
    args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix(&eq) {
        Some(v) => Some(v),
        None if a == name => args.get(i + 1).map(String::as_str),
        None => None,
    })
}

impl Target {
    /// The API server on `port` of this host (or `pid`), and etcd's metrics.
    pub fn find(pid: Option<u32>, port: u16, etcd: Option<String>) -> Target {
        let (pid, pid_from) = match pid {
            Some(p) => (Some(p), format!("--apiserver-pid {p}")),
            None => match by_port(port) {
                Some(p) => (Some(p), format!("/proc: kube-apiserver pid {p}, --secure-port {port}")),
                None => {
                    (None, format!("no kube-apiserver with --secure-port {port} on this host (pass --apiserver-pid)"))
                }
            },
        };
        let servers = pid.map(cmdline).and_then(|a| flag(&a, "--etcd-servers").map(str::to_string));
        let first = servers.as_deref().and_then(|s| s.split(',').next()).map(str::to_string);
        let (etcd, etcd_from) = match (etcd, first) {
            (Some(u), _) => (Some(u.clone()), format!("--etcd-metrics {u}")),
            (None, Some(u)) if u.starts_with("http://") => {
                let url = format!("{}/metrics", u.trim_end_matches('/'));
                (Some(url.clone()), format!("the API server's --etcd-servers: {url}"))
            }
            (None, Some(u)) => (None, format!("etcd at {u} needs client certificates (pass --etcd-metrics)")),
            (None, None) => (None, "etcd not found (pass --etcd-metrics URL)".into()),
        };
        Target { pid, pid_from, etcd, etcd_from }
    }

    pub async fn read(&self, kube: &kube::Client) -> anyhow::Result<Reading> {
        let req = http::Request::get("/metrics").body(Vec::new()).context("a /metrics request")?;
        let text = kube.request_text(req).await.context("kube-apiserver /metrics")?;
        let etcd = match &self.etcd {
            Some(url) => Metrics::parse(&http_get(url).await?),
            None => Metrics::default(),
        };
        Ok(Reading { cpu_ticks: self.pid.and_then(cpu_ticks), apiserver: Metrics::parse(&text), etcd })
    }
}

/// The `kube-apiserver` process whose --secure-port (default 6443) is `port`.
fn by_port(port: u16) -> Option<u32> {
    let procs = std::fs::read_dir("/proc").ok()?;
    procs.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).find(|pid| {
        let comm = read_bounded(&format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim_ascii() != b"kube-apiserver" {
            return false;
        }
        let args = cmdline(*pid);
        flag(&args, "--secure-port").unwrap_or("6443").parse::<u16>().ok() == Some(port)
    })
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = String::from_utf8(read_bounded(&format!("/proc/{pid}/stat")).ok()?).ok()?;
    // After "pid (comm) ": state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// A plain-http GET of `url`, its body bounded.
async fn http_get(url: &str) -> anyhow::Result<String> {
    let rest = url.strip_prefix("http://").with_context(|| format!("{url}: only http:// is read"))?;
    let (host, path) = rest.split_once('/').map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let mut s = tokio::net::TcpStream::connect(host).await.with_context(|| format!("connecting to {url}"))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes()).await?;
    let mut buf = Vec::new();
    s.take(MAX_METRICS).read_to_end(&mut buf).await.with_context(|| format!("reading {url}"))?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").with_context(|| format!("{url}: no HTTP answer"))?;
    anyhow::ensure!(head.split_whitespace().nth(1) == Some("200"), "{url}: {}", head.lines().next().unwrap_or(""));
    Ok(body.to_string())
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let mut m = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let (series, value) = match line.rfind('}') {
                Some(end) => (&line[..=end], &line[end + 1..]),
                None => line.split_once(' ').unwrap_or((line, "")),
            };
            let Some(Ok(v)) = value.split_whitespace().next().map(str::parse::<f64>) else { continue };
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            m.insert((name.trim().to_string(), labels_of(labels.trim_end_matches('}'))), v);
        }
        Metrics(m)
    }

    /// The sum of `name`'s series whose labels include every pair of `with`.
    fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.series(name, with).map(|(_, v)| v).sum()
    }

    fn series<'a>(
        &'a self,
        name: &'a str,
        with: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = (&'a [(String, String)], f64)> + 'a {
        self.0
            .iter()
            .filter(move |((n, l), _)| {
                n == name && with.iter().all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|((_, l), v)| (l.as_slice(), *v))
    }
}

/// `a="x",b="y\"z"` → sorted pairs (escapes kept as written).
fn labels_of(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut end = 0;
        let bytes = after.as_bytes();
        while end < bytes.len() && !(bytes[end] == b'"' && (end == 0 || bytes[end - 1] != b'\\')) {
            end += 1;
        }
        out.push((key.trim_start_matches(',').trim().to_string(), after[..end].to_string()));
        rest = after.get(end + 1..).unwrap_or("");
    }
    out.sort();
    out
}

/// A histogram's change between two readings: (upper bound, cumulative count).
pub struct Histogram(Vec<(f64, f64)>);

impl Histogram {
    fn delta(before: &Metrics, after: &Metrics, name: &str) -> Histogram {
        let bucket = format!("{name}_bucket");
        let mut by_le: BTreeMap<String, f64> = BTreeMap::new();
        for (m, sign) in [(after, 1.0), (before, -1.0)] {
            for (labels, v) in m.series(&bucket, &[]) {
                if let Some((_, le)) = labels.iter().find(|(k, _)| k == "le") {
                    *by_le.entry(le.clone()).or_default() += sign * v;
                }
            }
        }
        let mut b: Vec<(f64, f64)> = by_le.into_iter().filter_map(|(le, c)| Some((le.parse().ok()?, c))).collect();
        b.sort_by(|x, y| x.0.total_cmp(&y.0));
        Histogram(b)
    }

    pub fn count(&self) -> f64 {
        self.0.last().map_or(0.0, |b| b.1)
    }

    /// The `q` quantile in seconds, linear within its bucket (the first
    /// bucket from 0; the +Inf bucket answers its lower bound).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let rank = q * self.count();
        if self.count() <= 0.0 {
            return None;
        }
        let (mut lower, mut below) = (0.0, 0.0);
        for &(upper, cum) in &self.0 {
            if cum >= rank {
                if upper.is_infinite() {
                    return Some(lower);
                }
                let within = if cum > below { (rank - below) / (cum - below) } else { 1.0 };
                return Some(lower + (upper - lower) * within);
            }
            (lower, below) = (upper, cum);
        }
        Some(lower)
    }
}

/// The burst's cost: the change between two readings.
pub struct Cost {
    pub cpu_seconds: Option<f64>,
    /// `apiserver_request_total` by verb: every resource, and ember.run's sandboxes.
    pub requests: BTreeMap<String, (f64, f64)>,
    pub etcd_puts: f64,
    pub wal_fsync: Histogram,
    pub backend_commit: Histogram,
}

impl Cost {
    pub fn between(a: &Reading, b: &Reading) -> Cost {
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        let cpu_seconds = match (a.cpu_ticks, b.cpu_ticks) {
            (Some(x), Some(y)) => Some(y.saturating_sub(x) as f64 / ticks),
            _ => None,
        };
        let mut requests: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        let name = "apiserver_request_total";
        for (m, sign) in [(&b.apiserver, 1.0), (&a.apiserver, -1.0)] {
            for (labels, v) in m.series(name, &[]) {
                let get = |k: &str| labels.iter().find(|(lk, _)| lk == k).map_or("", |(_, v)| v.as_str());
                let e = requests.entry(get("verb").to_string()).or_default();
                e.0 += sign * v;
                if get("group") == "ember.run" && get("resource") == "sandboxes" {
                    e.1 += sign * v;
                }
            }
        }
        requests.retain(|_, (all, _)| *all > 0.0);
        let puts = "etcd_mvcc_put_total";
        Cost {
            cpu_seconds,
            requests,
            etcd_puts: b.etcd.sum(puts, &[]) - a.etcd.sum(puts, &[]),
            wal_fsync: Histogram::delta(&a.etcd, &b.etcd, "etcd_disk_wal_fsync_duration_seconds"),
            backend_commit: Histogram::delta(&a.etcd, &b.etcd, "etcd_disk_backend_commit_duration_seconds"),
        }
    }

    /// Requests of verbs that write (POST, PUT, PATCH, DELETE, APPLY).
    pub fn writes(&self) -> (f64, f64) {
        let w = ["POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION"];
        self.requests
            .iter()
            .filter(|(v, _)| w.contains(&v.as_str()))
            .fold((0.0, 0.0), |s, (_, r)| (s.0 + r.0, s.1 + r.1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_series_and_interpolates_quantiles_in_buckets() {
        let before = Metrics::parse("h_bucket{le=\"0.001\"} 1\nh_bucket{le=\"0.002\"} 1\nh_bucket{le=\"+Inf\"} 1\n");
        let after = Metrics::parse(
            "# HELP h x\nh_bucket{le=\"0.001\"} 1\nh_bucket{le=\"0.002\"} 5\nh_bucket{le=\"+Inf\"} 6\n\
             r_total{code=\"201\",verb=\"POST\",x=\"a,b=\\\"c\\\"\"} 3\n",
        );
        let h = Histogram::delta(&before, &after, "h");
        assert_eq!(h.count(), 5.0);
        // 4 of the 5 new ones in (0.001, 0.002]: the median is the 2.5th, 0.001 + 0.001 * 2.5/4.
        assert!((h.quantile(0.5).expect("p50") - 0.001625).abs() < 1e-9);
        assert_eq!(h.quantile(0.99), Some(0.002), "the +Inf bucket answers its lower bound");
        assert_eq!(after.sum("r_total", &[("verb", "POST")]), 3.0);
        assert_eq!(after.sum("r_total", &[("x", "a,b=\\\"c\\\"")]), 3.0);
        assert_eq!(Histogram(Vec::new()).quantile(0.5), None);
    }

    #[test]
    fn reads_flags_both_ways() {
        let a: Vec<String> = ["x", "--secure-port", "7", "--etcd-servers=http://e:1"].map(String::from).to_vec();
        assert_eq!(flag(&a, "--secure-port"), Some("7"));
        assert_eq!(flag(&a, "--etcd-servers"), Some("http://e:1"));
        assert_eq!(flag(&a, "--nope"), None);
    }
}
