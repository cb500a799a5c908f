//! [`S3Store`]: any S3-compatible endpoint through the `object_store` crate.
//!
//! `object_store` is async; this store owns a small tokio runtime, spawns each
//! request on it and waits on a std channel, so the synchronous [`ObjectStore`]
//! calls work from any thread: plain, `spawn_blocking`, or (blocking it) even an
//! async worker of another runtime. Concurrent callers' requests run
//! concurrently on the runtime's two threads.
use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStore as _, ObjectStoreExt as _, PutPayload};

use super::{check_key, check_size, ObjectMeta, ObjectStore};
use crate::{ManifestKey, StoreError};

/// Where and how to reach the bucket. Input only: validated by [`S3Store::open`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Config {
    /// `https://host:port` or, with `allow_http`, `http://...`. Empty: AWS for `region`.
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Prefix under which all keys live (`""` for the bucket root).
    pub prefix: String,
    /// Permit plain-HTTP endpoints (loopback test servers, in-cluster MinIO).
    pub allow_http: bool,
}

/// An S3 bucket (or a prefix of one) as an [`ObjectStore`].
#[derive(Debug)]
pub struct S3Store {
    inner: Arc<AmazonS3>,
    prefix: String,
    key: ManifestKey,
    /// `Some` until drop, which shuts it down in the background: dropping a
    /// runtime the ordinary way panics inside another runtime's context.
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for S3Store {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl S3Store {
    /// Opens the bucket; its manifests are signed and verified with `key`
    /// (a cluster sharing the bucket shares the key).
    pub fn open(config: S3Config, key: ManifestKey) -> Result<Self, StoreError> {
        let bad = |reason: String| StoreError::Config { bucket: config.bucket.clone(), reason };
        if config.bucket.is_empty() {
            return Err(bad("bucket is empty".into()));
        }
        let prefix = config.prefix.trim_matches('/').to_string();
        if !prefix.is_empty() {
            check_key(&prefix).map_err(|e| bad(e.to_string()))?;
        }
        let mut builder = AmazonS3Builder::new()
            .with_bucket_name(&config.bucket)
            .with_region(if config.region.is_empty() { "us-east-1" } else { &config.region })
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key)
            .with_allow_http(config.allow_http)
            .with_virtual_hosted_style_request(false);
        if !config.endpoint.is_empty() {
            builder = builder.with_endpoint(&config.endpoint);
        }
        let inner = builder.build().map_err(|e| bad(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ember-s3")
            .enable_all()
            .build()
            .map_err(|e| bad(format!("starting its runtime: {e}")))?;
        Ok(S3Store { inner: Arc::new(inner), prefix, key, rt: Some(rt) })
    }

    fn path(&self, key: &str) -> Result<Path, StoreError> {
        check_key(key)?;
        Ok(if self.prefix.is_empty() { Path::from(key) } else { Path::from(format!("{}/{key}", self.prefix)) })
    }

    /// Runs `f(client)` on the store's runtime and waits for it.
    fn run<T, F>(&self, op: &'static str, key: &str, f: impl FnOnce(Arc<AmazonS3>) -> F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let gone = || StoreError::RuntimeStopped { op, key: key.to_string() };
        let rt = self.rt.as_ref().ok_or_else(gone)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let fut = f(Arc::clone(&self.inner));
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().map_err(|_| gone())
    }
}

fn s3<'a>(op: &'static str, key: &'a str) -> impl FnOnce(object_store::Error) -> StoreError + 'a {
    move |source| match source {
        object_store::Error::NotFound { .. } => StoreError::NotFound { key: key.to_string() },
        source => StoreError::S3 { op, key: key.to_string(), source },
    }
}

impl ObjectStore for S3Store {
    fn manifest_key(&self) -> &ManifestKey {
        &self.key
    }

    fn put(&self, key: &str, data: &[u8]) -> Result<(), StoreError> {
        let path = self.path(key)?;
        check_size(key, data.len() as u64)?;
        let payload = PutPayload::from(data.to_vec());
        self.run("put", key, |c| async move { c.put(&path, payload).await })?.map_err(s3("put", key))?;
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let path = self.path(key)?;
        let owned = key.to_string();
        // The size the server announces is checked before the body is read.
        let bytes = self.run("get", key, |c| async move {
            let got = c.get(&path).await.map_err(s3("get", &owned))?;
            check_size(&owned, got.meta.size)?;
            got.bytes().await.map_err(s3("get", &owned))
        })??;
        check_size(key, bytes.len() as u64)?;
        Ok(bytes.to_vec())
    }

    /// One ranged GET: a restore reads a packed chunk without its pack.
    fn get_range(&self, key: &str, at: u64, len: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path(key)?;
        check_size(key, len)?;
        let end = at.checked_add(len).ok_or_else(|| StoreError::InvalidKey {
            key: key.to_string(),
            reason: "a range past the largest offset",
        })?;
        let bytes = self
            .run("get range", key, |c| async move { c.get_range(&path, at..end).await })?
            .map_err(s3("get range", key))?;
        Ok(Some(bytes.to_vec()))
    }

    fn exists(&self, key: &str) -> Result<bool, StoreError> {
        let path = self.path(key)?;
        match self.run("head", key, |c| async move { c.head(&path).await })? {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(s3("head", key)(e)),
        }
    }

    fn meta(&self, key: &str) -> Result<Option<ObjectMeta>, StoreError> {
        let path = self.path(key)?;
        match self.run("head", key, |c| async move { c.head(&path).await })? {
            Ok(m) => Ok(Some(ObjectMeta { key: key.to_string(), size: m.size, modified: m.last_modified.into() })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(s3("head", key)(e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, StoreError> {
        // object_store lists by whole path segments: list the folder, filter by the full prefix.
        let folder = prefix.rfind('/').map(|i| &prefix[..i]).unwrap_or("");
        let full = match (self.prefix.is_empty(), folder.is_empty()) {
            (true, _) => folder.to_string(),
            (false, true) => self.prefix.clone(),
            (false, false) => format!("{}/{folder}", self.prefix),
        };
        let dir = if full.is_empty() { None } else { Some(Path::from(full)) };
        let listed: Vec<object_store::ObjectMeta> = self
            .run("list", prefix, |c| async move { c.list(dir.as_ref()).try_collect().await })?
            .map_err(s3("list", prefix))?;
        let strip = if self.prefix.is_empty() { String::new() } else { format!("{}/", self.prefix) };
        let mut out: Vec<ObjectMeta> = listed
            .into_iter()
            .filter_map(|m| {
                let key = m.location.as_ref().strip_prefix(strip.as_str())?.to_string();
                let modified = SystemTime::from(m.last_modified);
                key.starts_with(prefix).then_some(ObjectMeta { key, size: m.size, modified })
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key)?;
        match self.run("delete", key, |c| async move { c.delete(&path).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(s3("delete", key)(e)),
        }
    }
}
