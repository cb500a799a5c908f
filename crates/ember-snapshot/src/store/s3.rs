//! [`S3Store`]: any S3-compatible endpoint through the `object_store` crate.
//!
//! `object_store` is async; this store owns a small current-thread tokio
//! runtime and blocks on it, so the synchronous [`ObjectStore`] calls work from
//! any plain or `spawn_blocking` thread. Calling it on an async runtime thread
//! would deadlock or panic, so that is refused with
//! [`StoreError::InAsyncContext`].
use std::future::Future;
use std::time::SystemTime;

use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStore as _, ObjectStoreExt as _, PutPayload};

use super::{check_key, ObjectMeta, ObjectStore};
use crate::StoreError;

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
    inner: AmazonS3,
    prefix: String,
    /// Current-thread: the calls are sequential per caller, and a runtime with
    /// no worker threads costs nothing while idle.
    rt: tokio::runtime::Runtime,
}

impl S3Store {
    pub fn open(config: S3Config) -> Result<Self, StoreError> {
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
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| bad(format!("starting its runtime: {e}")))?;
        Ok(S3Store { inner, prefix, rt })
    }

    fn path(&self, key: &str) -> Result<Path, StoreError> {
        check_key(key)?;
        Ok(if self.prefix.is_empty() { Path::from(key) } else { Path::from(format!("{}/{key}", self.prefix)) })
    }

    fn block_on<T>(&self, op: &'static str, key: &str, fut: impl Future<Output = T>) -> Result<T, StoreError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(StoreError::InAsyncContext { op, key: key.to_string() });
        }
        Ok(self.rt.block_on(fut))
    }
}

fn s3<'a>(op: &'static str, key: &'a str) -> impl FnOnce(object_store::Error) -> StoreError + 'a {
    move |source| match source {
        object_store::Error::NotFound { .. } => StoreError::NotFound { key: key.to_string() },
        source => StoreError::S3 { op, key: key.to_string(), source },
    }
}

impl ObjectStore for S3Store {
    fn put(&self, key: &str, data: &[u8]) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let payload = PutPayload::from(data.to_vec());
        self.block_on("put", key, self.inner.put(&path, payload))?.map_err(s3("put", key))?;
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let path = self.path(key)?;
        let bytes = self.block_on("get", key, async { self.inner.get(&path).await?.bytes().await })?;
        Ok(bytes.map_err(s3("get", key))?.to_vec())
    }

    fn exists(&self, key: &str) -> Result<bool, StoreError> {
        let path = self.path(key)?;
        match self.block_on("head", key, self.inner.head(&path))? {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
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
        let listed: Vec<object_store::ObjectMeta> =
            self.block_on("list", prefix, self.inner.list(dir.as_ref()).try_collect())?.map_err(s3("list", prefix))?;
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
        match self.block_on("delete", key, self.inner.delete(&path))? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(s3("delete", key)(e)),
        }
    }
}
