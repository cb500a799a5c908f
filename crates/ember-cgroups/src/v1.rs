//! cgroup v1: one directory per controller hierarchy (`memory`, `cpu`, `pids`,
//! `freezer`), found through `/proc/self/mountinfo` so co-mounted layouts such as
//! `cpu,cpuacct` work too.
use crate::{io_err, parse_procs, read, read_key, rmdir_retry, write, CgroupError, Cgroups, CpuShare, Limits, Usage};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

const CONTROLLERS: [&str; 4] = ["memory", "cpu", "pids", "freezer"];
/// Accounting-only hierarchies, for `usage` (cpu time, block IO): joined
/// when mounted, never required.
const ACCOUNTING: [&str; 2] = ["cpuacct", "blkio"];

#[derive(Debug)]
pub struct V1 {
    /// Mount point of each controller in [`CONTROLLERS`], same order.
    roots: [PathBuf; 4],
    /// Mount point of each of [`ACCOUNTING`], same order, if mounted.
    accounting: [Option<PathBuf>; 2],
    /// Parent group of every sandbox cgroup (`ember` by default): one per daemon,
    /// so daemons sharing a host never touch each other's sandboxes.
    group: String,
    /// The group's CPU weight is below the default (`set_group_cpu_shares`).
    lowered: AtomicBool,
}

impl V1 {
    pub fn from_mountinfo(group: &str) -> Result<V1, CgroupError> {
        let mi = read(Path::new("/proc/self/mountinfo"))?;
        let find = |ctrl: &str| -> Option<PathBuf> {
            mi.lines().find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                let mut r = right.split_whitespace();
                if r.next()? != "cgroup" {
                    return None;
                }
                let opts = r.nth(1)?;
                let mnt = left.split_whitespace().nth(4)?;
                opts.split(',').any(|o| o == ctrl).then(|| PathBuf::from(mnt))
            })
        };
        let mut roots: [PathBuf; 4] = Default::default();
        for (i, c) in CONTROLLERS.iter().enumerate() {
            roots[i] =
                find(c).ok_or_else(|| CgroupError::NoHierarchy(format!("cgroup v1 controller {c} is not mounted")))?;
        }
        let accounting = ACCOUNTING.map(find);
        Ok(V1 { roots, accounting, group: group.to_string(), lowered: AtomicBool::new(false) })
    }

    /// Every hierarchy a sandbox's group is made in: the controllers, then the
    /// accounting ones not co-mounted with one of them (`cpu,cpuacct`).
    fn all_roots(&self) -> Vec<&PathBuf> {
        let extra = self.accounting.iter().flatten().filter(|a| !self.roots.contains(a));
        self.roots.iter().chain(extra).collect()
    }

    fn accounting_dir(&self, i: usize, name: &str) -> Option<PathBuf> {
        self.accounting[i].as_ref().map(|r| r.join(&self.group).join(name))
    }

    fn dir(&self, ctrl: usize, name: &str) -> PathBuf {
        self.roots[ctrl].join(&self.group).join(name)
    }
}

const MEM: usize = 0;
const CPU: usize = 1;
const PIDS: usize = 2;
const FREEZER: usize = 3;

impl Cgroups for V1 {
    fn version(&self) -> &'static str {
        "v1"
    }

    fn create(&self, name: &str, l: &Limits) -> Result<(), CgroupError> {
        for root in self.all_roots() {
            let d = root.join(&self.group).join(name);
            std::fs::create_dir_all(&d).map_err(io_err("mkdir", &d))?;
        }
        let mem = self.dir(MEM, name);
        write(&mem.join("memory.limit_in_bytes"), &l.memory_bytes.to_string())?;
        // memsw = limit means no swap on top of the memory limit (absent when the
        // kernel runs without swap accounting, and then there is nothing to cap).
        let memsw = mem.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write(&memsw, &l.memory_bytes.to_string())?;
        }
        let _ = write(&mem.join("memory.swappiness"), "0");
        let cpu = self.dir(CPU, name);
        write(&cpu.join("cpu.cfs_period_us"), "100000")?;
        write(&cpu.join("cpu.cfs_quota_us"), &(l.cpu_millis * 100).to_string())?;
        write(&cpu.join("cpu.shares"), &CpuShare::Limit(l.cpu_millis).shares().to_string())?;
        write(&self.dir(PIDS, name).join("pids.max"), &l.pids.to_string())?;
        Ok(())
    }

    fn set_cpu_share(&self, name: &str, share: CpuShare) -> Result<(), CgroupError> {
        write(&self.dir(CPU, name).join("cpu.shares"), &share.shares().to_string())
    }

    fn set_group_cpu_shares(&self, shares: Option<u64>) -> Result<(), CgroupError> {
        let g = self.roots[CPU].join(&self.group);
        std::fs::create_dir_all(&g).map_err(io_err("mkdir", &g))?;
        let shares = shares.unwrap_or(1024).clamp(2, 262_144);
        write(&g.join("cpu.shares"), &shares.to_string())?;
        self.lowered.store(shares < 1024, Ordering::Relaxed);
        Ok(())
    }

    fn attach(&self, name: &str, pid: i32) -> Result<(), CgroupError> {
        for root in self.all_roots() {
            write(&root.join(&self.group).join(name).join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// `0` into each hierarchy's `tasks`: the calling thread. The kernel
    /// takes no threadgroup lock to move `current` alone.
    fn enter_thread(&self, name: &str) -> Result<bool, CgroupError> {
        for root in self.all_roots() {
            write(&root.join(&self.group).join(name).join("tasks"), "0")?;
        }
        Ok(true)
    }

    /// As `enter_thread`, the cpu hierarchy left out (with whatever is
    /// co-mounted with it, `cpuacct`).
    fn enter_thread_but_cpu(&self, name: &str) -> Result<bool, CgroupError> {
        for root in self.all_roots().into_iter().filter(|r| **r != self.roots[CPU]) {
            write(&root.join(&self.group).join(name).join("tasks"), "0")?;
        }
        Ok(true)
    }

    fn open_cpu_tasks(&self, name: &str) -> Result<Option<OwnedFd>, CgroupError> {
        let tasks = self.dir(CPU, name).join("tasks");
        let f = std::fs::OpenOptions::new().write(true).open(&tasks).map_err(io_err("open", &tasks))?;
        Ok(Some(f.into()))
    }

    fn group_lowered(&self) -> bool {
        self.lowered.load(Ordering::Relaxed)
    }

    fn oom_source(&self) -> Result<OwnedFd, CgroupError> {
        Ok(ember_sys::fd::eventfd()?)
    }

    /// One eventfd may be registered with any number of cgroups; the kernel
    /// drops a registration when its cgroup is removed.
    fn oom_report_to(&self, name: &str, source: BorrowedFd<'_>) -> Result<(), CgroupError> {
        let mem = self.dir(MEM, name);
        let oc = mem.join("memory.oom_control");
        let ocf = std::fs::File::open(&oc).map_err(io_err("open", &oc))?;
        let line = format!("{} {}", source.as_raw_fd(), ocf.as_raw_fd());
        write(&mem.join("cgroup.event_control"), &line)
    }

    fn oom_kills(&self, name: &str) -> Result<u64, CgroupError> {
        read_key(&self.dir(MEM, name).join("memory.oom_control"), "oom_kill")
    }

    fn freeze(&self, name: &str, frozen: bool) -> Result<(), CgroupError> {
        let p = self.dir(FREEZER, name).join("freezer.state");
        crate::freeze_with(self, name, frozen, |f| write(&p, if f { "FROZEN" } else { "THAWED" }))
    }

    fn is_frozen(&self, name: &str) -> Result<bool, CgroupError> {
        Ok(read(&self.dir(FREEZER, name).join("freezer.state"))?.trim() == "FROZEN")
    }

    fn procs(&self, name: &str) -> Result<Vec<i32>, CgroupError> {
        Ok(parse_procs(&read(&self.dir(PIDS, name).join("cgroup.procs"))?))
    }

    fn usage(&self, name: &str) -> Result<Usage, CgroupError> {
        let m = read(&self.dir(MEM, name).join("memory.usage_in_bytes"))?;
        let p = read(&self.dir(PIDS, name).join("pids.current"))?;
        // Accounting files are optional: a group made before its hierarchy was
        // joined (or one the hierarchy lacks) reports no figure.
        let acct = |i: usize, file: &str| self.accounting_dir(i, name).and_then(|d| read(&d.join(file)).ok());
        let cpu = acct(0, "cpuacct.usage").and_then(|s| s.trim().parse::<u64>().ok()).map(|ns| ns / 1000);
        let io = acct(1, "blkio.throttle.io_service_bytes").map(|s| crate::parse_io(&s));
        Ok(Usage {
            memory_bytes: m.trim().parse().unwrap_or(0),
            pids: p.trim().parse().unwrap_or(0),
            cpu_usage_micros: cpu,
            io_read_bytes: io.map(|i| i.0),
            io_write_bytes: io.map(|i| i.1),
        })
    }

    fn memory_bytes(&self, name: &str) -> Result<u64, CgroupError> {
        Ok(read(&self.dir(MEM, name).join("memory.usage_in_bytes"))?.trim().parse().unwrap_or(0))
    }

    fn read_limits(&self, name: &str) -> Result<Limits, CgroupError> {
        let num = |p: PathBuf| -> Result<u64, CgroupError> { Ok(read(&p)?.trim().parse().unwrap_or(u64::MAX)) };
        let quota = read(&self.dir(CPU, name).join("cpu.cfs_quota_us"))?.trim().parse::<i64>().unwrap_or(-1);
        let period = num(self.dir(CPU, name).join("cpu.cfs_period_us"))?.max(1);
        Ok(Limits {
            memory_bytes: num(self.dir(MEM, name).join("memory.limit_in_bytes"))?,
            cpu_millis: if quota < 0 { 0 } else { quota as u64 * 1000 / period },
            pids: num(self.dir(PIDS, name).join("pids.max"))?,
        })
    }

    fn destroy(&self, name: &str) -> Result<(), CgroupError> {
        if !self.exists(name) {
            return Ok(());
        }
        // Freeze first so nothing can fork while we kill, then thaw so the
        // SIGKILLs are delivered.
        let frozen = self.freeze(name, true).is_ok();
        for round in 0..50u32 {
            let procs = self.procs(name).unwrap_or_default();
            if procs.is_empty() {
                break;
            }
            for p in procs {
                ember_sys::pidfd::kill(p, libc_sigkill())?;
            }
            if frozen && round == 0 {
                let _ = self.freeze(name, false);
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let _ = self.freeze(name, false);
        for root in self.all_roots() {
            rmdir_retry(&root.join(&self.group).join(name))?;
        }
        Ok(())
    }

    fn list(&self) -> Result<Vec<String>, CgroupError> {
        let mut out = Vec::new();
        for root in self.all_roots() {
            let Ok(rd) = std::fs::read_dir(root.join(&self.group)) else { continue };
            for e in rd.flatten() {
                if e.path().is_dir() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if !out.contains(&n) {
                        out.push(n);
                    }
                }
            }
        }
        Ok(out)
    }

    fn exists(&self, name: &str) -> bool {
        (0..CONTROLLERS.len()).any(|i| self.dir(i, name).exists())
    }

    fn remove_group(&self) -> Result<(), CgroupError> {
        for root in self.all_roots() {
            rmdir_retry(&root.join(&self.group))?;
        }
        Ok(())
    }
}

pub(crate) fn libc_sigkill() -> i32 {
    9
}
