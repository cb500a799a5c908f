//! The drill's faults on the local cluster: SIGKILL of k nodes and their
//! sandboxes (or, with `--partition`, their link cut), MTTD measured for
//! each, the gap, then SIGKILL of the nats-server leading the task stream
//! and how long the stream took to answer with a new leader.
use super::session::Shared;
use super::RunArgs;
use crate::cluster::state::{Host, State};
use crate::cluster::{hosts, nats, procs};
use anyhow::Context;
use ember_client::{Client, ClientError};
use serde::Serialize;
use std::time::{Duration, Instant};

/// How long a measurement may wait before it is reported as not seen.
const WITHIN: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Faults {
    pub victims: Vec<Victim>,
    pub leader: Option<LeaderKill>,
    pub notes: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Victim {
    pub host: String,
    /// `kill` or `partition`.
    pub mode: String,
    pub at_ms: u64,
    /// A sandbox of the victim's that does not rebind, probed through a
    /// survivor.
    pub probe: Option<String>,
    /// Kill → a survivor answers the probe with 503 naming the node dead.
    pub mttd_ms: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderKill {
    pub server: String,
    pub at_ms: u64,
    /// Kill → the stream names a new leader.
    pub elected_ms: Option<u64>,
    pub new_leader: Option<String>,
}

impl Faults {
    pub fn killed(&self, host: &str) -> Option<&Victim> {
        self.victims.iter().find(|v| v.host == host)
    }
}

/// `k` victims, hosts without a nats-server first (a cut host takes its
/// server off the JetStream cluster too), in the seed's order.
fn choose(st: &State, k: usize, seed: u64) -> Vec<&Host> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut plain, mut with_nats): (Vec<&Host>, Vec<&Host>) = st.hosts.iter().partition(|h| h.nats_url.is_none());
    rng.shuffle(&mut plain);
    rng.shuffle(&mut with_nats);
    plain.into_iter().chain(with_nats).take(k).collect()
}

/// The probe sandbox on host `h` (one that does not rebind).
fn probe_of(shared: &Shared, h: &Host) -> Option<String> {
    shared.probes.lock().iter().find(|(n, _)| *n == h.name).map(|(_, id)| id.clone())
}

/// One sandbox on each host that does not rebind, made through the host
/// itself (a create runs on the node that receives it): the MTTD probes.
/// A host whose probe could not be made has no MTTD (the report says so).
pub async fn open_probes(st: &State, shared: &Shared, clients: &[Client]) {
    let req = ember_types::api::CreateSandboxRequest { template: Some("host".into()), ..Default::default() };
    for (h, c) in st.hosts.iter().zip(clients) {
        match c.create_sandbox(&req).await {
            Ok((s, _)) => shared.probes.lock().push((h.name.clone(), s.id)),
            Err(e) => println!("chaos: no MTTD probe on {}: {e}", h.name),
        }
    }
}

pub async fn run(st: &State, a: &RunArgs, k: usize, shared: &Shared, clients: &[Client]) -> anyhow::Result<Faults> {
    let mut f = Faults::default();
    let victims = choose(st, k, a.seed);
    let survivor = st.hosts.iter().position(|h| !victims.iter().any(|v| v.name == h.name)).unwrap_or(0);
    let mut monitors = Vec::new();
    for h in &victims {
        let probe = probe_of(shared, h);
        let at = Instant::now();
        // The daemons first, all of them, then their sandboxes: a node's
        // sandboxes took seconds to kill under load, which spread the kills
        // of "30 % of the nodes" over 1.5-4 s (drills AA-AD), and a survivor
        // rebound sessions onto a node about to be killed.
        if a.partition {
            hosts::cut(&h.netns)?;
        } else {
            procs::kill_daemon(h);
        }
        let at_ms = shared.ms(at);
        shared.faulted.lock().insert(h.name.clone(), at_ms);
        println!("chaos: {} {} at {at_ms} ms", if a.partition { "cut" } else { "killed" }, h.name);
        let (c, p) = (clients[survivor].clone(), probe.clone());
        monitors.push(tokio::spawn(async move { mttd(&c, p.as_deref(), at).await }));
        let mode = if a.partition { "partition" } else { "kill" };
        f.victims.push(Victim { host: h.name.clone(), mode: mode.into(), at_ms, probe, mttd_ms: None });
    }
    if !a.partition {
        let hosts: Vec<Host> = victims.iter().map(|h| (*h).clone()).collect();
        let killed = tokio::task::spawn_blocking(move || hosts.iter().for_each(procs::kill_sandboxes));
        killed.await.context("killing the lost nodes' sandboxes")?;
    }
    tokio::time::sleep(a.gap).await;
    for (v, m) in f.victims.iter_mut().zip(monitors) {
        v.mttd_ms = m.await.ok().flatten();
    }
    if a.kill_queue_leader {
        let cut: Vec<&str> = if a.partition { victims.iter().map(|h| h.name.as_str()).collect() } else { vec![] };
        f.leader = Some(kill_leader(st, shared, &cut).await?);
    }
    Ok(f)
}

/// Kill → the survivor answers 503 naming the node dead for `probe`;
/// `None` if not within [`WITHIN`].
async fn mttd(c: &Client, probe: Option<&str>, at: Instant) -> Option<u64> {
    let probe = probe?;
    while at.elapsed() < WITHIN {
        match c.get_sandbox(probe).await {
            Err(ClientError::Api { status: 503, message, .. }) if message.contains("dead") => break,
            _ => tokio::time::sleep(POLL).await,
        }
    }
    (at.elapsed() < WITHIN).then(|| u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX))
}

async fn kill_leader(st: &State, shared: &Shared, cut: &[&str]) -> anyhow::Result<LeaderKill> {
    let reachable = |h: &&Host| h.nats_url.is_some() && !cut.contains(&h.name.as_str());
    let urls: Vec<String> = st.hosts.iter().filter(reachable).filter_map(|h| h.nats_url.clone()).collect();
    let old = nats::stream_leader(&urls, nats::TASK_STREAM).await?;
    let host = crate::cluster::host(st, &old)?;
    let at = Instant::now();
    if let Some(pid) = host.nats_pid {
        procs::kill_pid(pid, "nats-server");
    }
    let at_ms = shared.ms(at);
    println!("chaos: killed nats-server {old}, the task stream's leader, at {at_ms} ms");
    let rest: Vec<String> = urls.into_iter().filter(|u| host.nats_url.as_ref() != Some(u)).collect();
    let mut new_leader = None;
    while at.elapsed() < WITHIN {
        match nats::stream_leader(&rest, nats::TASK_STREAM).await {
            Ok(l) if l != old => {
                new_leader = Some(l);
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let elected_ms = new_leader.as_ref().map(|_| u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX));
    Ok(LeaderKill { server: old, at_ms, elected_ms, new_leader })
}
