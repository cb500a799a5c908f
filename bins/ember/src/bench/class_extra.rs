//! The heavier rows of `ember bench classes`: a stat-heavy micro-workload
//! (100k `stat` calls timed inside the sandbox, so the agent and the API are
//! not in the figure) and the memory an idle sandbox costs, per class.
use super::procfs::meminfo;
use super::stats::Series;
use ember_client::Client;
use ember_types::api::CreateSandboxRequest;
use ember_types::execd::RunCommandRequest;
use std::time::Duration;

/// 100k `stat(2)` of one file, timed by perl itself; prints milliseconds.
const STAT_WORKLOAD: &str = "perl -MTime::HiRes=time -e '$t = time; stat(\"/etc/hostname\") for 1..100000; \
                             printf(\"%.3f\\n\", (time - $t) * 1000)'";

/// Runs the stat workload `runs` times in sandbox `id`.
pub async fn stat_workload(client: &Client, id: &str, runs: usize) -> Series {
    let mut s = Series::default();
    let req = RunCommandRequest { command: Some(STAT_WORKLOAD.into()), ..Default::default() };
    for _ in 0..runs.clamp(1, 5) {
        let mut out = String::new();
        let r = client
            .exec(id, &req, |ev| {
                if ev.kind == "stdout" {
                    out.push_str(ev.text.as_deref().unwrap_or(""));
                }
            })
            .await;
        match (r, out.trim().parse::<f64>()) {
            (Ok(r), Ok(ms)) if r.exit_code == Some(0) => s.push_ms(ms),
            (Ok(r), _) => s.fail(format!("exit {:?}, output {out:?}", r.exit_code)),
            (Err(e), _) => s.fail(e),
        }
    }
    s
}

/// Memory per idle sandbox, MiB: the host's MemAvailable drop and the memory
/// charged to the sandboxes' cgroups (read from the host's cgroup tree, so
/// only when the bench runs on the daemon's host).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IdleMemory {
    pub sandboxes: usize,
    pub host_mib: Option<f64>,
    pub cgroup_mib: Option<f64>,
}

pub async fn idle_memory(client: &Client, class: &str, n: usize) -> Result<IdleMemory, String> {
    let req =
        CreateSandboxRequest { template: Some("host".into()), runtime_class: Some(class.into()), ..Default::default() };
    // Settle first: a previous class's teardown may still be returning memory.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = meminfo().map(|m| m.available);
    let mut ids = Vec::new();
    let mut err = None;
    for _ in 0..n {
        match client.create_sandbox(&req).await {
            Ok((info, _)) => ids.push(info.id),
            Err(e) => {
                err = Some(e.to_string());
                break;
            }
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = meminfo().map(|m| m.available);
    let charged: Vec<u64> = ids.iter().filter_map(|id| cgroup_memory(id)).collect();
    for id in &ids {
        let _ = client.delete_sandbox(id).await;
    }
    if let Some(e) = err {
        return Err(e);
    }
    let per = |bytes: f64| bytes / n as f64 / (1 << 20) as f64;
    Ok(IdleMemory {
        sandboxes: n,
        // Signed: on a busy host the drop can come out negative (noise, not a gain).
        host_mib: before.zip(after).map(|(b, a)| per(b as f64 - a as f64)),
        cgroup_mib: (charged.len() == n).then(|| per(charged.iter().sum::<u64>() as f64)),
    })
}

/// Memory charged to sandbox `id`'s cgroup (v1 `memory.usage_in_bytes` or v2
/// `memory.current`), found under any cgroup parent.
fn cgroup_memory(id: &str) -> Option<u64> {
    let roots = [("/sys/fs/cgroup/memory", "memory.usage_in_bytes"), ("/sys/fs/cgroup", "memory.current")];
    for (root, file) in roots {
        for parent in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let p = parent.path().join(id).join(file);
            if let Ok(t) = std::fs::read_to_string(&p) {
                return t.trim().parse().ok();
            }
        }
    }
    None
}
