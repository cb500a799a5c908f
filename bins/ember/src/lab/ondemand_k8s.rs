//! Lab 2's Kubernetes leg: the same cold create, one per request, routed
//! through the Kubernetes API (an `ember.run` Sandbox resource created and
//! watched until `Ready=True`; `ember operator` reconciles it into a cold
//! create on this node), beside N cold creates through ember's API, each a
//! burst of N sent at once and timed the same way in the client (request
//! sent → Ready seen / answer). Around each burst the control plane's
//! counters are read (`k8s_cost.rs`): what the burst cost the API server and
//! etcd, per request. The ember burst's window is the baseline: the same
//! control plane, off the request path.
use super::k8s_cost::{Cost, Histogram, Target};
use super::report::{ms, LabReport, Table};
use super::{svg, Scale};
use crate::bench::k8s::{create_and_watch, wait_until, LABEL};
use crate::bench::stats::Series;
use anyhow::Context;
use ember_client::Client;
use ember_operator::crd::{Sandbox, SandboxSpec, SandboxStatus};
use ember_operator::k8s_openapi::jiff::Timestamp;
use ember_types::api::CreateSandboxRequest;
use kube::api::{Api, DeleteParams, ListParams};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;
use tokio::task::JoinSet;

/// The label value on the lab's Sandbox resources.
const MINE: &str = "lab2";

#[derive(clap::Args, Clone, Debug, Default)]
pub struct K8sLegArgs {
    /// Lab 2's Kubernetes leg: the kubeconfig of an API server `ember
    /// operator` reconciles for this node (default: $KUBECONFIG; with
    /// neither, the leg is skipped).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Lab 2: the kube-apiserver process whose CPU is measured (default: the
    /// one on this host listening on the kubeconfig's port, found in /proc).
    #[arg(long)]
    pub apiserver_pid: Option<u32>,
    /// Lab 2: etcd's /metrics URL (default: the API server's first
    /// --etcd-servers, when it is plain http).
    #[arg(long)]
    pub etcd_metrics: Option<String>,
}

/// One path's burst: the client-side times and what it cost.
struct Burst {
    total: Series,
    ready: usize,
    cost: Cost,
}

/// The Kubernetes path's phases, ms (from the resource's status times).
#[derive(Default)]
struct Phases {
    to_operator: Series,
    node: Series,
    to_watch: Series,
}

pub struct Leg {
    n: usize,
    target: Target,
    kube: Burst,
    ember: Burst,
    phases: Phases,
    /// The host's load average around the leg: the figures are this machine's at that load.
    load: String,
}

/// Runs the leg when a Kubernetes API is given; `None`: skipped.
pub async fn run(client: &Client, args: &K8sLegArgs, scale: Scale, template: &str) -> anyhow::Result<Option<Leg>> {
    if args.kubeconfig.is_none() && std::env::var_os("KUBECONFIG").is_none() {
        return Ok(None);
    }
    let n = match scale {
        Scale::Small => 10,
        Scale::Full => 50,
    };
    let config = crate::commands::operator::kube_config(args.kubeconfig.as_deref()).await?;
    let port = config.cluster_url.port_u16().unwrap_or(443);
    let kube = kube::Client::try_from(config).context("kubernetes client")?;
    let target = Target::find(args.apiserver_pid, port, args.etcd_metrics.clone());
    let ns = kube.default_namespace().to_string();
    let api: Api<Sandbox> = Api::namespaced(kube.clone(), &ns);
    eprintln!("  Kubernetes leg: {n} Sandbox resources in {ns}, then {n} creates through ember's API");
    let load_before = crate::bench::k8s::loadavg();
    let before = target.read(&kube).await?;
    let (kube_total, statuses) = kube_burst(&api, n, template).await;
    // The resources are deleted whatever the reading gave.
    let after = target.read(&kube).await;
    let gone = delete_mine(&api).await;
    let after = after?;
    let ember_before = target.read(&kube).await?;
    let (ember_total, ids) = ember_burst(client, n, template).await;
    let ember_after = target.read(&kube).await;
    let left = crate::bench::pool::remove_all(client, ids).await;
    let ember_after = ember_after?;
    gone?;
    anyhow::ensure!(left.is_empty(), "could not remove sandboxes {left:?}");
    let mut phases = Phases::default();
    for (sent, seen, st) in &statuses {
        phases.add(*sent, *seen, st);
    }
    let kube_b = Burst { ready: statuses.len(), total: kube_total, cost: Cost::between(&before, &after) };
    let ember_b = Burst {
        ready: ember_total.summary().samples,
        total: ember_total,
        cost: Cost::between(&ember_before, &ember_after),
    };
    let load = format!("{load_before} before, {} after", crate::bench::k8s::loadavg());
    Ok(Some(Leg { n, target, kube: kube_b, ember: ember_b, phases, load }))
}

type Timed = (Timestamp, Timestamp, SandboxStatus);

/// `n` requests sent at once, each timed from before `request` is called to
/// its answer: the times of those answered, and their answers.
async fn burst<T, F, Fut>(n: usize, request: F) -> (Series, Vec<T>)
where
    T: Send + 'static,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>> + Send + 'static,
{
    let mut set = JoinSet::new();
    for _ in 0..n {
        let (t0, r) = (Instant::now(), request());
        set.spawn(async move { (r.await, t0.elapsed()) });
    }
    let (mut total, mut done) = (Series::default(), Vec::new());
    while let Some(r) = set.join_next().await {
        match r {
            Ok((Ok(t), took)) => {
                total.push(took);
                done.push(t);
            }
            Ok((Err(e), _)) => total.fail(e),
            Err(e) => total.fail(e),
        }
    }
    (total, done)
}

/// N Sandbox resources created at once, each watched until Ready.
async fn kube_burst(api: &Api<Sandbox>, n: usize, template: &str) -> (Series, Vec<Timed>) {
    burst(n, || {
        let (api, template) = (api.clone(), template.to_string());
        async move {
            let spec = SandboxSpec { template, resources: None, timeout_seconds: None };
            let seen = Mutex::new(None);
            let sent = Timestamp::now();
            create_and_watch(&api, Sandbox::new("", spec), MINE, |s: Sandbox| {
                let st = s.status.unwrap_or_default();
                let ready = ember_operator::conditions::find(&st.conditions, "Ready").is_some_and(|c| c.is_true());
                ready.then(|| *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(st)).map(|_| false)
            })
            .await?;
            let st = seen.into_inner().unwrap_or_else(|e| e.into_inner()).ok_or("no status")?;
            Ok((sent, Timestamp::now(), st))
        }
    })
    .await
}

/// N cold creates through ember's API at once, each timed to its answer.
async fn ember_burst(client: &Client, n: usize, template: &str) -> (Series, Vec<String>) {
    burst(n, || {
        let client = client.clone();
        let req = CreateSandboxRequest { template: Some(template.into()), ..Default::default() };
        async move { client.create_sandbox(&req).await.map(|(s, _)| s.id).map_err(|e| e.to_string()) }
    })
    .await
}

/// Deletes the lab's Sandbox resources; their finalizers remove the node sandboxes.
async fn delete_mine(api: &Api<Sandbox>) -> anyhow::Result<()> {
    let lp = ListParams::default().labels(&format!("{LABEL}={MINE}"));
    api.delete_collection(&DeleteParams::default(), &lp).await.context("deleting the lab's Sandbox resources")?;
    wait_until("the lab's Sandbox resources gone", || async { Ok(api.list(&lp).await?.items.is_empty()) }).await
}

impl Phases {
    /// Same host, same clock: the operator's status times against the client's.
    fn add(&mut self, sent: Timestamp, seen: Timestamp, st: &SandboxStatus) {
        let at = |s: Option<&str>| s.and_then(|s| s.parse::<Timestamp>().ok());
        let started = at(st.started_at.as_deref());
        let ready = ember_operator::conditions::find(&st.conditions, "Ready");
        let ready = at(ready.and_then(|c| c.last_transition_time.as_deref()));
        let ms = |a: Timestamp, b: Timestamp| b.duration_since(a).as_secs_f64() * 1000.0;
        if let (Some(s), Some(r)) = (started, ready) {
            self.to_operator.push_ms(ms(sent, s));
            self.node.push_ms(ms(s, r));
            self.to_watch.push_ms(ms(r, seen));
        }
    }
}

fn hist_json(h: &Histogram) -> serde_json::Value {
    let q = |p| h.quantile(p).map(|s| s * 1000.0);
    serde_json::json!({ "count": h.count(), "p50Ms": q(0.5), "p99Ms": q(0.99) })
}

fn per(v: f64, n: usize) -> String {
    format!("{v:.0} ({:.1} per request)", v / n as f64)
}

/// `what`: what the histogram counts (fsyncs, commits).
fn latency(h: &Histogram, what: &str) -> String {
    let q = |p| ms(h.quantile(p).map(|s| s * 1000.0));
    format!("{:.0} {what}, p50 {} ms, p99 {} ms", h.count(), q(0.5), q(0.99))
}

/// The leg's tables, invariants, chart and figures in lab 2's report.
pub fn add(r: &mut LabReport, leg: Option<&Leg>, dir: &Path) -> anyhow::Result<serde_json::Value> {
    let Some(l) = leg else {
        r.notes.push("The Kubernetes leg was skipped: give `--kubeconfig FILE` (or KUBECONFIG) of an API server that `ember operator --ember-url <this node>` reconciles (labs/02-on-demand/README.md).".into());
        return Ok(serde_json::Value::Null);
    };
    let n = l.n;
    let mut t = Table::new(
        &format!("A cold create per request, burst of {n} sent at once: through the Kubernetes API and through ember's API, ms"),
        &["", "Kubernetes API (Sandbox → Ready)", "ember API (create → answer)"],
    );
    let (k, e) = (l.kube.total.summary(), l.ember.total.summary());
    t.row(vec!["p50".into(), ms(k.p50_ms), ms(e.p50_ms)]);
    t.row(vec!["p99".into(), ms(k.p99_ms), ms(e.p99_ms)]);
    let p50 = |s: &Series| ms(s.summary().p50_ms);
    t.row(vec!["p50: created → operator asks the node".into(), p50(&l.phases.to_operator), "-".into()]);
    t.row(vec!["p50: the node's cold create".into(), p50(&l.phases.node), "(all of it)".into()]);
    t.row(vec!["p50: Ready written → watch event seen".into(), p50(&l.phases.to_watch), "-".into()]);
    t.row(vec!["a pod on demand (published, not measured here)".into(), "45,000–90,000".into(), "-".into()]);
    r.tables.push(t);
    let mut c = Table::new(
        &format!("What each burst cost the control plane ({n} requests)"),
        &["", "Kubernetes API burst", "ember API burst (baseline)"],
    );
    let cpu = |b: &Burst| {
        b.cost.cpu_seconds.map_or("-".into(), |s| format!("{s:.2} s ({:.1} ms per request)", s * 1000.0 / n as f64))
    };
    c.row(vec!["kube-apiserver CPU".into(), cpu(&l.kube), cpu(&l.ember)]);
    let reqs = |b: &Burst| per(b.cost.requests.values().fold(0.0, |s, v| s + v.0), n);
    c.row(vec!["API requests (all)".into(), reqs(&l.kube), reqs(&l.ember)]);
    let writes = |b: &Burst| per(b.cost.writes().0, n);
    c.row(vec!["API writes (POST/PUT/PATCH/DELETE)".into(), writes(&l.kube), writes(&l.ember)]);
    let verbs = |b: &Burst| {
        let v: Vec<String> =
            b.cost.requests.iter().filter(|(_, c)| c.1 > 0.0).map(|(v, c)| format!("{v} {:.0}", c.1)).collect();
        if v.is_empty() {
            "0".into()
        } else {
            v.join(", ")
        }
    };
    c.row(vec!["requests on ember.run sandboxes, by verb".into(), verbs(&l.kube), verbs(&l.ember)]);
    c.row(vec!["etcd puts".into(), per(l.kube.cost.etcd_puts, n), per(l.ember.cost.etcd_puts, n)]);
    let (wal, commit) =
        (|b: &Burst| latency(&b.cost.wal_fsync, "fsyncs"), |b: &Burst| latency(&b.cost.backend_commit, "commits"));
    c.row(vec!["etcd WAL fsync".into(), wal(&l.kube), wal(&l.ember)]);
    c.row(vec!["etcd backend commit".into(), commit(&l.kube), commit(&l.ember)]);
    r.tables.push(c);
    r.notes
        .push(format!("kube-apiserver: {}; etcd: {}; load average {}.", l.target.pid_from, l.target.etcd_from, l.load));
    r.check(
        "every request of both paths became Ready",
        l.kube.ready == n && l.ember.ready == n,
        format!("Kubernetes {} of {n}, ember {} of {n}", l.kube.ready, l.ember.ready),
    );
    r.check(
        "the Kubernetes path wrote to etcd at least once per request",
        l.kube.cost.etcd_puts >= n as f64 && n > 0,
        format!("{:.0} etcd puts for {n} requests", l.kube.cost.etcd_puts),
    );
    let cpu = l.kube.cost.cpu_seconds.unwrap_or(0.0);
    r.check(
        "the API server's CPU during the burst was measured",
        cpu > 0.0,
        format!("{cpu:.2} s ({})", l.target.pid_from),
    );
    let bars = vec![
        ("ember API".to_string(), e.p50_ms.unwrap_or(0.0)),
        ("Kubernetes API".to_string(), k.p50_ms.unwrap_or(0.0)),
    ];
    r.chart(dir, "k8s.svg", svg::bars(&format!("A cold create per request, burst of {n}, p50"), "ms", &bars))?;
    let cost = |b: &Burst| {
        serde_json::json!({
            "ready": b.ready, "total": b.total.summary(), "apiserverCpuSeconds": b.cost.cpu_seconds,
            "requestsByVerb": b.cost.requests.iter().map(|(v, c)| (v.clone(), c.0)).collect::<std::collections::BTreeMap<_, _>>(),
            "writes": b.cost.writes().0, "etcdPuts": b.cost.etcd_puts,
            "walFsync": hist_json(&b.cost.wal_fsync), "backendCommit": hist_json(&b.cost.backend_commit),
        })
    };
    Ok(serde_json::json!({
        "requests": n, "apiserver": l.target.pid_from, "etcd": l.target.etcd_from, "loadAverage": l.load,
        "kubernetes": cost(&l.kube), "ember": cost(&l.ember),
        "phases": { "toOperator": l.phases.to_operator.summary(), "node": l.phases.node.summary(), "toWatch": l.phases.to_watch.summary() },
    }))
}
