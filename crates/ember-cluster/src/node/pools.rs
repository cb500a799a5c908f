//! Templates and pools as the cluster's desired state.
//!
//! Two buckets: `<prefix>_templates` (name → the `TemplateRequest`, its
//! registry credentials left out) and `<prefix>_pools` (name → the pool's
//! resolved `PoolSpec`, with the cluster's min, max and target). They are
//! written only through the cluster plane (create, resize, remove through
//! any node); every node converges to them each [`HEARTBEAT`] (`converge`):
//! it registers the templates it lacks, drops those deleted from the bucket,
//! and runs its share of each pool (`share.rs`, planned from the live nodes'
//! heartbeats), an `--api-only` node none. A pool's status through any node
//! is the cluster's: the bucket's spec, the nodes' idle and starting counts
//! from their heartbeats (this node's fresh) and their sums.
use super::mirror::Mirror;
use super::plane::ClusterPlane;
use super::registry::{NodeInfo, PoolLoad, HEARTBEAT};
use super::share::{shares, NodeLoad};
use async_nats::jetstream::kv;
use ember_engine::pool::plan::{Sizing, Target};
use ember_engine::pool::{check_bounds, CreatePool, PoolNodeStatus, PoolSpec, PoolStatus};
use ember_engine::templates::Template;
use ember_engine::EngineError;
use ember_types::image::TemplateRequest;
use futures_util::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// The desired state's buckets and what this node knows of its own part.
pub(super) struct Desired {
    pools: kv::Store,
    templates: kv::Store,
    /// The two buckets as their watches keep them (the convergence reads
    /// these; the API reads the buckets, for read-your-writes).
    pools_seen: Arc<Mirror>,
    templates_seen: Arc<Mirror>,
    /// One convergence at a time: a round, or a change made through this node.
    turn: tokio::sync::Mutex<()>,
    /// Templates seen in the bucket: one gone from it was deleted through some node.
    seen_templates: Mutex<BTreeSet<String>>,
    /// This node's pools as last read (its heartbeat carries them).
    loads: Mutex<BTreeMap<String, PoolLoad>>,
}

impl Desired {
    pub(super) fn new(pools: kv::Store, templates: kv::Store) -> Desired {
        Desired {
            pools_seen: Mirror::spawn(pools.clone()),
            templates_seen: Mirror::spawn(templates.clone()),
            pools,
            templates,
            turn: Default::default(),
            seen_templates: Default::default(),
            loads: Default::default(),
        }
    }

    /// Pool `name` is in this node's copy of the pools bucket.
    pub(super) fn knows_pool(&self, name: &str) -> bool {
        self.pools_seen.get(name).is_some()
    }

    pub(super) fn loads(&self) -> BTreeMap<String, PoolLoad> {
        self.loads.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn set_loads(&self, loads: BTreeMap<String, PoolLoad>) {
        *self.loads.lock().unwrap_or_else(|p| p.into_inner()) = loads;
    }
}

fn bucket_error(what: &str, e: &dyn std::fmt::Display) -> EngineError {
    EngineError::Internal(format!("cluster {what} bucket: {e}"))
}

/// Every key's value of `store`, decoded (an undecodable one is skipped).
async fn read_all<T: serde::de::DeserializeOwned>(
    store: &kv::Store,
    what: &str,
) -> Result<BTreeMap<String, T>, EngineError> {
    let mut keys = store.keys().await.map_err(|e| bucket_error(what, &e))?;
    let mut out = BTreeMap::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| bucket_error(what, &e))?;
        if let Some(v) = store.get(&key).await.map_err(|e| bucket_error(what, &e))? {
            match serde_json::from_slice(&v) {
                Ok(t) => drop(out.insert(key, t)),
                Err(e) => tracing::warn!(bucket = what, key = %key, error = %e, "unreadable entry"),
            }
        }
    }
    Ok(out)
}

/// Every key's value of `m`, decoded, as [`read_all`].
fn read_mirror<T: serde::de::DeserializeOwned>(m: &Mirror, what: &str) -> Result<BTreeMap<String, T>, EngineError> {
    let entries = m.entries().ok_or_else(|| bucket_error(what, &"its watch has not caught up yet"))?;
    let mut out = BTreeMap::new();
    for (key, v, _) in entries {
        match serde_json::from_slice(&v) {
            Ok(t) => drop(out.insert(key, t)),
            Err(e) => tracing::warn!(bucket = what, key = %key, error = %e, "unreadable entry"),
        }
    }
    Ok(out)
}

/// Whether `k` can be a key of the buckets (pool names are `[a-z0-9-]`
/// already; a template's name is checked here).
fn valid_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= 253 && k.chars().all(|c| c.is_ascii_alphanumeric() || "-_=".contains(c))
}

/// `key`'s value and revision; `None` if absent, deleted, or no key at all.
async fn read_one<T: serde::de::DeserializeOwned>(
    store: &kv::Store,
    what: &str,
    key: &str,
) -> Result<Option<(T, u64)>, EngineError> {
    if !valid_key(key) {
        return Ok(None);
    }
    let Some(entry) = store.entry(key).await.map_err(|e| bucket_error(what, &e))? else { return Ok(None) };
    if entry.operation != kv::Operation::Put {
        return Ok(None);
    }
    let v = serde_json::from_slice(&entry.value).map_err(|e| bucket_error(what, &e))?;
    Ok(Some((v, entry.revision)))
}

/// `spec` as a create request for this node's own pool of `min`, `max`, `target`.
fn local_request(spec: &PoolSpec, min: u32, max: u32, target: Target) -> CreatePool {
    CreatePool {
        name: Some(spec.name.clone()),
        template: spec.template.clone(),
        min,
        max,
        target: Some(target),
        memory: Some(spec.resources.memory_bytes.to_string()),
        cpu: Some(format!("{}m", spec.resources.cpu_millis)),
        pids: Some(spec.resources.pids),
        disk: Some(spec.resources.disk_bytes.to_string()),
        runtime_class: Some(spec.runtime_class.clone()),
        network: Some(spec.network),
        // A policy is refused without egress (the spec keeps a default one).
        egress: (spec.network == ember_types::NetworkMode::Egress).then(|| spec.egress.clone()),
        from_snapshot: spec.from_snapshot.clone(),
        from_checkpoint: None,
        auto_pause_secs: spec.auto_pause_secs,
    }
}

/// This node's (min, max, target) of the cluster pool `spec` among `live`
/// (their heartbeats; `mine`: this node's idle members now).
fn my_part(me: &str, spec: &PoolSpec, live: &[NodeInfo], mine: u32) -> (u32, u32, Target) {
    let loads: Vec<NodeLoad> = live
        .iter()
        .filter(|n| !n.api_only)
        .map(|n| NodeLoad {
            name: n.name.clone(),
            free_memory_bytes: n.free_memory_bytes,
            idle: if n.name == me { mine } else { n.pools.get(&spec.name).map_or(0, |l| l.idle) },
        })
        .collect();
    let part = |total: u32, mem: u64| shares(total, mem, &loads).get(me).copied().unwrap_or(0);
    let mem = spec.resources.memory_bytes;
    match spec.target {
        Target::Fixed(t) => {
            let s = part(t, mem);
            (part(spec.min, 0).min(s), part(spec.max, 0).max(s), Target::Fixed(s))
        }
        Target::Auto => {
            let min = part(spec.min, mem);
            (min, part(spec.max, 0).max(min), Target::Auto)
        }
    }
}

fn load_of(s: &PoolStatus) -> PoolLoad {
    PoolLoad {
        target: s.sizing.target,
        idle: s.idle,
        starting: s.starting,
        claims: s.claims_total,
        misses: s.misses_total,
    }
}

impl ClusterPlane {
    /// Converges every [`HEARTBEAT`] for the process's life.
    pub(super) async fn converge_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let _turn = self.desired.turn.lock().await;
            // A bucket that cannot be read (an election) changes nothing here.
            if let Err(e) = self.converge_templates().await {
                tracing::warn!(error = %e, "templates of the cluster");
                continue;
            }
            if let Err(e) = self.converge_pools().await {
                tracing::warn!(error = %e, "pools of the cluster");
            }
        }
    }

    async fn converge_templates(&self) -> Result<(), EngineError> {
        let want: BTreeMap<String, TemplateRequest> = read_mirror(&self.desired.templates_seen, "templates")?;
        let have: BTreeSet<String> = self.local().templates().await?.into_iter().map(|t| t.name).collect();
        for (name, req) in want.iter().filter(|(n, _)| !have.contains(*n)) {
            if let Err(e) = self.local().create_template(req.clone()).await {
                tracing::warn!(template = %name, error = %e, "registering a template of the cluster");
            }
        }
        let gone: Vec<String> = {
            let mut seen = self.desired.seen_templates.lock().unwrap_or_else(|p| p.into_inner());
            let gone = seen.iter().filter(|n| !want.contains_key(*n) && have.contains(*n)).cloned().collect();
            *seen = want.keys().cloned().collect();
            gone
        };
        for name in gone {
            if let Err(e) = self.local().delete_template(&name).await {
                tracing::warn!(template = %name, error = %e, "dropping a template deleted from the cluster");
            }
        }
        Ok(())
    }

    /// Brings this node's pools to its share of the bucket's (the caller
    /// holds the turn).
    async fn converge_pools(&self) -> Result<(), EngineError> {
        let want: BTreeMap<String, PoolSpec> = read_mirror(&self.desired.pools_seen, "pools")?;
        let have: BTreeMap<String, PoolStatus> = self.local_pools().await?;
        for name in have.keys().filter(|n| self.api_only() || !want.contains_key(*n)) {
            if let Err(e) = self.local().remove_pool(name).await {
                tracing::warn!(pool = %name, error = %e, "removing a pool the cluster dropped");
            }
        }
        let live = self.live_nodes();
        // Before this node's own beat came back, its shares are unknown.
        if self.api_only() || !live.iter().any(|n| n.name == self.name()) {
            return Ok(());
        }
        for (name, spec) in &want {
            let now = have.get(name);
            let (min, max, target) = my_part(self.name(), spec, &live, now.map_or(0, |s| s.idle));
            let res = match now {
                None => self.local().create_pool(local_request(spec, min, max, target)).await.map(drop),
                Some(s) if (s.spec.min, s.spec.max, s.spec.target) != (min, max, target) => {
                    self.local().resize_pool(name, Some(min), Some(max), Some(target)).await.map(drop)
                }
                Some(_) => Ok(()),
            };
            if let Err(e) = res {
                tracing::warn!(pool = %name, error = %e, "this node's share of a cluster pool");
            }
        }
        Ok(())
    }

    /// This node's own pools by name, and their loads kept for the heartbeat.
    pub(super) async fn local_pools(&self) -> Result<BTreeMap<String, PoolStatus>, EngineError> {
        let pools: BTreeMap<String, PoolStatus> =
            self.local().list_pools().await?.into_iter().map(|s| (s.spec.name.clone(), s)).collect();
        self.desired.set_loads(pools.iter().map(|(n, s)| (n.clone(), load_of(s))).collect());
        Ok(pools)
    }

    /// A pool for the cluster: resolved and validated by this node's engine
    /// (a pool of no member, dropped again on an API-only node), then put in
    /// the bucket, which refuses a name taken.
    pub(super) async fn create_cluster_pool(&self, req: CreatePool) -> Result<PoolStatus, EngineError> {
        if req.from_checkpoint.is_some() {
            // Its image and source live on one node; members elsewhere could not restore it.
            return Err(EngineError::invalid(
                "fromCheckpoint",
                "a pool from a checkpoint is a single node's, not a cluster's",
            ));
        }
        let name = req.name.clone().unwrap_or_else(|| req.template.clone());
        let target = req.target.unwrap_or(Target::Auto);
        check_bounds(req.min, req.max, target)?;
        ember_types::SandboxId::try_from(name.clone())
            .map_err(|_| EngineError::invalid("name", format!("{name:?}: 1-63 of [a-z0-9-]")))?;
        let _turn = self.desired.turn.lock().await;
        if read_one::<PoolSpec>(&self.desired.pools, "pools", &name).await?.is_some() {
            return Err(EngineError::PoolExists(name));
        }
        let probe = CreatePool { min: 0, target: Some(Target::Fixed(0)), ..req.clone() };
        let resolved = match self.local().create_pool(probe.clone()).await {
            // A leftover of a pool the cluster dropped, not yet converged.
            Err(EngineError::PoolExists(_)) => {
                self.local().remove_pool(&name).await?;
                self.local().create_pool(probe).await?
            }
            r => r?,
        };
        let spec = PoolSpec { min: req.min, max: req.max, target, ..resolved.spec };
        let value = serde_json::to_vec(&spec).map_err(|e| EngineError::Internal(e.to_string()))?;
        let put = self.desired.pools.create(&name, value.into()).await;
        if put.is_err() || self.api_only() {
            let _ = self.local().remove_pool(&name).await;
        }
        match put {
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => return Err(EngineError::PoolExists(name)),
            Err(e) => return Err(bucket_error("pools", &e)),
            Ok(_) => {}
        }
        self.converge_pools().await?;
        drop(_turn);
        self.cluster_pool_status(&name).await
    }

    /// New bounds or target for the cluster's pool (compare-and-set on the
    /// bucket's revision, retried while another node changes it).
    pub(super) async fn resize_cluster_pool(
        &self,
        name: &str,
        min: Option<u32>,
        max: Option<u32>,
        target: Option<Target>,
    ) -> Result<PoolStatus, EngineError> {
        let turn = self.desired.turn.lock().await;
        for _ in 0..8 {
            let Some((mut spec, rev)) = read_one::<PoolSpec>(&self.desired.pools, "pools", name).await? else {
                return Err(EngineError::PoolNotFound(name.to_string()));
            };
            spec.min = min.unwrap_or(spec.min);
            spec.max = max.unwrap_or(spec.max);
            spec.target = target.unwrap_or(spec.target);
            check_bounds(spec.min, spec.max, spec.target)?;
            let value = serde_json::to_vec(&spec).map_err(|e| EngineError::Internal(e.to_string()))?;
            match self.desired.pools.update(name, value.into(), rev).await {
                Ok(_) => {
                    self.converge_pools().await?;
                    drop(turn);
                    return self.cluster_pool_status(name).await;
                }
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(bucket_error("pools", &e)),
            }
        }
        Err(EngineError::Internal(format!("pool {name}: changed concurrently too often; try again")))
    }

    /// Drops the pool from the bucket; every node removes its part.
    pub(super) async fn remove_cluster_pool(&self, name: &str) -> Result<(), EngineError> {
        let _turn = self.desired.turn.lock().await;
        if read_one::<PoolSpec>(&self.desired.pools, "pools", name).await?.is_none() {
            return Err(EngineError::PoolNotFound(name.to_string()));
        }
        self.desired.pools.delete(name).await.map_err(|e| bucket_error("pools", &e))?;
        self.converge_pools().await
    }

    pub(super) async fn cluster_pools(&self) -> Result<Vec<PoolStatus>, EngineError> {
        let want: BTreeMap<String, PoolSpec> = read_all(&self.desired.pools, "pools").await?;
        let mut out = Vec::with_capacity(want.len());
        for spec in want.into_values() {
            out.push(self.status_of(spec).await?);
        }
        Ok(out)
    }

    pub(super) async fn cluster_pool_status(&self, name: &str) -> Result<PoolStatus, EngineError> {
        match read_one::<PoolSpec>(&self.desired.pools, "pools", name).await? {
            Some((spec, _)) => self.status_of(spec).await,
            None => Err(EngineError::PoolNotFound(name.to_string())),
        }
    }

    /// The cluster's view of pool `spec`: each live node's part (this one's
    /// read now, the others' from their last heartbeat) and the sums; the
    /// sizing, window and memory figures are this node's.
    async fn status_of(&self, spec: PoolSpec) -> Result<PoolStatus, EngineError> {
        let mine = match self.api_only() {
            true => None,
            false => self.local().pool_status(&spec.name).await.ok(),
        };
        let mut nodes = Vec::new();
        for n in self.live_nodes().into_iter().filter(|n| !n.api_only) {
            let load = match (&mine, n.name == self.name()) {
                (Some(s), true) => load_of(s),
                _ => n.pools.get(&spec.name).cloned().unwrap_or_default(),
            };
            nodes.push((n.name, load));
        }
        let sum = |f: fn(&PoolLoad) -> u64| nodes.iter().map(|(_, l)| f(l)).sum::<u64>();
        let cluster_target = match spec.target {
            Target::Fixed(t) => t,
            Target::Auto => u32::try_from(sum(|l| u64::from(l.target))).unwrap_or(u32::MAX),
        };
        let sizing = mine.as_ref().map_or(Sizing::default(), |s| s.sizing);
        Ok(PoolStatus {
            sizing: Sizing { target: cluster_target, ..sizing },
            idle: u32::try_from(sum(|l| u64::from(l.idle))).unwrap_or(u32::MAX),
            starting: u32::try_from(sum(|l| u64::from(l.starting))).unwrap_or(u32::MAX),
            claims_total: sum(|l| l.claims),
            misses_total: sum(|l| l.misses),
            misses_window: mine.as_ref().map_or(0, |s| s.misses_window),
            create_failures: mine.as_ref().map_or(0, |s| s.create_failures),
            idle_memory_bytes: mine.as_ref().map_or(0, |s| s.idle_memory_bytes),
            nodes: nodes
                .into_iter()
                .map(|(node, l)| PoolNodeStatus { node, target: l.target, idle: l.idle, starting: l.starting })
                .collect(),
            spec,
        })
    }

    /// A template for the cluster: registered here first (its image pulled,
    /// the request checked), then put in the bucket, which refuses a name
    /// taken. The registry credentials stay on this node: the bucket is
    /// readable by every client of the NATS account.
    pub(super) async fn create_cluster_template(&self, req: TemplateRequest) -> Result<Template, EngineError> {
        let _turn = self.desired.turn.lock().await;
        let name = req.name.clone();
        if !valid_key(&name) {
            return Err(EngineError::invalid("name", format!("{name:?}: letters, digits, '-', '_' and '='")));
        }
        // Taken here (converged from the bucket) is taken in the cluster;
        // taken elsewhere only, the bucket refuses it below.
        let t = self.local().create_template(req.clone()).await?;
        let value = serde_json::to_vec(&TemplateRequest { auth: None, ..req })
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        match self.desired.templates.create(&name, value.into()).await {
            Ok(_) => {
                self.desired.seen_templates.lock().unwrap_or_else(|p| p.into_inner()).insert(name);
                Ok(t)
            }
            Err(e) => {
                let _ = self.local().delete_template(&name).await;
                match e.kind() {
                    kv::CreateErrorKind::AlreadyExists => Err(EngineError::TemplateExists(name)),
                    _ => Err(bucket_error("templates", &e)),
                }
            }
        }
    }

    /// Drops the template from the bucket (every node drops it) and here.
    pub(super) async fn delete_cluster_template(&self, name: &str) -> Result<(), EngineError> {
        let _turn = self.desired.turn.lock().await;
        let shared = read_one::<TemplateRequest>(&self.desired.templates, "templates", name).await?.is_some();
        let here = self.local().delete_template(name).await;
        if !shared {
            return here;
        }
        self.desired.templates.delete(name).await.map_err(|e| bucket_error("templates", &e))?;
        self.desired.seen_templates.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
        match here {
            Err(EngineError::UnknownTemplate(_)) => Ok(()),
            r => r,
        }
    }
}
