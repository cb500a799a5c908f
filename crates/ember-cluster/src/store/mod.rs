//! [`NatsStore`]: ember-snapshot's [`ObjectStore`] on the cluster's JetStream
//! object store, the snapshot store of `ember serve --cluster` by default.
//!
//! One bucket (`ember_snapshots`, stream `OBJ_ember_snapshots`, R3 on a
//! cluster of three servers or more); each store key (`chunks/<digest>`,
//! `manifests/<id>.json`, gc's markers) is one object of that name, written
//! in parts of [`PART`] bytes (under the servers' default 1 MiB message
//! cap). An object's metadata message is published after its parts, so a
//! reader sees the whole object or none: the store's atomic put. Reads go to
//! the stream's leader, never "direct" to a replica: a lagging follower
//! would answer that a manifest just written on another node is not there.
//!
//! The trait is the sync one every store has: each call runs on the
//! store's own small runtime ([`Bridge`]), and rides out a leader election
//! with the queue's retry policy (`retry.rs`): a failure that can pass is
//! tried again, from the start of the call, for up to the budget. Retrying
//! is safe: a put writes its parts under a new object id each try and
//! publishes the metadata that names them last, so a try that failed half
//! way leaves unreachable parts (purged with the object's next put or
//! delete only if they were named; else they stay until the bucket is
//! dropped: a cost of a failed try, never a wrong read). No step (one
//! request, one part of a read, one listed entry) waits longer than
//! [`STEP`]: a stalled read is tried again rather than hanging the call.
//!
//! Every read is bounded: a get takes the object's size from its metadata
//! and refuses one over the cap before reading a byte, then never reads
//! more than that size.
use crate::bridge::Bridge;
use crate::retry::{again, retry, Step};
use write::{Write, Written};

mod read;
mod write;
use async_nats::jetstream::{self, object_store};
use ember_snapshot::{check_key, ManifestKey, ObjectMeta, ObjectStore, StoreError};
use futures_util::StreamExt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The bucket `ember serve --cluster` keeps snapshots in.
pub const DEFAULT_BUCKET: &str = "ember_snapshots";
/// The size of one part (one NATS message) of an object.
const PART: usize = 512 << 10;
/// No step of a call waits longer than this for the cluster.
const STEP: Duration = Duration::from_secs(5);
const BACKEND: &str = "nats object store";

/// Where the bucket is. Input only: checked by [`NatsBucket::connect`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsStoreConfig {
    /// `nats://host:port` of one or more servers of the cluster.
    pub servers: Vec<String>,
    /// `[A-Za-z0-9_-]+`.
    pub bucket: String,
    /// The bucket's replicas; `None` (the default): as the cluster keeps
    /// them, 3 on a cluster of three servers or more (survives one), else 1
    /// (`replicas.rs`).
    pub replicas: Option<usize>,
    /// How long a call retries through an election.
    pub retry_budget: Duration,
    /// The largest object put or read ([`ember_snapshot::MAX_OBJECT_BYTES`];
    /// lower in tests).
    pub max_object: u64,
}

impl NatsStoreConfig {
    pub fn new(servers: Vec<String>) -> NatsStoreConfig {
        NatsStoreConfig {
            servers,
            bucket: DEFAULT_BUCKET.into(),
            replicas: None,
            retry_budget: crate::RETRY_BUDGET,
            max_object: ember_snapshot::MAX_OBJECT_BYTES,
        }
    }
}

/// The connection to the bucket. Connecting talks to the cluster (and waits
/// through an election): do it once, off the async workers; then each
/// [`NatsStore`] made from it carries the manifest key it signs with.
#[derive(Clone)]
pub struct NatsBucket {
    inner: Arc<Inner>,
}

struct Inner {
    bridge: Bridge,
    handles: Handles,
    /// What this process last wrote under each name (`write.rs`).
    written: Arc<Written>,
    cfg: NatsStoreConfig,
}

impl NatsBucket {
    /// Connects, and creates the bucket if it does not exist (an existing
    /// one is used as it is, but for reads moved to its leader and its
    /// replicas raised to the cluster's, `replicas.rs`).
    pub fn connect(cfg: NatsStoreConfig) -> Result<NatsBucket, StoreError> {
        let name = cfg.bucket.clone();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            let reason = "a bucket name is [A-Za-z0-9_-]+".to_string();
            return Err(StoreError::Backend { backend: BACKEND, op: "open", key: name, reason });
        }
        let bridge = Bridge::new(&name).map_err(|e| unavailable("open", &name, e))?;
        let c = cfg.clone();
        let handles = bridge.run("open", &name, open(c)).map_err(|e| unavailable("open", &name, e))?;
        Ok(NatsBucket { inner: Arc::new(Inner { bridge, handles, written: Default::default(), cfg }) })
    }

    /// A store on this bucket whose manifests `key` signs and verifies.
    pub fn store(&self, key: ManifestKey) -> NatsStore {
        NatsStore { bucket: self.clone(), key }
    }
}

async fn open(cfg: NatsStoreConfig) -> Result<Handles, ember_queue::QueueError> {
    let budget = cfg.retry_budget;
    let name = cfg.bucket.clone();
    let client = retry(budget, "connect", &name, || async {
        crate::connect::options(STEP).connect(cfg.servers.as_slice()).await.map_err(again)
    })
    .await?;
    let replicas = match cfg.replicas {
        Some(n) => n,
        None => crate::replicas::for_cluster(&client, cfg.servers.len()).await,
    };
    let js = jetstream::ContextBuilder::new().timeout(STEP).build(client);
    retry(budget, "create bucket", &name, || async {
        if js.get_object_store(&name).await.is_ok() {
            return Ok(());
        }
        let description = "ember snapshots: content-addressed chunks and signed manifests";
        let config = crate::replicas::object_stream(&name, description, replicas);
        js.create_stream(config).await.map(|_| ()).map_err(again)
    })
    .await?;
    crate::queue::settle_stream(&js, &format!("OBJ_{name}"), replicas, budget).await?;
    // Fetched again: the handle keeps the stream's settings it was made with.
    let store = retry(budget, "open bucket", &name, || async { js.get_object_store(&name).await.map_err(again) });
    let stream =
        retry(budget, "open stream", &name, || async { js.get_stream(format!("OBJ_{name}")).await.map_err(again) });
    Ok(Handles { store: store.await?, stream: stream.await?, js, bucket: name })
}

fn unavailable(op: &'static str, key: &str, e: ember_queue::QueueError) -> StoreError {
    StoreError::Unavailable { backend: BACKEND, op, key: key.to_string(), reason: e.to_string() }
}

/// A definitive answer of the store (a value, or an error no retry changes).
type Answer<T> = Result<T, StoreError>;

/// The bucket as an [`ObjectStore`] with a manifest key.
pub struct NatsStore {
    bucket: NatsBucket,
    key: ManifestKey,
}

impl NatsStore {
    /// Runs one call: `f` once per try, on the bucket's runtime, retried
    /// through an election for up to the budget.
    fn call<T, Fut>(
        &self,
        op: &'static str,
        key: &str,
        f: impl Fn(Handles, u64) -> Fut + Send + Sync + 'static,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<Answer<T>, Step>> + Send,
    {
        let inner = &self.bucket.inner;
        let (handles, budget, max) = (inner.handles.clone(), inner.cfg.retry_budget, inner.cfg.max_object);
        let id = key.to_string();
        let tries = async move { Ok(retry(budget, op, &id, || f(handles.clone(), max)).await) };
        match inner.bridge.run(op, key, tries) {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) | Err(e) => Err(unavailable(op, key, e)),
        }
    }

    fn write(&self, key: &str, data: &[u8], assume_absent: bool) -> Result<(), StoreError> {
        check_key(key)?;
        if data.len() as u64 > self.bucket.inner.cfg.max_object {
            let limit = self.bucket.inner.cfg.max_object;
            return Err(StoreError::TooLarge { key: key.into(), size: data.len() as u64, limit });
        }
        let (name, data) = (key.to_string(), bytes::Bytes::copy_from_slice(data));
        let written = self.bucket.inner.written.clone();
        self.call("put", key, move |h, _| {
            let (name, data, written) = (name.clone(), data.clone(), written.clone());
            async move {
                let w = Write { name: &name, data: &data, assume_absent };
                write::put(&h, &written, &w).await.map(Ok)
            }
        })
    }
}

/// `fut` within [`STEP`], or a failure that can pass.
async fn step<T>(what: &str, fut: impl Future<Output = T>) -> Result<T, Step> {
    tokio::time::timeout(STEP, fut).await.map_err(|_| again(format!("{what}: no answer within {STEP:?}")))
}

fn failed(op: &'static str, key: &str, reason: impl std::fmt::Display) -> StoreError {
    StoreError::Backend { backend: BACKEND, op, key: key.to_string(), reason: reason.to_string() }
}

/// The bucket's handles a call's tries use.
#[derive(Clone)]
struct Handles {
    /// The library's object store: metadata lookups and listings.
    store: object_store::ObjectStore,
    /// The bucket's stream: the parts of a read (`read.rs`, one request a
    /// part); lookups and purges of `write.rs`.
    stream: jetstream::stream::Stream,
    /// Publishes of `write.rs`.
    js: jetstream::Context,
    /// The bucket's name.
    bucket: String,
}

impl ObjectStore for NatsStore {
    fn manifest_key(&self) -> &ManifestKey {
        &self.key
    }

    fn put(&self, key: &str, data: &[u8]) -> Result<(), StoreError> {
        self.write(key, data, false)
    }

    /// A chunk a lookup did not find, a new snapshot's manifest or marker:
    /// written without looking the name up first (`write.rs`).
    fn put_new(&self, key: &str, data: &[u8]) -> Result<(), StoreError> {
        self.write(key, data, true)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        check_key(key)?;
        let name = key.to_string();
        self.call("get", key, move |h, max| read::read(h, name.clone(), max))
    }

    fn exists(&self, key: &str) -> Result<bool, StoreError> {
        Ok(self.meta(key)?.is_some())
    }

    /// One object's metadata (`info`): a snapshot asks it per chunk and for
    /// the gc lock, never a listing of the whole bucket.
    fn meta(&self, key: &str) -> Result<Option<ObjectMeta>, StoreError> {
        check_key(key)?;
        let name = key.to_string();
        self.call("info", key, move |Handles { store, .. }, _| {
            let name = name.clone();
            async move {
                match step("info", store.info(&name)).await? {
                    Ok(info) if info.deleted => Ok(Ok(None)),
                    Ok(info) => {
                        let modified = info.modified.map_or_else(SystemTime::now, SystemTime::from);
                        Ok(Ok(Some(ObjectMeta { key: info.name, size: info.size as u64, modified })))
                    }
                    Err(e) if e.kind() == object_store::InfoErrorKind::NotFound => Ok(Ok(None)),
                    Err(e) => Err(again(e)),
                }
            }
        })
    }

    /// One pass over the bucket's metadata (the last of each object),
    /// filtered by `prefix`: gc's listing of `chunks/` is one request
    /// stream, not one request per chunk.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        let prefix_ = prefix.to_string();
        let mut out = self.call("list", prefix, move |Handles { store, .. }, _| {
            let prefix = prefix_.clone();
            async move {
                let mut listing = step("list", store.list()).await?.map_err(again)?;
                let mut out = Vec::new();
                while let Some(info) = step("list", listing.next()).await? {
                    let info = info.map_err(again)?;
                    if info.name.starts_with(&prefix) {
                        // A write time is the writer's clock; none is taken as now (kept by gc).
                        let modified = info.modified.map_or_else(SystemTime::now, SystemTime::from);
                        out.push(ObjectMeta { key: info.name, size: info.size as u64, modified });
                    }
                }
                Ok(Ok(out))
            }
        })?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        check_key(key)?;
        let (name, written) = (key.to_string(), self.bucket.inner.written.clone());
        self.call("delete", key, move |h, _| {
            let (name, written) = (name.clone(), written.clone());
            async move { write::delete(&h, &written, &name).await.map(Ok) }
        })
    }
}
