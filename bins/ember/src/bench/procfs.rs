//! What `bench density` reads from the host's /proc: memory counters, the
//! daemon's pid (the process listening on its port) and its agent children.
use std::collections::BTreeSet;

/// /proc/meminfo counters, bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemInfo {
    pub available: u64,
    pub slab: u64,
    pub slab_unreclaimable: u64,
    pub page_tables: u64,
    pub kernel_stack: u64,
    pub percpu: u64,
}

pub fn meminfo() -> Option<MemInfo> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let mut m = MemInfo::default();
    let mut seen = false;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(key), Some(kb)) = (it.next(), it.next().and_then(|v| v.parse::<u64>().ok())) else { continue };
        let slot = match key {
            "MemAvailable:" => {
                seen = true;
                &mut m.available
            }
            "Slab:" => &mut m.slab,
            "SUnreclaim:" => &mut m.slab_unreclaimable,
            "PageTables:" => &mut m.page_tables,
            "KernelStack:" => &mut m.kernel_stack,
            "Percpu:" => &mut m.percpu,
            _ => continue,
        };
        *slot = kb * 1024;
    }
    seen.then_some(m)
}

pub fn loadavg() -> String {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    s.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// The pid of the process listening on TCP `port` (any address), found
/// through the socket's inode; `None` when it is not on this host (or not
/// visible from here).
pub fn listener_pid(port: u16) -> Option<i32> {
    let mut inodes = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else { continue };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st queues timer retrnsmt uid timeout inode
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let p = f[1].rsplit(':').next().and_then(|h| u16::from_str_radix(h, 16).ok());
            if p == Some(port) {
                inodes.insert(format!("socket:[{}]", f[9]));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    pids().into_iter().find(|pid| {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.to_str().is_some_and(|l| inodes.contains(l))))
    })
}

fn pids() -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else { return Vec::new() };
    rd.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

/// Children of `ppid` whose command name starts with `prefix` (the kernel
/// keeps 15 characters: `ember-agent-static` is `ember-agent-sta`).
pub fn children_named(ppid: i32, prefix: &str) -> BTreeSet<i32> {
    pids()
        .into_iter()
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
            // pid (comm) state ppid ...: comm may hold spaces and parentheses.
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { return false };
            let comm = &stat[open + 1..close];
            let parent = stat[close + 1..].split_whitespace().nth(1).and_then(|p| p.parse::<i32>().ok());
            parent == Some(ppid) && comm.starts_with(prefix)
        })
        .collect()
}

/// A process's memory, bytes: resident, proportional (shared pages split
/// among their users) and private (USS), the last two from smaps_rollup.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcMem {
    pub rss: u64,
    pub pss: Option<u64>,
    pub uss: Option<u64>,
}

pub fn proc_mem(pid: i32) -> Option<ProcMem> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = kb_field(&status, "VmRSS:")?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok();
    let field = |k| rollup.as_deref().and_then(|r| kb_field(r, k));
    let uss = field("Private_Clean:").zip(field("Private_Dirty:")).map(|(a, b)| a + b);
    Some(ProcMem { rss, pss: field("Pss:"), uss })
}

fn kb_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// The port of an `http://host:port` address.
pub fn port_of(url: &str) -> Option<u16> {
    let rest = url.strip_prefix("http://")?;
    let authority = rest.split('/').next()?;
    authority.rsplit(':').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_fields() {
        assert_eq!(port_of("http://127.0.0.1:8299"), Some(8299));
        assert_eq!(port_of("http://[::1]:80/"), Some(80));
        assert_eq!(port_of("https://x:1"), None);
        let rollup = "Rss:  2928 kB\nPss:   244 kB\nPss_Anon: 200 kB\nPrivate_Clean: 4 kB\n";
        assert_eq!(kb_field(rollup, "Pss:"), Some(244 * 1024));
        assert_eq!(kb_field(rollup, "Private_Dirty:"), None);
    }

    #[test]
    fn this_process_is_readable() {
        let m = proc_mem(std::process::id() as i32).expect("own /proc entry");
        assert!(m.rss > 0);
        assert!(meminfo().is_some_and(|m| m.available > 0));
    }
}
