//! Against the host's real cgroup hierarchy (v1 on this project's machines, v2
//! elsewhere). Runs as root, as CI does.
use ember_cgroups::{detect, CpuShare, Limits};
use std::process::Command;

#[test]
fn create_attach_freeze_destroy_on_the_real_hierarchy() {
    let group = format!("ember-cgtest-{}", std::process::id());
    let cg = detect("/sys/fs/cgroup".as_ref(), &group).expect("a usable cgroup hierarchy");
    let l = Limits { memory_bytes: 96 << 20, cpu_millis: 250, pids: 16 };
    cg.create("c1", &l).expect("create");
    assert_eq!(cg.read_limits("c1").expect("read back"), l);
    // A busy loop: its CPU time stops growing while frozen.
    let mut child = Command::new("sh").args(["-c", "while :; do :; done"]).spawn().expect("spin");
    cg.attach("c1", child.id() as i32).expect("attach");
    assert_eq!(cg.procs("c1").expect("procs"), vec![child.id() as i32]);
    assert!(cg.usage("c1").expect("usage").pids >= 1);
    let cpu = || -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).expect("stat");
        let f: Vec<&str> = s[s.rfind(')').expect(")") + 2..].split_whitespace().collect();
        f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
    };
    cg.freeze("c1", true).expect("freeze");
    // Read after a moment: time run just before the freeze can reach
    // /proc a tick late (the cgroup v2 guest under qemu saw 4 then 5 ticks);
    // a busy loop running while frozen would add some 30 in the 300 ms.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let frozen_at = cpu();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(cpu(), frozen_at, "a frozen process used CPU");
    cg.freeze("c1", false).expect("thaw");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(cpu() > frozen_at, "a thawed process runs again");
    // The busy loop's cpu time is accounted to the group (v1: cpuacct joined).
    let u = cg.usage("c1").expect("usage");
    assert!(u.cpu_usage_micros.is_some_and(|us| us > 0), "{u:?}");
    assert_eq!(cg.list().expect("list"), vec!["c1".to_string()]);
    cg.destroy("c1").expect("destroy");
    assert!(!cg.exists("c1"));
    assert!(!child.wait().expect("reaped").success(), "destroy killed the process");
    cg.destroy("c1").expect("destroy is idempotent");
    cg.remove_group().expect("remove group");
}

/// Freezing is asynchronous in the kernel (v1 passes through FREEZING, v2
/// reports `frozen 1` in cgroup.events once the last task stopped); `freeze`
/// returns only after that. Many spinning processes on few CPUs make the gap
/// wide: most of them are runnable, not running, when the freeze is written.
#[test]
fn freeze_returns_once_every_process_is_frozen() {
    let group = format!("ember-cgfreeze-{}", std::process::id());
    let cg = detect("/sys/fs/cgroup".as_ref(), &group).expect("a usable cgroup hierarchy");
    cg.create("f1", &Limits { memory_bytes: 256 << 20, cpu_millis: 2000, pids: 64 }).expect("create");
    let mut spinners: Vec<_> = (0..24)
        .map(|_| {
            let c = Command::new("sh").args(["-c", "while :; do :; done"]).spawn().expect("spin");
            cg.attach("f1", c.id() as i32).expect("attach");
            c
        })
        .collect();
    for round in 0..5 {
        cg.freeze("f1", true).expect("freeze");
        assert!(cg.is_frozen("f1").expect("frozen state"), "round {round}: freeze returned before all were frozen");
        cg.freeze("f1", false).expect("thaw");
        assert!(!cg.is_frozen("f1").expect("frozen state"), "round {round}: still frozen after thaw");
    }
    cg.destroy("f1").expect("destroy");
    for c in &mut spinners {
        assert!(!c.wait().expect("reaped").success(), "destroy killed every spinner");
    }
    cg.remove_group().expect("remove group");
}

/// Under contention a sandbox's CPU share follows its cpu limit (Kubernetes'
/// conversion: 1024 v1 shares per CPU, the same share as v2 `cpu.weight`),
/// read back from the kernel's own file.
#[test]
fn cpu_weight_follows_the_cpu_limit() {
    let group = format!("ember-cgweight-{}", std::process::id());
    let cg = detect("/sys/fs/cgroup".as_ref(), &group).expect("a usable cgroup hierarchy");
    let (file, want) = match cg.version() {
        "v2" => (format!("/sys/fs/cgroup/{group}/w1/cpu.weight"), [10, 39, 79]),
        _ => {
            let cpu =
                ["cpu", "cpu,cpuacct"].into_iter().find(|h| std::path::Path::new("/sys/fs/cgroup").join(h).exists());
            (format!("/sys/fs/cgroup/{}/{group}/w1/cpu.shares", cpu.expect("the v1 cpu hierarchy")), [256, 1024, 2048])
        }
    };
    for (millis, want) in [250, 1000, 2000].into_iter().zip(want) {
        cg.create("w1", &Limits { memory_bytes: 64 << 20, cpu_millis: millis, pids: 8 }).expect("create");
        let got: u64 = std::fs::read_to_string(&file).expect("weight file").trim().parse().expect("a number");
        assert_eq!(got, want, "{file} for {millis} millicpu");
        // A pool's refill launches at the least weight, then is set back.
        cg.set_cpu_share("w1", CpuShare::Background).expect("background");
        let least: u64 = std::fs::read_to_string(&file).expect("weight file").trim().parse().expect("a number");
        assert_eq!(least, if cg.version() == "v2" { 1 } else { 2 }, "{file} in the background");
        // A launch someone waits on runs at the most, then is set back.
        cg.set_cpu_share("w1", CpuShare::Foreground).expect("foreground");
        let most: u64 = std::fs::read_to_string(&file).expect("weight file").trim().parse().expect("a number");
        assert_eq!(most, if cg.version() == "v2" { 10_000 } else { 262_144 }, "{file} in the foreground");
        cg.set_cpu_share("w1", CpuShare::Limit(millis)).expect("set back");
        let back: u64 = std::fs::read_to_string(&file).expect("weight file").trim().parse().expect("a number");
        assert_eq!(back, want, "{file} set back for {millis} millicpu");
        cg.destroy("w1").expect("destroy");
    }
    // The parent group's own weight (a local cluster's nodes share one host).
    let group_file = std::path::Path::new(&file).parent().and_then(|w| w.parent()).expect("the group's dir");
    let group_file = group_file.join(if cg.version() == "v2" { "cpu.weight" } else { "cpu.shares" });
    // `None`: the kernel's default (what a node sets back after a rebind storm).
    let v2 = cg.version() == "v2";
    for (shares, want) in [(Some(102), if v2 { 4 } else { 102 }), (None, if v2 { 100 } else { 1024 })] {
        cg.set_group_cpu_shares(shares).expect("the group's weight");
        let got: u64 = std::fs::read_to_string(&group_file).expect("weight file").trim().parse().expect("a number");
        assert_eq!(got, want, "{} for {shares:?} shares", group_file.display());
    }
    cg.remove_group().expect("remove group");
}

/// The parent group's weight can be set before any sandbox made it.
#[test]
fn the_group_weight_is_set_on_a_group_not_made_yet() {
    let group = format!("ember-cggroupw-{}", std::process::id());
    let cg = detect("/sys/fs/cgroup".as_ref(), &group).expect("a usable cgroup hierarchy");
    cg.set_group_cpu_shares(Some(300)).expect("the group's weight");
    let file = match cg.version() {
        "v2" => format!("/sys/fs/cgroup/{group}/cpu.weight"),
        _ => {
            let cpu =
                ["cpu", "cpu,cpuacct"].into_iter().find(|h| std::path::Path::new("/sys/fs/cgroup").join(h).exists());
            format!("/sys/fs/cgroup/{}/{group}/cpu.shares", cpu.expect("the v1 cpu hierarchy"))
        }
    };
    let got: u64 = std::fs::read_to_string(&file).expect("weight file").trim().parse().expect("a number");
    // Below the default (v1 1024) the group is lowered: a launch someone
    // waits on is then born out of its CPU cgroup (v1 only).
    let lowered = cg.group_lowered();
    cg.set_group_cpu_shares(None).expect("the default weight");
    let back = cg.group_lowered();
    let _ = cg.remove_group();
    assert_eq!(got, if cg.version() == "v2" { ember_cgroups::weight_of_shares(300) } else { 300 });
    assert_eq!((lowered, back), (cg.version() == "v1", false), "lowered at 300 shares (v1), not at the default");
}

/// A task of the group in uninterruptible sleep: `dd … conv=fsync` into an
/// ext4 image loop-mounted from a second ext4 image whose filesystem is
/// frozen (`fsfreeze`), so the fsync waits on IO no freeze can interrupt.
struct StuckWriter {
    dir: std::path::PathBuf,
    child: std::process::Child,
}

impl StuckWriter {
    fn start(cg: &dyn ember_cgroups::Cgroups, name: &str) -> StuckWriter {
        let dir = std::env::temp_dir().join(format!("ember-cgstuck-{}", std::process::id()));
        let (outer, inner) = (dir.join("outer"), dir.join("inner"));
        let sh = |script: &str| {
            let out = Command::new("sh").args(["-ec", script]).output().expect("sh");
            assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
        };
        std::fs::create_dir_all(&inner).expect("dirs");
        std::fs::create_dir_all(&outer).expect("dirs");
        let d = dir.display();
        sh(&format!(
            "truncate -s 64M {d}/outer.img; mkfs.ext4 -q {d}/outer.img; mount -o loop {d}/outer.img {d}/outer; \
             truncate -s 16M {d}/outer/inner.img; mkfs.ext4 -q {d}/outer/inner.img; \
             mount -o loop {d}/outer/inner.img {d}/inner; sync; fsfreeze --freeze {d}/outer"
        ));
        // Waits for a line on stdin, so it is in the group before it writes.
        let mut child = Command::new("sh")
            .args([
                "-c",
                &format!("read go; exec dd if=/dev/zero of={d}/inner/f bs=64k count=4 conv=fsync status=none"),
            ])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("writer");
        cg.attach(name, child.id() as i32).expect("attach");
        use std::io::Write;
        writeln!(child.stdin.as_mut().expect("stdin")).expect("go");
        let status = format!("/proc/{}/status", child.id());
        let stuck = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(25));
            std::fs::read_to_string(&status).is_ok_and(|s| s.contains("State:\tD"))
        });
        assert!(stuck, "the writer never blocked in uninterruptible sleep");
        StuckWriter { dir, child }
    }

    /// Lets the IO through; the writer exits unless something stops it.
    fn release(&self) {
        let _ = Command::new("fsfreeze")
            .arg("--unfreeze")
            .arg(self.dir.join("outer"))
            .stderr(std::process::Stdio::null())
            .status();
    }

    /// Whether the writer exits within 10 s of the release.
    fn exits(&mut self) -> bool {
        self.release();
        (0..400).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(25));
            self.child.try_wait().expect("try_wait").is_some()
        })
    }
}

impl Drop for StuckWriter {
    fn drop(&mut self) {
        self.release();
        for m in ["inner", "outer"] {
            let _ = Command::new("umount").arg("-l").arg(self.dir.join(m)).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A freeze that cannot complete fails after its bound and is undone: the
/// group is not left freezing, where each task would stop as it leaves the
/// wait that held the freeze up (a sandbox hung under a Running record, and
/// its removal behind it).
#[test]
fn a_freeze_that_cannot_complete_is_undone() {
    let group = format!("ember-cgstuck-{}", std::process::id());
    let cg = detect("/sys/fs/cgroup".as_ref(), &group).expect("a usable cgroup hierarchy");
    cg.create("s1", &Limits { memory_bytes: 256 << 20, cpu_millis: 1000, pids: 16 }).expect("create");
    let mut writer = StuckWriter::start(cg.as_ref(), "s1");
    let err = cg.freeze("s1", true).expect_err("a task in uninterruptible sleep holds the freeze off");
    assert!(matches!(err, ember_cgroups::CgroupError::FreezeTimeout { .. }), "{err}");
    assert!(!cg.is_frozen("s1").expect("state"));
    let exited = writer.exits();
    let _ = cg.freeze("s1", false);
    cg.destroy("s1").expect("destroy");
    cg.remove_group().expect("remove group");
    assert!(exited, "the writer stopped after its IO went through: the group was left freezing");
}
