//! The crun reference, measured in the same run: `crun run`, `crun create` +
//! `crun start` to running, and `crun exec`, each container fresh and always
//! deleted. Blocking: call it from `spawn_blocking`.
use super::oci::{self, Bundle};
use super::stats::{Progress, Series};
use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started container may take to be reported running.
const RUNNING_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct CrunFigures {
    pub version: String,
    /// `crun run` of /bin/true: create, start, exit, delete.
    pub run: Series,
    /// `crun create` + `crun start` returned.
    pub create_start: Series,
    /// The same, until `crun state` says running.
    pub to_running: Series,
    /// `crun delete -f` of a running container.
    pub delete: Series,
    pub exec: Series,
    pub exec_bash: Series,
    /// What setup had to say (a hugetlb mount that failed, ...).
    pub warnings: Vec<String>,
}

pub enum Crun {
    Measured(Box<CrunFigures>),
    Unavailable(String),
}

pub fn measure(runs: usize) -> Crun {
    let version = match oci::ensure_crun() {
        Ok(v) => v,
        Err(e) => return unavailable(e),
    };
    let mut f = CrunFigures { version, ..Default::default() };
    f.warnings.extend(oci::ensure_hugetlb());
    let b = match Bundle::create() {
        Ok(b) => b,
        Err(e) => return unavailable(e),
    };
    let c = Ctl { b: &b, prefix: format!("ember-bench-{}", std::process::id()) };
    // A discarded first run; if it fails, so would every other.
    if let Err(e) = c.run("warmup") {
        let _ = c.delete("warmup");
        let mut msg = format!("a first `crun run` failed: {e}");
        for w in &f.warnings {
            msg.push_str(&format!("; {w}"));
        }
        return unavailable(msg);
    }
    run_loop(&c, runs, &mut f);
    create_loop(&c, runs, &mut f);
    exec_loops(&c, runs, &mut f);
    Crun::Measured(Box::new(f))
}

fn unavailable(why: String) -> Crun {
    eprintln!("crun reference unavailable: {why}");
    Crun::Unavailable(why)
}

fn run_loop(c: &Ctl, runs: usize, f: &mut CrunFigures) {
    let p = Progress::new("crun run /bin/true", runs);
    for i in 0..runs {
        let name = format!("run-{i}");
        let t0 = Instant::now();
        match c.run(&name) {
            Ok(()) => f.run.push(t0.elapsed()),
            Err(e) => {
                f.run.fail(e);
                let _ = c.delete(&name);
            }
        }
        p.tick(i + 1);
        if f.run.gave_up() {
            break;
        }
    }
    p.finish(&f.run);
}

fn create_loop(c: &Ctl, runs: usize, f: &mut CrunFigures) {
    let p = Progress::new("crun create+start+delete", runs);
    for i in 0..runs {
        let name = format!("cs-{i}");
        let t0 = Instant::now();
        match c.create_start(&name) {
            Ok(started) => {
                f.create_start.push(started);
                match c.wait_running(&name) {
                    Ok(()) => f.to_running.push(t0.elapsed()),
                    Err(e) => f.to_running.fail(e),
                }
            }
            Err(e) => {
                f.create_start.fail(&e);
                f.to_running.fail(&e);
            }
        }
        let t1 = Instant::now();
        match c.delete(&name) {
            Ok(()) => f.delete.push(t1.elapsed()),
            Err(e) => f.delete.fail(e),
        }
        p.tick(i + 1);
        if f.to_running.gave_up() {
            break;
        }
    }
    p.finish(&f.to_running);
}

fn exec_loops(c: &Ctl, runs: usize, f: &mut CrunFigures) {
    let name = "exec";
    if let Err(e) = c.create_start(name).and_then(|_| c.wait_running(name)) {
        let _ = c.delete(name);
        let msg = format!("starting the exec container: {e}");
        f.exec.fail(&msg);
        f.exec_bash.fail(&msg);
        return;
    }
    let argv: [(&str, &[&str], &mut Series); 2] = [
        ("crun exec /bin/true", &["/bin/true"], &mut f.exec),
        ("crun exec bash -c true", &["/bin/bash", "-c", "true"], &mut f.exec_bash),
    ];
    for (label, args, series) in argv {
        let _ = c.exec(name, args);
        let p = Progress::new(label, runs);
        for i in 0..runs {
            let t0 = Instant::now();
            match c.exec(name, args) {
                Ok(()) => series.push(t0.elapsed()),
                Err(e) => series.fail(e),
            }
            p.tick(i + 1);
            if series.gave_up() {
                break;
            }
        }
        p.finish(series);
    }
    if let Err(e) = c.delete(name) {
        eprintln!("crun: {e}");
    }
}

/// crun with its own state root; container names carry our pid.
struct Ctl<'a> {
    b: &'a Bundle,
    prefix: String,
}

impl Ctl<'_> {
    fn id(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    /// Runs `crun --root <state> <args>`; stderr (crun's and the container's)
    /// goes to a log file that becomes the error on failure.
    fn crun(&self, args: &[&str]) -> Result<(), String> {
        let out = self.command(args)?.stdout(Stdio::null()).status().map_err(|e| format!("crun: {e}"))?;
        if out.success() {
            return Ok(());
        }
        Err(self.failure(args, &out.to_string()))
    }

    fn command(&self, args: &[&str]) -> Result<Command, String> {
        let log = File::create(&self.b.log).map_err(|e| format!("{}: {e}", self.b.log.display()))?;
        let mut cmd = Command::new("crun");
        cmd.arg("--root").arg(&self.b.state_root).args(args).stdin(Stdio::null()).stderr(log);
        Ok(cmd)
    }

    fn failure(&self, args: &[&str], status: &str) -> String {
        let log = std::fs::read_to_string(&self.b.log).unwrap_or_default();
        let log = log.trim().lines().last().unwrap_or("").to_string();
        format!("crun {} ({status}): {log}", args.first().unwrap_or(&""))
    }

    fn run(&self, name: &str) -> Result<(), String> {
        self.crun(&["run", "--bundle", path(&self.b.true_bundle), &self.id(name)])
    }

    /// `create` then `start`; returns the time both took.
    fn create_start(&self, name: &str) -> Result<Duration, String> {
        let id = self.id(name);
        let t0 = Instant::now();
        self.crun(&["create", "--bundle", path(&self.b.sleep_bundle), &id])?;
        self.crun(&["start", &id])?;
        Ok(t0.elapsed())
    }

    fn wait_running(&self, name: &str) -> Result<(), String> {
        let id = self.id(name);
        let deadline = Instant::now() + RUNNING_TIMEOUT;
        loop {
            let args = ["state", id.as_str()];
            let out = self.command(&args)?.output().map_err(|e| format!("crun: {e}"))?;
            if !out.status.success() {
                return Err(self.failure(&args, &out.status.to_string()));
            }
            let state: serde_json::Value =
                serde_json::from_slice(&out.stdout).map_err(|e| format!("crun state: {e}"))?;
            match state.get("status").and_then(|s| s.as_str()) {
                Some("running") => return Ok(()),
                Some("stopped") => return Err("crun state: the container stopped".into()),
                _ if Instant::now() > deadline => return Err(format!("not running after {RUNNING_TIMEOUT:?}")),
                _ => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    }

    fn exec(&self, name: &str, argv: &[&str]) -> Result<(), String> {
        let id = self.id(name);
        let mut args = vec!["exec", id.as_str()];
        args.extend_from_slice(argv);
        self.crun(&args)
    }

    fn delete(&self, name: &str) -> Result<(), String> {
        self.crun(&["delete", "-f", &self.id(name)])
    }
}

fn path(p: &Path) -> &str {
    // Built by us from temp_dir() and ASCII names; a non-UTF-8 temp dir would
    // make crun fail with a clear "no such bundle" error rather than panic here.
    p.to_str().unwrap_or("")
}
