//! Test harness: a real `ember serve` process on 127.0.0.1:0 with its own data
//! dir and cgroup parent, the static agent, and a client. Tests run as root and
//! create real sandboxes.
#![allow(dead_code, reason = "each test binary uses a different part of the harness")]

pub mod internet;
pub mod raw;

use ember_client::Client;
use ember_types::api::{CreateSandboxRequest, ResourcesSpec, SandboxInfo};
use ember_types::execd::RunCommandRequest;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// The static agent: `$EMBER_AGENT_BIN`, else what `scripts/build-agent.sh` built.
pub fn agent_bin() -> PathBuf {
    if let Ok(p) = std::env::var("EMBER_AGENT_BIN") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/ember-agent-static");
    assert!(p.exists(), "no static agent at {}: run scripts/build-agent.sh (or set EMBER_AGENT_BIN)", p.display());
    p
}

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// playwright-core's install dir (for the dashboard's tests in headless
/// Chromium): `$EMBER_PLAYWRIGHT_DIR`, else what scripts/playwright.sh
/// installs (once) under target/.
pub fn playwright_dir() -> PathBuf {
    if let Ok(d) = std::env::var("EMBER_PLAYWRIGHT_DIR") {
        return PathBuf::from(d);
    }
    let out = Command::new(repo().join("scripts/playwright.sh")).output().expect("run scripts/playwright.sh");
    assert!(out.status.success(), "scripts/playwright.sh: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

pub struct Daemon {
    child: Option<Child>,
    pub url: String,
    pub data_dir: PathBuf,
    pub group: String,
    pub client: Client,
    extra: Vec<String>,
    /// Where the daemon's stderr goes, and at which level (`start_logging`:
    /// debug, `start_logged`: info), instead of the test's stderr at `warn`.
    log: Option<(PathBuf, &'static str)>,
    /// Started in `/` with relative paths (`start_relative`).
    relative: bool,
    /// Environment variables set on the daemon (`start_with_env`).
    env: Vec<(String, String)>,
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with(&[])
    }

    /// A daemon with extra `ember serve` flags.
    pub fn start_with(extra: &[&str]) -> Daemon {
        let mut d = Self::unstarted(extra);
        d.spawn();
        d
    }

    /// A daemon with extra `ember serve` flags and environment variables.
    pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut d = Self::unstarted(extra);
        d.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        d.spawn();
        d
    }

    /// A daemon logging at debug level to the file `log` (appended across restarts).
    pub fn start_logging(extra: &[&str], log: &Path) -> Daemon {
        let mut d = Self::unstarted(extra);
        d.log = Some((log.to_path_buf(), "debug"));
        d.spawn();
        d
    }

    /// A daemon whose data dir is a tmpfs of `size` (`mount -o size=`): a
    /// disk the test can fill. Unmounted on drop.
    pub fn start_on_tmpfs(extra: &[&str], size: &str) -> Daemon {
        let mut d = Self::unstarted(extra);
        std::fs::create_dir_all(&d.data_dir).expect("data dir");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=755"), "tmpfs"])
            .arg(&d.data_dir)
            .output()
            .expect("run mount");
        assert!(out.status.success(), "mount tmpfs: {}", String::from_utf8_lossy(&out.stderr));
        d.spawn();
        d
    }

    /// A daemon started in `/` and given its data dir and agent as relative
    /// paths.
    pub fn start_relative() -> Daemon {
        let mut d = Self::unstarted(&[]);
        d.relative = true;
        d.spawn();
        d
    }

    fn unstarted(extra: &[&str]) -> Daemon {
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let tag = format!("ember-test-{}-{n}", std::process::id());
        let data_dir = std::env::temp_dir().join(&tag);
        let _ = std::fs::remove_dir_all(&data_dir);
        let mut d = Daemon {
            child: None,
            url: String::new(),
            data_dir,
            group: tag,
            client: Client::new("http://127.0.0.1:1", None).expect("placeholder client"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            log: None,
            relative: false,
            env: Vec::new(),
        };
        // Egress networking changes the host (a table, namespaces, an address
        // on lo): only tests that ask for it, with a range and tag of their own.
        if !d.extra.iter().any(|a| a == "--network-range") {
            d.extra.extend(["--network-range".to_string(), "none".to_string()]);
        }
        d
    }

    /// A daemon with extra flags whose stderr, at `info`, goes to `log`.
    pub fn start_logged(extra: &[&str], log: &Path) -> Daemon {
        let mut d = Self::unstarted(extra);
        d.log = Some((log.to_path_buf(), "info"));
        d.spawn();
        d
    }

    /// (Re)starts `ember serve` on the same data dir and cgroup parent.
    pub fn spawn(&mut self) {
        let mut cmd = serve_command_from(&self.data_dir, &self.group, &self.extra, self.relative);
        cmd.stderr(Stdio::inherit()).envs(self.env.iter().map(|(k, v)| (k, v)));
        if let Some((log, level)) = &self.log {
            let f = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("daemon log file");
            cmd.stderr(f).env("EMBER_LOG", level);
        }
        let mut child = cmd.spawn().expect("ember serve starts");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read listen line");
        let url =
            line.trim().strip_prefix("ember listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        self.url = url.to_string();
        self.client = Client::new(url, None).expect("client");
        self.child = Some(child);
    }

    /// The resident memory of `ember serve`, in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> u64 {
        let pid = self.child.as_ref().expect("the daemon runs").id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
        line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmRSS in kB")
    }

    /// Binds a listener where the only pooled sandbox's agent socket was,
    /// and returns that sandbox's dir: what root inside an OCI sandbox can do
    /// to the socket dir bound at `/run/ember` (a pooled sandbox is out of the
    /// API's reach, so the host does it here).
    pub fn hijack_pooled_agent(&self) -> (PathBuf, tokio::net::UnixListener) {
        let pooled: Vec<_> = std::fs::read_dir(self.data_dir.join("sandboxes")).expect("sandboxes").flatten().collect();
        assert_eq!(pooled.len(), 1, "one pooled sandbox on disk");
        let dir = pooled[0].path();
        let sock = dir.join("agent.sock");
        std::fs::remove_file(&sock).expect("remove the agent's socket");
        (dir, tokio::net::UnixListener::bind(&sock).expect("bind the hostile agent"))
    }

    /// The running daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits (up to 10 s) until no process but a live daemon runs with this
    /// daemon's command line, and returns those that still do: after a kill,
    /// such a process is a sandbox init cloned by the daemon that never got
    /// its go-ahead (a `CLONE_VM` child keeps the daemon's argv until it
    /// execs) or a user-namespace holder.
    pub fn forks_left(&self) -> Vec<u32> {
        let needle = format!("--data-dir\0{}\0", self.data_dir.display());
        let live = self.child.as_ref().map(Child::id);
        let scan = || -> Vec<u32> {
            std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
                .filter(|pid| Some(*pid) != live)
                .filter(|pid| {
                    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    cmd.windows(needle.len()).any(|w| w == needle.as_bytes())
                })
                .collect()
        };
        for _ in 0..100 {
            if scan().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        scan()
    }

    pub fn cgroups(&self) -> Box<dyn ember_cgroups::Cgroups> {
        ember_cgroups::detect("/sys/fs/cgroup".as_ref(), &self.group).expect("cgroups")
    }

    /// A sandbox writing workspace `big` (512 MiB), which holds 240 MB of
    /// random bytes: a snapshot of it runs for seconds (hashing,
    /// compressing). `first`: a script run before the files are written.
    pub async fn big_writer(&self, first: &str) -> SandboxInfo {
        self.client.create_workspace("big", "512Mi").await.expect("workspace");
        let mount = ember_types::api::WorkspaceMountSpec { name: "big".into(), ..Default::default() };
        let s = self.create(|r| r.workspaces = vec![mount]).await;
        let script = format!("{first}for i in 1 2 3 4 5 6; do head -c 40000000 /dev/urandom > /workspace/f$i; done");
        let (code, _, err) = self.sh(&s.id, &script, None).await;
        assert_eq!(code, Some(0), "{err}");
        s
    }

    /// Polls until sandbox `id`'s cgroup is frozen (a snapshot under way),
    /// unless `ended` says the call that should freeze it ended first
    /// (at most ~60 s, a bound on a hang).
    pub async fn until_frozen(&self, id: &str, ended: impl Fn() -> bool) {
        let cg = self.cgroups();
        for _ in 0..6000 {
            if cg.is_frozen(id).expect("freezer state") {
                return;
            }
            assert!(!ended(), "the call ended before it froze sandbox {id}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("sandbox {id} was never frozen");
    }

    /// Once sandbox `id` is frozen by the call `task` makes, the caller goes
    /// away mid-call: the task is aborted and its connection dropped.
    pub async fn abort_when_frozen<T: Send + 'static>(&self, id: &str, task: tokio::task::JoinHandle<T>) {
        self.until_frozen(id, || task.is_finished()).await;
        task.abort();
        assert!(task.await.err().is_some_and(|e| e.is_cancelled()), "the call ended before it was aborted");
    }

    pub async fn create(&self, f: impl FnOnce(&mut CreateSandboxRequest)) -> SandboxInfo {
        let mut req = CreateSandboxRequest { template: Some("host".into()), ..Default::default() };
        f(&mut req);
        self.client.create_sandbox(&req).await.expect("create sandbox").0
    }

    /// Polls until pool `name` has `n` idle members (at most ~30 s, a bound
    /// on a hang); the idle count last seen.
    pub async fn pool_idle(&self, name: &str, n: u32) -> u32 {
        let mut idle = u32::MAX;
        for _ in 0..1200 {
            idle = self.client.get_pool(name).await.expect("pool").idle;
            if idle == n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        idle
    }

    /// A pool `host` of the host template with a fixed target of `idle`,
    /// returned once that many members are idle.
    pub async fn warm_pool(&self, idle: u32) {
        let req = ember_types::api::CreatePoolRequest {
            template: "host".into(),
            min: idle,
            max: idle + 1,
            target: Some(idle.into()),
            ..Default::default()
        };
        self.client.create_pool(&req).await.expect("create pool");
        for _ in 0..800 {
            if self.client.get_pool("host").await.expect("pool").idle == idle {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("pool host never had {idle} idle members");
    }

    pub async fn create_limited(&self, memory: &str, pids: u64) -> SandboxInfo {
        self.create(|r| {
            r.resources = Some(ResourcesSpec { memory: Some(memory.into()), pids: Some(pids), ..Default::default() })
        })
        .await
    }

    /// Runs `sh -c script` (as `uid` if given); returns (exit code, stdout, stderr).
    pub async fn sh(&self, id: &str, script: &str, uid: Option<u32>) -> (Option<i32>, String, String) {
        let req = RunCommandRequest { command: Some(script.into()), uid, gid: uid, ..Default::default() };
        self.run(id, &req).await
    }

    pub async fn run(&self, id: &str, req: &RunCommandRequest) -> (Option<i32>, String, String) {
        let (mut out, mut err) = (String::new(), String::new());
        let res = self
            .client
            .exec(id, req, |ev| {
                let t = ev.text.as_deref().unwrap_or("");
                let t = if t == "\n" { "" } else { t };
                match ev.kind.as_str() {
                    "stdout" => {
                        out.push_str(t);
                        out.push('\n');
                    }
                    "stderr" => {
                        err.push_str(t);
                        err.push('\n');
                    }
                    _ => {}
                }
            })
            .await
            .expect("exec");
        (res.exit_code, out, err)
    }

    /// Polls until the sandbox reaches `state` (or the time runs out).
    pub async fn wait_state(&self, id: &str, state: &str, within: Duration) -> SandboxInfo {
        let deadline = std::time::Instant::now() + within;
        loop {
            let s = self.client.get_sandbox(id).await.expect("get sandbox");
            if s.status.state == state || std::time::Instant::now() > deadline {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Host tasks (threads included) in the pids cgroup of a sandbox of `class`.
    pub fn tasks(&self, class: &str, id: &str) -> usize {
        let group = if class == "native" { self.group.clone() } else { format!("{}-{class}", self.group) };
        let path = format!("/sys/fs/cgroup/pids/{group}/{id}/pids.current");
        let v2 = format!("/sys/fs/cgroup/{group}/{id}/pids.current");
        let text = std::fs::read_to_string(&path).or_else(|_| std::fs::read_to_string(&v2));
        text.unwrap_or_else(|e| panic!("{path}: {e}")).trim().parse().expect("pids.current")
    }

    /// Polls task `id` until `until` holds; panics after `within`.
    pub async fn wait_task(
        &self,
        id: &str,
        within: Duration,
        until: impl Fn(&ember_types::task::TaskRecord) -> bool,
    ) -> ember_types::task::TaskRecord {
        let deadline = std::time::Instant::now() + within;
        loop {
            let t = self.client.get_task(id).await.expect("get task");
            if until(&t) {
                return t;
            }
            assert!(std::time::Instant::now() < deadline, "task {id} stuck: {t:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Reads a workspace file through a fresh read-only mount.
    pub async fn read_ws(&self, ws: &str, file: &str) -> String {
        let mount = ember_types::api::WorkspaceMountSpec { name: ws.into(), read_only: true, ..Default::default() };
        let r = self.create(|r| r.workspaces = vec![mount]).await;
        let (_, out, _) = self.sh(&r.id, &format!("cat /workspace/{file}"), None).await;
        self.client.delete_sandbox(&r.id).await.expect("remove reader");
        out
    }

    /// Host pids in the sandbox's cgroup.
    pub fn procs(&self, id: &str) -> Vec<i32> {
        self.cgroups().procs(id).unwrap_or_default()
    }
}

/// `ember serve` on port 0 with this data dir, cgroup parent and extra flags.
fn serve_command(data_dir: &Path, group: &str, extra: &[String]) -> Command {
    serve_command_from(data_dir, group, extra, false)
}

/// `relative`: started in `/`, given its data dir and agent as paths
/// relative to it, as a user in a checkout would (`--agent target/...`).
fn serve_command_from(data_dir: &Path, group: &str, extra: &[String], relative: bool) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ember"));
    let agent = agent_bin();
    let (data_dir, agent) = match relative {
        true => {
            cmd.current_dir("/");
            let rel = |p: &Path| p.strip_prefix("/").expect("an absolute path").to_path_buf();
            (rel(data_dir), rel(&agent))
        }
        false => (data_dir.to_path_buf(), agent),
    };
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--retention", "1h", "--cgroup-parent", group])
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--agent")
        .arg(agent)
        .args(extra)
        // EMBER_TEST_DAEMON_LOG: the daemons' filter when a test is debugged.
        .env("EMBER_LOG", std::env::var("EMBER_TEST_DAEMON_LOG").unwrap_or_else(|_| "warn".into()))
        .stdout(Stdio::piped());
    cmd
}

/// Runs `ember serve` on `data_dir` expecting it to refuse to start, and
/// returns what it said on stderr. A daemon that starts serving instead
/// fails the test (and is killed).
pub fn serve_refused(data_dir: &Path, group: &str) -> String {
    let extra = ["--network-range".to_string(), "none".to_string()];
    let mut child = serve_command(data_dir, group, &extra).stderr(Stdio::piped()).spawn().expect("ember serve starts");
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line);
    if !line.is_empty() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("ember serve on {} started ({line:?}) instead of refusing", data_dir.display());
    }
    let out = child.wait_with_output().expect("ember serve exits");
    assert!(!out.status.success(), "a refusal exits non-zero");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

impl Drop for Daemon {
    /// Stops the daemon and reaps everything it left (sandboxes keep running
    /// across a daemon exit by design, so the harness removes them).
    fn drop(&mut self) {
        self.kill9();
        // Workspaces stay mounted on the host while a daemon runs; unmount ours.
        let ws = self.data_dir.join("workspaces");
        for e in std::fs::read_dir(&ws).into_iter().flatten().flatten() {
            // Attempt layers (overlays over the tree), the tree, the filesystem.
            for l in std::fs::read_dir(e.path().join("attempts")).into_iter().flatten().flatten() {
                let _ = Command::new("umount").arg("-l").arg(l.path()).output();
            }
            for m in ["mnt", "fs"] {
                let _ = Command::new("umount").arg("-l").arg(e.path().join(m)).output();
            }
        }
        // So do native sandboxes' writable layers (a tmpfs each), and the
        // tmpfs their dirs are on.
        for e in std::fs::read_dir(self.data_dir.join("sandboxes")).into_iter().flatten().flatten() {
            let _ = Command::new("umount").arg("-l").arg(e.path().join("mnt")).output();
        }
        let _ = Command::new("umount").arg("-l").arg(self.data_dir.join("sandboxes")).output();
        // OCI classes: containers, host rootfs mounts (and runsc's workspace
        // slot) and cgroups of each.
        for class in ["runsc", "crun", "runc"] {
            let base = self.data_dir.join("oci").join(class);
            for e in std::fs::read_dir(base.join("sandboxes")).into_iter().flatten().flatten() {
                let id = e.file_name();
                let _ = Command::new(class)
                    .arg("--root")
                    .arg(base.join("state"))
                    .arg("delete")
                    .arg("--force")
                    .arg(&id)
                    .output();
                for m in [e.path().join("mnt/root"), e.path().join("mnt"), e.path().join("ws")] {
                    let _ = Command::new("umount").arg("-l").arg(m).output();
                }
            }
            // A current runsc pins its gofers' empty network namespace at
            // `<root>/null-netns` for the root's life (racing creates can stack
            // binds there); `ember uninstall` unmounts it the same way.
            let netns = base.join("state/null-netns");
            while Command::new("umount").arg("-l").arg(&netns).output().is_ok_and(|o| o.status.success()) {}
            if let Ok(cg) = ember_cgroups::detect("/sys/fs/cgroup".as_ref(), &format!("{}-{class}", self.group)) {
                for name in cg.list().unwrap_or_default() {
                    let _ = cg.destroy(&name);
                }
                let _ = cg.remove_group();
            }
            // The OCI runtime also made the group in the hierarchies ember
            // does not manage (blkio, cpuset, devices, ...); empty by now.
            for h in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
                let _ = std::fs::remove_dir(h.path().join(format!("{}-{class}", self.group)));
            }
        }
        let cg = self.cgroups();
        for name in cg.list().unwrap_or_default() {
            let _ = cg.destroy(&name);
        }
        let _ = cg.remove_group();
        let _ = std::fs::remove_dir_all(&self.data_dir);
        // A data dir that is a mount of its own (`start_on_tmpfs`).
        if Command::new("umount").arg("-l").arg(&self.data_dir).output().is_ok_and(|o| o.status.success()) {
            let _ = std::fs::remove_dir(&self.data_dir);
        }
        self.remove_network();
    }
}

impl Daemon {
    /// The sandbox's runtime-side leftovers: its host dir, its cgroup, and (OCI)
    /// whether the runtime still knows the container.
    pub fn leftovers(&self, class: &str, id: &str) -> Vec<String> {
        let mut left = Vec::new();
        let (dir, group) = match class {
            "native" => (self.data_dir.join("sandboxes").join(id), self.group.clone()),
            c => (self.data_dir.join("oci").join(c).join("sandboxes").join(id), format!("{}-{c}", self.group)),
        };
        if dir.exists() {
            left.push(format!("dir {}", dir.display()));
        }
        let cg = ember_cgroups::detect("/sys/fs/cgroup".as_ref(), &group).expect("cgroups");
        if cg.exists(id) {
            left.push(format!("cgroup {group}/{id}"));
        }
        if class != "native" {
            let root = self.data_dir.join("oci").join(class).join("state");
            let st = std::process::Command::new(class).arg("--root").arg(&root).args(["state", id]).output();
            if st.is_ok_and(|o| o.status.success()) {
                left.push(format!("{class} still lists the container"));
            }
            let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            if mi.contains(id) {
                left.push("a host mount of its rootfs".into());
            }
        }
        left
    }

    fn flag(&self, name: &str) -> Option<&str> {
        self.extra.iter().position(|a| a == name).and_then(|i| self.extra.get(i + 1)).map(String::as_str)
    }

    /// Removes the slots, table and resolver address of this daemon's egress
    /// networking (they outlive the daemon by design, like its sandboxes).
    fn remove_network(&self) {
        let (Some(tag), Some(range)) = (self.flag("--network-tag"), self.flag("--network-range")) else { return };
        if range == "none" {
            return;
        }
        for dir in ["/run/netns", "/sys/class/net"] {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.strip_prefix(&format!("{tag}-")).is_some_and(|r| r.parse::<u32>().is_ok()) {
                    let _ = Command::new("ip").args(["link", "del", &n]).output();
                    let _ = Command::new("ip").args(["netns", "del", &n]).output();
                }
            }
        }
        let _ = Command::new("nft").args(["delete", "table", "inet", tag]).output();
        if let Ok(plan) = ember_net::AddrPlan::parse(range) {
            let _ = Command::new("ip").args(["addr", "del", &format!("{}/32", plan.resolver()), "dev", "lo"]).output();
        }
    }
}
