//! Lab 1, before: the shared worker (`worker.rs`) as a real process in a
//! memory-limited cgroup this lab makes (v1 or v2, through ember-cgroups) and
//! removes on every way out.
use super::shared::{Secrets, TaskOutcome, PAYLOAD_CAP};
use anyhow::Context;
use ember_cgroups::{Cgroups, Limits};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The worker's stdout is our own process's, but it carries the payload's
/// exit text: read at most this much of it.
const MAX_OUTPUT: u64 = 1 << 20;
const CGROUP: &str = "shared-worker";

pub struct Baseline {
    pub tasks: Vec<TaskOutcome>,
    /// How the worker process ended (`killed by signal 9`, `exit 0`).
    pub ended: String,
    pub signal: Option<i32>,
    /// The cgroup's OOM kill count (`None` where the kernel does not report it).
    pub oom_kills: Option<u64>,
    pub hog_mib: u64,
    pub hog_capped: bool,
    pub payload: Vec<u8>,
}

/// The lab's cgroup and the worker; both gone when this drops.
struct Cleanup {
    cg: Box<dyn Cgroups>,
    child: Option<Child>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self.cg.destroy(CGROUP);
        let _ = self.cg.remove_group();
    }
}

/// Runs the worker to its end (the OOM killer's, or the hog's cap).
pub fn run(dir: &Path, secrets: &Secrets, steps: u32, limit_mib: u64) -> anyhow::Result<Baseline> {
    let group = format!("ember-lab-{}", std::process::id());
    let cg = ember_cgroups::detect("/sys/fs/cgroup".as_ref(), &group).context("cgroups")?;
    let mut guard = Cleanup { cg, child: None };
    let limits = Limits { memory_bytes: limit_mib << 20, cpu_millis: 1000, pids: 64 };
    guard.cg.create(CGROUP, &limits).with_context(|| format!("creating cgroup {group}/{CGROUP}"))?;
    let payload_out = dir.join("payload-shared.out");
    let exe = std::env::current_exe().context("locating the ember binary")?;
    let mut child = Command::new(exe)
        .args(["lab", "shared-worker", "--steps", &steps.to_string()])
        .args(["--hog-cap-mib", &(limit_mib * 4).to_string(), "--payload", &secrets.payload()])
        .arg("--payload-out")
        .arg(&payload_out)
        .env(super::shared::ENV_NAME, &secrets.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the shared worker")?;
    let (mut stdin, stdout) = (child.stdin.take().context("stdin")?, child.stdout.take().context("stdout")?);
    let pid = child.id() as i32;
    guard.child = Some(child);
    let mut lines = BufReader::new(stdout.take(MAX_OUTPUT)).lines();
    let first = lines.next().transpose().context("reading the worker")?;
    anyhow::ensure!(first.as_deref() == Some("waiting"), "the worker said {first:?}");
    guard.cg.attach(CGROUP, pid).with_context(|| format!("moving the worker (pid {pid}) into {group}/{CGROUP}"))?;
    stdin.write_all(b"go\n").context("starting the worker's tasks")?;
    let mut b = Baseline {
        tasks: ["research", "coder"].iter().map(|n| TaskOutcome::new(n, steps)).collect(),
        ended: String::new(),
        signal: None,
        oom_kills: None,
        hog_mib: 0,
        hog_capped: false,
        payload: Vec::new(),
    };
    for line in lines {
        b.read_line(&line.context("reading the worker")?);
    }
    let status = guard.child.take().context("worker")?.wait().context("waiting for the worker")?;
    b.signal = status.signal();
    b.ended = status.to_string();
    b.oom_kills = guard.cg.oom_kills(CGROUP).ok();
    b.payload = read_capped(&payload_out)?;
    Ok(b)
}

impl Baseline {
    fn read_line(&mut self, line: &str) {
        let mut w = line.split_whitespace();
        match (w.next(), w.next(), w.next()) {
            (Some("step"), Some(task), Some(i)) => {
                if let Some(t) = self.tasks.iter_mut().find(|t| t.name == task) {
                    t.steps_done = i.parse().unwrap_or(t.steps_done);
                }
            }
            (Some("done"), Some(task), None) => {
                if let Some(t) = self.tasks.iter_mut().find(|t| t.name == task) {
                    t.finished = true;
                }
            }
            (Some("hog"), Some(mib), None) => self.hog_mib = mib.parse().unwrap_or(self.hog_mib),
            (Some("hog-capped"), None, None) => self.hog_capped = true,
            _ => {}
        }
    }
}

/// At most [`PAYLOAD_CAP`] bytes of `path`.
fn read_capped(path: &Path) -> anyhow::Result<Vec<u8>> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = Vec::new();
    f.take(PAYLOAD_CAP).read_to_end(&mut buf).with_context(|| format!("reading {}", path.display()))?;
    Ok(buf)
}
