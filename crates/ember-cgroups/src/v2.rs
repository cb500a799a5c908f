//! cgroup v2: one unified tree; `ember/<name>` with the memory, cpu and pids
//! controllers enabled on `ember`. OOM kills are read from `memory.events`, whose
//! modification is watched with inotify; `cgroup.kill` kills the whole group.
use crate::{io_err, parse_procs, read, read_key, rmdir_retry, write, CgroupError, Cgroups, CpuShare, Limits, Usage};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;

#[derive(Debug)]
pub struct V2 {
    root: PathBuf,
    group: String,
}

impl V2 {
    pub fn new(root: PathBuf, group: &str) -> Result<V2, CgroupError> {
        let g = root.join(group);
        std::fs::create_dir_all(&g).map_err(io_err("mkdir", &g))?;
        // Enabling controllers for children fails if they are already enabled with
        // processes in the group; both outcomes leave them usable.
        let _ = write(&root.join("cgroup.subtree_control"), "+memory +cpu +pids");
        write(&g.join("cgroup.subtree_control"), "+memory +cpu +pids")?;
        Ok(V2 { root, group: group.to_string() })
    }

    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(&self.group).join(name)
    }
}

impl Cgroups for V2 {
    fn version(&self) -> &'static str {
        "v2"
    }

    fn create(&self, name: &str, l: &Limits) -> Result<(), CgroupError> {
        let d = self.dir(name);
        std::fs::create_dir_all(&d).map_err(io_err("mkdir", &d))?;
        write(&d.join("memory.max"), &l.memory_bytes.to_string())?;
        let swap = d.join("memory.swap.max");
        if swap.exists() {
            write(&swap, "0")?;
        }
        // One OOM kill ends the whole sandbox, as Kubernetes does on v2.
        let _ = write(&d.join("memory.oom.group"), "1");
        write(&d.join("cpu.max"), &format!("{} 100000", l.cpu_millis * 100))?;
        write(&d.join("cpu.weight"), &CpuShare::Limit(l.cpu_millis).weight().to_string())?;
        write(&d.join("pids.max"), &l.pids.to_string())?;
        Ok(())
    }

    fn set_cpu_share(&self, name: &str, share: CpuShare) -> Result<(), CgroupError> {
        write(&self.dir(name).join("cpu.weight"), &share.weight().to_string())
    }

    fn set_group_cpu_shares(&self, shares: Option<u64>) -> Result<(), CgroupError> {
        // `new` made the group.
        let weight = shares.map_or(100, crate::weight_of_shares);
        write(&self.root.join(&self.group).join("cpu.weight"), &weight.to_string())
    }

    fn attach(&self, name: &str, pid: i32) -> Result<(), CgroupError> {
        write(&self.dir(name).join("cgroup.procs"), &pid.to_string())
    }

    fn open_dir(&self, name: &str) -> Result<Option<OwnedFd>, CgroupError> {
        // A directory opens read-only like a file (close-on-exec, as std does).
        let d = self.dir(name);
        let f = std::fs::File::open(&d).map_err(io_err("open", &d))?;
        Ok(Some(f.into()))
    }

    fn oom_source(&self) -> Result<OwnedFd, CgroupError> {
        Ok(ember_sys::fd::inotify()?)
    }

    /// A watch on the source's inotify instance: a user has 128 instances by
    /// default (`fs.inotify.max_user_instances`) and far more watches, so
    /// sandboxes share instances.
    fn oom_report_to(&self, name: &str, source: BorrowedFd<'_>) -> Result<(), CgroupError> {
        let p = self.dir(name).join("memory.events");
        Ok(ember_sys::fd::inotify_watch_modify(source, &p.to_string_lossy())?)
    }

    fn oom_kills(&self, name: &str) -> Result<u64, CgroupError> {
        read_key(&self.dir(name).join("memory.events"), "oom_kill")
    }

    fn freeze(&self, name: &str, frozen: bool) -> Result<(), CgroupError> {
        let p = self.dir(name).join("cgroup.freeze");
        crate::freeze_with(self, name, frozen, |f| write(&p, if f { "1" } else { "0" }))
    }

    fn is_frozen(&self, name: &str) -> Result<bool, CgroupError> {
        Ok(read_key(&self.dir(name).join("cgroup.events"), "frozen")? == 1)
    }

    fn procs(&self, name: &str) -> Result<Vec<i32>, CgroupError> {
        Ok(parse_procs(&read(&self.dir(name).join("cgroup.procs"))?))
    }

    fn usage(&self, name: &str) -> Result<Usage, CgroupError> {
        let d = self.dir(name);
        // io.stat exists only where the io controller is enabled for the group.
        let io = read(&d.join("io.stat")).ok().map(|s| crate::parse_io(&s));
        Ok(Usage {
            memory_bytes: read(&d.join("memory.current"))?.trim().parse().unwrap_or(0),
            pids: read(&d.join("pids.current"))?.trim().parse().unwrap_or(0),
            cpu_usage_micros: Some(read_key(&d.join("cpu.stat"), "usage_usec")?),
            io_read_bytes: io.map(|i| i.0),
            io_write_bytes: io.map(|i| i.1),
        })
    }

    fn memory_bytes(&self, name: &str) -> Result<u64, CgroupError> {
        Ok(read(&self.dir(name).join("memory.current"))?.trim().parse().unwrap_or(0))
    }

    fn read_limits(&self, name: &str) -> Result<Limits, CgroupError> {
        let d = self.dir(name);
        let num = |f: &str| -> Result<u64, CgroupError> { Ok(read(&d.join(f))?.trim().parse().unwrap_or(u64::MAX)) };
        let cpu = read(&d.join("cpu.max"))?;
        let mut it = cpu.split_whitespace();
        let quota = it.next().and_then(|q| q.parse::<u64>().ok());
        let period = it.next().and_then(|p| p.parse::<u64>().ok()).unwrap_or(100000).max(1);
        Ok(Limits {
            memory_bytes: num("memory.max")?,
            cpu_millis: quota.map_or(0, |q| q * 1000 / period),
            pids: num("pids.max")?,
        })
    }

    fn destroy(&self, name: &str) -> Result<(), CgroupError> {
        let d = self.dir(name);
        if !d.exists() {
            return Ok(());
        }
        let kill = d.join("cgroup.kill");
        if kill.exists() {
            write(&kill, "1")?;
        } else {
            for p in self.procs(name)? {
                ember_sys::pidfd::kill(p, crate::v1::libc_sigkill())?;
            }
        }
        rmdir_retry(&d)
    }

    fn list(&self) -> Result<Vec<String>, CgroupError> {
        let g = self.root.join(&self.group);
        let rd = std::fs::read_dir(&g).map_err(io_err("readdir", &g))?;
        Ok(rd.flatten().filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
    }

    fn exists(&self, name: &str) -> bool {
        self.dir(name).exists()
    }

    fn remove_group(&self) -> Result<(), CgroupError> {
        rmdir_retry(&self.root.join(&self.group))
    }
}

#[cfg(test)]
mod tests {
    //! The file protocol against a directory laid out like cgroupfs: what is
    //! written where, and how it is read back. The real v2 kernel runs
    //! tests/host.rs in scripts/cgroup-v2-guest.sh (this project's hosts keep
    //! their controllers in v1 hierarchies).
    use super::*;

    fn fake_root(tag: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("ember-cgv2-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("tmp root");
        std::fs::write(root.join("cgroup.subtree_control"), "").expect("subtree");
        std::fs::create_dir_all(root.join("g")).expect("group");
        std::fs::write(root.join("g/cgroup.subtree_control"), "").expect("group subtree");
        root
    }

    #[test]
    fn limits_are_written_in_v2_syntax_and_read_back() {
        let root = fake_root("limits");
        let cg = V2::new(root.clone(), "g").expect("v2");
        let d = root.join("g/s1");
        std::fs::create_dir_all(&d).expect("dir");
        // cgroupfs creates these files itself; a plain directory needs them first.
        std::fs::write(d.join("memory.swap.max"), "max").expect("swap");
        let l = Limits { memory_bytes: 64 << 20, cpu_millis: 500, pids: 99 };
        cg.create("s1", &l).expect("create");
        assert_eq!(std::fs::read_to_string(d.join("memory.max")).unwrap(), (64u64 << 20).to_string());
        assert_eq!(std::fs::read_to_string(d.join("memory.swap.max")).unwrap(), "0");
        assert_eq!(std::fs::read_to_string(d.join("cpu.max")).unwrap(), "50000 100000");
        assert_eq!(std::fs::read_to_string(d.join("cpu.weight")).unwrap(), "20");
        cg.set_cpu_share("s1", CpuShare::Background).expect("background");
        assert_eq!(std::fs::read_to_string(d.join("cpu.weight")).unwrap(), "1");
        cg.set_cpu_share("s1", CpuShare::Foreground).expect("foreground");
        assert_eq!(std::fs::read_to_string(d.join("cpu.weight")).unwrap(), "10000");
        cg.set_cpu_share("s1", CpuShare::Limit(500)).expect("set back");
        assert_eq!(std::fs::read_to_string(d.join("cpu.weight")).unwrap(), "20");
        // The parent's weight: 1024 shares are v2's 39 (runc's conversion), 102 its 4.
        cg.set_group_cpu_shares(Some(1024)).expect("group");
        assert_eq!(std::fs::read_to_string(root.join("g/cpu.weight")).unwrap(), "39");
        cg.set_group_cpu_shares(Some(102)).expect("group");
        assert_eq!(std::fs::read_to_string(root.join("g/cpu.weight")).unwrap(), "4");
        cg.set_group_cpu_shares(None).expect("group");
        assert_eq!(std::fs::read_to_string(root.join("g/cpu.weight")).unwrap(), "100", "the kernel's default");
        assert_eq!(std::fs::read_to_string(d.join("pids.max")).unwrap(), "99");
        assert_eq!(cg.read_limits("s1").expect("read back"), l);
        std::fs::write(d.join("memory.events"), "low 0\nhigh 0\nmax 4\noom 2\noom_kill 1\n").expect("events");
        assert_eq!(cg.oom_kills("s1").expect("oom"), 1);
        assert_eq!(cg.list().expect("list"), vec!["s1".to_string()]);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A pool's status reads each idle member's memory: one file, none of
    /// the others `usage` opens.
    #[test]
    fn memory_in_use_is_read_from_its_one_file() {
        let root = fake_root("memory");
        let cg = V2::new(root.clone(), "g").expect("v2");
        let d = root.join("g/m1");
        std::fs::create_dir_all(&d).expect("dir");
        std::fs::write(d.join("memory.current"), "1234567\n").expect("memory.current");
        assert_eq!(cg.memory_bytes("m1").expect("memory in use"), 1_234_567);
        assert!(cg.memory_bytes("absent").is_err(), "a group that is gone is an error, not 0");
        let _ = std::fs::remove_dir_all(&root);
    }
}
