//! What the host was doing in the drill's warm-up: the share of its CPU
//! time that was busy (from `/proc/stat`) and its load average when the
//! first fault hit. MTTR is a queue of rebinds sharing the cores with the
//! sessions' own work: a host already saturated before any fault shows it
//! here, in the report, beside the figure.
use serde::Serialize;

/// The `cpu` line of `/proc/stat`: (busy, total) jiffies since boot.
fn cpu_jiffies(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).map_while(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest is in user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// A reading of the host's CPU counters.
#[derive(Clone, Copy)]
pub struct Mark(Option<(u64, u64)>);

impl Mark {
    pub fn now() -> Mark {
        Mark(std::fs::read_to_string("/proc/stat").ok().as_deref().and_then(cpu_jiffies))
    }
}

/// The warm-up as the host saw it.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WarmUp {
    /// Percent of all cores' time busy between the two marks.
    pub cpu_busy_pct: Option<u64>,
    /// The 1-, 5- and 15-minute load averages at the end of the warm-up.
    pub loadavg: String,
    /// The host's cores.
    pub cores: usize,
}

impl WarmUp {
    pub fn between(from: Mark, to: Mark) -> WarmUp {
        let cpu_busy_pct = match (from.0, to.0) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => Some(100 * b1.saturating_sub(b0) / (t1 - t0)),
            _ => None,
        };
        let cores = std::thread::available_parallelism().map_or(0, usize::from);
        WarmUp { cpu_busy_pct, loadavg: loadavg(), cores }
    }

    /// One line for the report's table.
    pub fn line(&self) -> String {
        let busy = self.cpu_busy_pct.map_or("—".into(), |p| format!("{p} %"));
        format!("{busy} of {} cores busy; load average {}", self.cores, self.loadavg)
    }
}

/// The 1-, 5- and 15-minute load averages.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().split(' ').take(3).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_share_is_all_but_idle_and_iowait() {
        let a = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n";
        let b = "cpu  400 0 150 900 50 0 0 0 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(cpu_jiffies(a), Some((150, 1000)));
        let w = WarmUp::between(Mark(cpu_jiffies(a)), Mark(cpu_jiffies(b)));
        // 400 busy of 500 elapsed.
        assert_eq!(w.cpu_busy_pct, Some(80));
        assert_eq!(WarmUp::between(Mark(None), Mark(cpu_jiffies(b))).cpu_busy_pct, None);
        assert_eq!(cpu_jiffies("intr 1 2\n"), None);
    }
}
