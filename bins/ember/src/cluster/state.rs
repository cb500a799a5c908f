//! The local cluster's state file (`<dir>/cluster.json`, mode 0600: it holds
//! the cluster's API key) and the names every part derives from its name.
use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

pub const STATE_FILE: &str = "cluster.json";
/// Every node's API port, inside its own namespace.
pub const API_PORT: u16 = 8080;
pub const NATS_PORT: u16 = 4222;
pub const ROUTE_PORT: u16 = 6222;
pub const MONITOR_PORT: u16 = 8222;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    pub name: String,
    pub dir: PathBuf,
    /// The first three octets of the hosts' /24.
    pub subnet: String,
    pub bridge: String,
    pub api_key: String,
    pub hosts: Vec<Host>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Host {
    /// `hN`: the host and its ember node.
    pub name: String,
    pub netns: String,
    /// The host-side end of its veth (the other end is `eth0` inside).
    pub veth: String,
    pub addr: String,
    pub api_url: String,
    pub cgroup_parent: String,
    pub data_dir: PathBuf,
    pub ember_pid: Option<u32>,
    /// Set on the hosts that run a nats-server.
    pub nats_url: Option<String>,
    pub monitor_url: Option<String>,
    pub nats_pid: Option<u32>,
}

impl State {
    /// The names and addresses of a new cluster; nothing made yet.
    pub fn plan(a: &super::UpArgs) -> anyhow::Result<State> {
        let ok =
            (1..=9).contains(&a.name.len()) && a.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !ok {
            bail!("--name {:?}: 1 to 9 of a-z and 0-9 (it prefixes interface names, 15 bytes at most)", a.name);
        }
        let Some(subnet) = a.subnet.strip_suffix(".0/24") else { bail!("--subnet {}: expected A.B.C.0/24", a.subnet) };
        let octets: Vec<_> = subnet.split('.').map(str::parse::<u8>).collect();
        if octets.len() != 3 || octets.iter().any(Result::is_err) {
            bail!("--subnet {}: expected A.B.C.0/24", a.subnet);
        }
        let dir = std::path::absolute(&a.dir).with_context(|| format!("--dir {}", a.dir.display()))?;
        let hosts = (1..=a.nodes)
            .map(|i| {
                let addr = format!("{subnet}.{}", 10 + i);
                let nats = i <= a.nats;
                Host {
                    name: format!("h{i}"),
                    netns: format!("{}-h{i}", a.name),
                    veth: format!("{}-v{i}", a.name),
                    api_url: format!("http://{addr}:{API_PORT}"),
                    cgroup_parent: format!("{}-h{i}", a.name),
                    data_dir: dir.join(format!("h{i}")).join("data"),
                    ember_pid: None,
                    nats_url: nats.then(|| format!("nats://{addr}:{NATS_PORT}")),
                    monitor_url: nats.then(|| format!("http://{addr}:{MONITOR_PORT}")),
                    nats_pid: None,
                    addr,
                }
            })
            .collect();
        let key: String = (0..32).map(|_| fastrand::alphanumeric()).collect();
        Ok(State {
            name: a.name.clone(),
            dir,
            subnet: subnet.to_string(),
            bridge: format!("{}-br", a.name),
            api_key: key,
            hosts,
        })
    }

    pub fn file(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Written to a temp file, then renamed: a reader never sees half.
    pub fn save(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))?;
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        let body = serde_json::to_vec_pretty(self).context("encoding the cluster state")?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(&body).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, self.file()).with_context(|| format!("renaming {}", tmp.display()))
    }

    pub fn load(dir: &Path) -> anyhow::Result<State> {
        let path = dir.join(STATE_FILE);
        let text = std::fs::read(&path)
            .with_context(|| format!("no local cluster at {} (`ember cluster up --dir ...`)", path.display()))?;
        serde_json::from_slice(&text).with_context(|| format!("reading {}", path.display()))
    }

    /// The nats URLs of the cluster, comma-separated (`--cluster`).
    pub fn nats_urls(&self) -> Vec<String> {
        self.hosts.iter().filter_map(|h| h.nats_url.clone()).collect()
    }

    /// A client of `h`'s API with the cluster's key.
    pub fn client(&self, h: &Host) -> anyhow::Result<ember_client::Client> {
        ember_client::Client::new(&h.api_url, Some(self.api_key.clone())).with_context(|| h.api_url.clone())
    }
}
