//! A pool's refill launches behind the claims: its sandbox's cgroup weighs
//! the least in contended CPU from before its init is cloned until its agent
//! answers, then its limit's share. Every other launch (a cold create, a
//! rebind: someone waits on it) weighs the most until then, and while the
//! sandboxes' group is lowered (a node rebinding) it is born out of its CPU
//! cgroup (v1), sets up at the daemon's weight and moves itself in before
//! its exec; once up, while the node recovers, it and any sandbox claimed
//! meanwhile are kept ahead of the group's others until the recovery ends
//! and a while after.
//! Real launches (root, the host's cgroups, the static agent), the cgroup
//! calls seen through a wrapper that passes each on to the real hierarchy.
use ember_cgroups::{CgroupError, Cgroups, CpuShare, Limits, Usage};
use ember_runtime::native::{NativeConfig, NativeRuntime};
use ember_runtime::Runtime;
use ember_types::*;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The real hierarchy, and what was asked of it that matters here, in order.
#[derive(Debug)]
struct Seen {
    real: Box<dyn Cgroups>,
    calls: Mutex<Vec<String>>,
}

impl Seen {
    fn note(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

impl Cgroups for Seen {
    fn version(&self) -> &'static str {
        self.real.version()
    }
    fn create(&self, name: &str, limits: &Limits) -> Result<(), CgroupError> {
        self.note("create".into());
        self.real.create(name, limits)
    }
    fn set_cpu_share(&self, name: &str, share: CpuShare) -> Result<(), CgroupError> {
        self.note(format!("{share:?}"));
        self.real.set_cpu_share(name, share)
    }
    fn set_group_cpu_shares(&self, shares: Option<u64>) -> Result<(), CgroupError> {
        self.real.set_group_cpu_shares(shares)
    }
    fn attach(&self, name: &str, pid: i32) -> Result<(), CgroupError> {
        self.note("init in its group".into());
        self.real.attach(name, pid)
    }
    fn enter_thread(&self, name: &str) -> Result<bool, CgroupError> {
        let entered = self.real.enter_thread(name)?;
        if entered {
            self.note("init in its group".into());
        }
        Ok(entered)
    }
    fn enter_thread_but_cpu(&self, name: &str) -> Result<bool, CgroupError> {
        let entered = self.real.enter_thread_but_cpu(name)?;
        if entered {
            self.note("init in its group but cpu".into());
        }
        Ok(entered)
    }
    fn open_cpu_tasks(&self, name: &str) -> Result<Option<OwnedFd>, CgroupError> {
        let tasks = self.real.open_cpu_tasks(name)?;
        if tasks.is_some() {
            self.note("its cpu group's tasks, for the init".into());
        }
        Ok(tasks)
    }
    fn group_lowered(&self) -> bool {
        self.real.group_lowered()
    }
    fn open_dir(&self, name: &str) -> Result<Option<OwnedFd>, CgroupError> {
        let dir = self.real.open_dir(name)?;
        if dir.is_some() {
            self.note("init in its group".into());
        }
        Ok(dir)
    }
    fn oom_source(&self) -> Result<OwnedFd, CgroupError> {
        self.real.oom_source()
    }
    fn oom_report_to(&self, name: &str, source: BorrowedFd<'_>) -> Result<(), CgroupError> {
        self.real.oom_report_to(name, source)
    }
    fn oom_kills(&self, name: &str) -> Result<u64, CgroupError> {
        self.real.oom_kills(name)
    }
    fn freeze(&self, name: &str, frozen: bool) -> Result<(), CgroupError> {
        self.real.freeze(name, frozen)
    }
    fn is_frozen(&self, name: &str) -> Result<bool, CgroupError> {
        self.real.is_frozen(name)
    }
    fn procs(&self, name: &str) -> Result<Vec<i32>, CgroupError> {
        self.real.procs(name)
    }
    fn usage(&self, name: &str) -> Result<Usage, CgroupError> {
        self.real.usage(name)
    }
    fn memory_bytes(&self, name: &str) -> Result<u64, CgroupError> {
        self.real.memory_bytes(name)
    }
    fn read_limits(&self, name: &str) -> Result<Limits, CgroupError> {
        self.real.read_limits(name)
    }
    fn destroy(&self, name: &str) -> Result<(), CgroupError> {
        self.real.destroy(name)
    }
    fn list(&self) -> Result<Vec<String>, CgroupError> {
        self.real.list()
    }
    fn exists(&self, name: &str) -> bool {
        self.real.exists(name)
    }
    fn remove_group(&self) -> Result<(), CgroupError> {
        self.real.remove_group()
    }
}

fn agent_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("EMBER_AGENT_BIN") {
        return p.into();
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/ember-agent-static");
    assert!(p.exists(), "no static agent at {}: run scripts/build-agent.sh (or set EMBER_AGENT_BIN)", p.display());
    p
}

fn spec() -> SandboxSpec {
    let mut spec = SandboxSpec::host("native");
    spec.resources.cpu_millis = 500;
    spec
}

/// The kernel's own weight of the sandbox's group, read from the cpu
/// hierarchy its init is in (`/proc/PID/cgroup`).
fn kernel_weight(pid: i32) -> u64 {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("its cgroups");
    let file = cg
        .lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            match ctrls {
                "" => Some(format!("/sys/fs/cgroup{path}/cpu.weight")),
                c if c.split(',').any(|c| c == "cpu") => Some(format!("/sys/fs/cgroup/{c}{path}/cpu.shares")),
                _ => None,
            }
        })
        .expect("a cpu hierarchy");
    std::fs::read_to_string(&file).expect("the weight file").trim().parse().expect("a number")
}

/// A native runtime on the host's cgroups under a group of its own (`tag`),
/// the calls seen, and the weight of a sandbox of [`spec`] once up.
fn runtime(tag: &str) -> (Cleanup, Arc<Seen>, NativeRuntime, u64) {
    let pid = std::process::id();
    let group = format!("ember-bgl-{tag}-{pid}");
    let data = std::env::temp_dir().join(&group);
    let _ = std::fs::remove_dir_all(&data);
    std::fs::create_dir_all(&data).expect("data dir");
    let cleanup = Cleanup { data: data.clone(), group: group.clone() };
    let real = ember_cgroups::detect("/sys/fs/cgroup".as_ref(), &group).expect("a cgroup hierarchy");
    let seen = Arc::new(Seen { real, calls: Mutex::default() });
    let cfg = NativeConfig {
        data_dir: data.clone(),
        agent_path: agent_bin(),
        uid_base: 1_700_000_000,
        id_ranges: 4,
        ready_timeout: ember_runtime::READY_TIMEOUT,
    };
    let rt = NativeRuntime::new(cfg, seen.clone()).expect("the native runtime");
    let want = if seen.version() == "v2" { ember_cgroups::cpu_weight(500) } else { ember_cgroups::cpu_shares(500) };
    (cleanup, seen, rt, want)
}

#[test]
fn a_refill_launches_at_the_least_cpu_weight_a_cold_launch_at_the_most_each_set_back_once_up() {
    let (cleanup, seen, rt, want) = runtime("each");
    let group = cleanup.group.clone();

    let refill = SandboxId::from_random([1; 16]);
    let up = ember_runtime::in_background(|| rt.launch(&refill, &spec())).expect("a refill's launch");
    let calls = seen.take();
    let weight = kernel_weight(up.pid);
    rt.destroy(&refill, Some(&up.pidfd)).expect("destroy");
    assert_eq!(calls, ["create", "Background", "init in its group", "Limit(500)"], "a refill's cgroup calls");
    assert_eq!(weight, want, "a refill's group once up");

    let cold = SandboxId::from_random([2; 16]);
    let up = rt.launch(&cold, &spec()).expect("a cold launch");
    let calls = seen.take();
    let weight = kernel_weight(up.pid);
    rt.destroy(&cold, Some(&up.pidfd)).expect("destroy");
    assert_eq!(calls, ["create", "Foreground", "init in its group", "Limit(500)"], "a cold launch's cgroup calls");
    assert_eq!(weight, want, "a cold launch's group");

    // The node rebinds: its sandboxes' group lowered. On v1 a launch someone
    // waits on is born out of its CPU cgroup and moves itself in (where it
    // is once up says it did); a refill is not (it is to wait).
    seen.set_group_cpu_shares(Some(128)).expect("the group lowered");
    let rebind = SandboxId::from_random([3; 16]);
    let up = rt.launch(&rebind, &spec()).expect("a launch while the group is lowered");
    let calls = seen.take();
    let (weight, cpu_group) = (kernel_weight(up.pid), cpu_group(up.pid));
    rt.destroy(&rebind, Some(&up.pidfd)).expect("destroy");
    let refill = SandboxId::from_random([4; 16]);
    let up = ember_runtime::in_background(|| rt.launch(&refill, &spec())).expect("a refill while lowered");
    let refill_calls = seen.take();
    rt.destroy(&refill, Some(&up.pidfd)).expect("destroy");
    if seen.version() == "v1" {
        let want_calls =
            ["create", "Foreground", "its cpu group's tasks, for the init", "init in its group but cpu", "Limit(500)"];
        assert_eq!(calls, want_calls, "a launch's cgroup calls while the group is lowered");
    } else {
        assert_eq!(calls, ["create", "Foreground", "init in its group", "Limit(500)"], "v2: one hierarchy");
    }
    assert!(cpu_group.ends_with(&format!("/{group}/{rebind}")), "its cpu cgroup once up: {cpu_group}");
    assert_eq!(weight, want, "its group's weight once up");
    assert_eq!(refill_calls, ["create", "Background", "init in its group", "Limit(500)"], "a refill while lowered");
}

#[test]
fn while_the_node_recovers_a_launch_or_claim_someone_waits_on_is_kept_ahead_until_it_ends_and_a_while_after() {
    let (_cleanup, seen, rt, want) = runtime("rec");
    let ahead = if seen.version() == "v2" { CpuShare::Ahead.weight() } else { CpuShare::Ahead.shares() };
    // An idle member (a pool's, a rebind's standby), claimed once before
    // the recovery (nothing changes) and once while it lasts.
    let member = SandboxId::from_random([8; 16]);
    let idle = ember_runtime::in_background(|| rt.launch(&member, &spec())).expect("an idle member");
    rt.claimed(&member, &spec()).expect("a claim before the recovery");
    let before = kernel_weight(idle.pid);
    rt.recovering(true);
    seen.set_group_cpu_shares(Some(128)).expect("the group lowered");
    rt.claimed(&member, &spec()).expect("a claim while the node recovers");
    let rebind = SandboxId::from_random([5; 16]);
    let rebound = rt.launch(&rebind, &spec()).expect("a launch while the node recovers");
    let up = std::time::Instant::now();
    let refill = SandboxId::from_random([6; 16]);
    let refilled = ember_runtime::in_background(|| rt.launch(&refill, &spec())).expect("a refill while it recovers");
    let gone = SandboxId::from_random([7; 16]);
    let removed = rt.launch(&gone, &spec()).expect("a launch removed before the recovery ends");
    rt.destroy(&gone, Some(&removed.pidfd)).expect("destroy");
    let during = (kernel_weight(rebound.pid), kernel_weight(refilled.pid), kernel_weight(idle.pid));
    seen.take();
    rt.recovering(false);
    seen.set_group_cpu_shares(None).expect("the group raised");
    let (just_after, soon) = (kernel_weight(rebound.pid), up.elapsed() < ember_runtime::native::KEEP_AFTER_UP);
    // Set back by a thread once its time is up: waited for (what is timed
    // is the kernel's answer, not a figure).
    let deadline = up + ember_runtime::native::KEEP_AFTER_UP + std::time::Duration::from_secs(30);
    let back = || kernel_weight(rebound.pid) == want && kernel_weight(idle.pid) == want;
    while !back() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (after, calls) = ((kernel_weight(rebound.pid), kernel_weight(idle.pid)), seen.take());
    rt.destroy(&rebind, Some(&rebound.pidfd)).expect("destroy");
    rt.destroy(&refill, Some(&refilled.pidfd)).expect("destroy");
    rt.destroy(&member, Some(&idle.pidfd)).expect("destroy");
    assert_eq!(before, want, "a claim while no recovery runs leaves the weight as it is");
    assert_eq!(during, (ahead, want, ahead), "a rebind's, a refill's and a claim's weights while the node recovers");
    if soon {
        assert_eq!(just_after, ahead, "the rebind's weight as the recovery ends, before its time is up");
    }
    // The one removed meanwhile is skipped, those kept set back.
    assert_eq!(calls, ["Limit(500)", "Limit(500)"], "after the recovery's end");
    assert_eq!(after, (want, want), "the rebind's and the claim's weights once their time is up");
}

/// The cgroup path of `pid` in the cpu hierarchy (v2: the one hierarchy).
fn cpu_group(pid: i32) -> String {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("its cgroups");
    cg.lines()
        .find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
            (ctrls.is_empty() || ctrls.split(',').any(|c| c == "cpu")).then(|| path.to_string())
        })
        .expect("a cpu hierarchy")
}

/// What the test leaves on the host, removed when it ends, a failure included
/// (the sandboxes are destroyed before any assertion).
struct Cleanup {
    data: PathBuf,
    group: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(cg) = ember_cgroups::detect("/sys/fs/cgroup".as_ref(), &self.group) {
            let _ = cg.remove_group();
        }
        // The runtime keeps its sandboxes' dirs in a tmpfs of their own.
        let _ = std::process::Command::new("umount").arg("-l").arg(self.data.join("sandboxes")).status();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
