//! `ember stats`: a sandbox's cgroup figures, once (`--no-stream`) or a line
//! a second. CPU is the rate between two readings, in % of one core.
use ember_client::Client;
use ember_types::SandboxStats;
use std::time::Duration;

const EVERY: Duration = Duration::from_secs(1);
/// The first rate of `--no-stream` is measured over this long.
const FIRST_RATE: Duration = Duration::from_millis(500);

pub async fn stats(client: &Client, id: &str, no_stream: bool, json: bool) -> anyhow::Result<i32> {
    let mut prev = client.stats(id).await?;
    let mut at = tokio::time::Instant::now();
    if !json {
        println!(
            "{:<38} {:>7} {:>21} {:>6} {:>11} {:>21}",
            "ID", "CPU %", "MEM USAGE / LIMIT", "MEM %", "PIDS", "BLOCK I/O"
        );
    }
    let mut wait = FIRST_RATE;
    loop {
        tokio::time::sleep(wait).await;
        let now = client.stats(id).await?;
        let elapsed = at.elapsed();
        at = tokio::time::Instant::now();
        let cpu = cpu_percent(&prev, &now, elapsed);
        if json {
            let mut v = serde_json::to_value(&now)?;
            v["cpuPercent"] = serde_json::json!(cpu);
            println!("{v}");
        } else {
            println!("{}", row(&now, cpu));
        }
        if no_stream {
            return Ok(0);
        }
        prev = now;
        wait = EVERY;
    }
}

/// CPU use between two readings in % of one core (200 = two cores busy).
fn cpu_percent(a: &SandboxStats, b: &SandboxStats, over: Duration) -> Option<f64> {
    let used = b.cpu_usage_micros?.saturating_sub(a.cpu_usage_micros?);
    let span = over.as_micros().max(1) as f64;
    Some(used as f64 * 100.0 / span)
}

fn row(s: &SandboxStats, cpu: Option<f64>) -> String {
    let limit = |l: u64| if l >= (1 << 62) { "none".to_string() } else { human(l) };
    let mem = format!("{} / {}", human(s.memory_bytes), limit(s.memory_limit_bytes));
    let pct = if s.memory_limit_bytes > 0 && s.memory_limit_bytes < (1 << 62) {
        format!("{:.1}%", s.memory_bytes as f64 * 100.0 / s.memory_limit_bytes as f64)
    } else {
        "-".into()
    };
    let pids =
        format!("{} / {}", s.pids, if s.pids_limit >= (1 << 62) { "none".into() } else { s.pids_limit.to_string() });
    let io = match (s.io_read_bytes, s.io_write_bytes) {
        (Some(r), Some(w)) => format!("{} / {}", human(r), human(w)),
        _ => "-".into(),
    };
    let cpu = cpu.map_or("-".into(), |c| format!("{c:.1}%"));
    format!("{:<38} {:>7} {:>21} {:>6} {:>11} {:>21}", s.id, cpu, mem, pct, pids, io)
}

/// Bytes in binary units, one decimal (`12.3MiB`).
fn human(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}B")
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_render() {
        assert_eq!(human(512), "512B");
        assert_eq!(human(3 << 20), "3.0MiB");
        let a = SandboxStats { cpu_usage_micros: Some(1_000_000), ..Default::default() };
        let b = SandboxStats { cpu_usage_micros: Some(1_500_000), ..Default::default() };
        assert_eq!(cpu_percent(&a, &b, Duration::from_secs(1)), Some(50.0));
        let none = SandboxStats::default();
        assert_eq!(cpu_percent(&none, &b, Duration::from_secs(1)), None);
    }
}
