//! OCI images for ember: pulls from registries, imports without one, and a
//! node-wide store of unpacked layers that sandboxes use as overlay lower dirs.
//!
//! Guarantees:
//! - every blob's content is checked against its digest before it is used
//!   (manifests, configs, layers; layers also against the config's diff ids);
//! - a layer is unpacked once per node and shared by every image that lists it;
//!   concurrent pulls of one image share one download, and concurrent pulls of
//!   two images sharing a layer fetch it once;
//! - a layer becomes visible only complete (temp dir + rename); a failed or
//!   interrupted pull leaves nothing but temp files, removed at the next open;
//! - unpacking never writes outside the layer dir (see `unpack.rs`).
//!
//! Layout: `pull.rs` (registry), `import.rs` (tar / OCI layout), `unpack.rs`
//! (safe layer unpack), `store.rs` (disk layout, records, prune), `config.rs`
//! (image config, users), `progress.rs` (pulls in flight).
#![forbid(unsafe_code)]

mod bounds;
mod config;
pub mod digest;
mod error;
mod import;
mod progress;
mod pull;
mod store;
pub mod unpack;

pub use bounds::{DEFAULT_MAX_CONFIG_BYTES, DEFAULT_MAX_UNPACKED_BYTES};
pub use config::{resolve_user, ImageConfig};
pub use error::ImageError;
pub use progress::{LayerProgress, LayerState, PullProgress};
pub use pull::{platform, Auth};
pub use store::{ImageRecord, LayerMeta, LayerRef, PruneReport};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Store configuration, fixed at daemon start.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// `<data-dir>/images`.
    pub root: PathBuf,
    /// Host id that sandbox id 0 maps to: layer files are owned from there.
    pub uid_base: u32,
    /// Registries (`host:port`) reached over plain http.
    pub insecure_registries: Vec<String>,
    /// Most bytes an image's layers may decompress to, summed; also caps the
    /// upload an import unpacks ([`DEFAULT_MAX_UNPACKED_BYTES`]).
    pub max_unpacked_bytes: u64,
    /// Largest image config blob, and JSON file of an imported layout, read
    /// into memory ([`DEFAULT_MAX_CONFIG_BYTES`]).
    pub max_config_bytes: u64,
}

type SharedPull = Shared<BoxFuture<'static, Result<ImageRecord, Arc<ImageError>>>>;

pub struct ImageStore {
    cfg: StoreConfig,
    disk: store::Disk,
    client: oci_client::Client,
    /// Pulls in flight by reference. A std Mutex: held only to look up or insert.
    inflight: Mutex<HashMap<String, SharedPull>>,
    /// One async lock per layer digest being fetched; held across the download,
    /// so it is tokio's.
    layer_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    progress: Mutex<BTreeMap<String, PullProgress>>,
    /// [`resolve_user`]'s answers by (layer digests, user spec): layers never
    /// change under a digest, so neither does the answer, and a create need
    /// not read the image's /etc/passwd again.
    users: Mutex<HashMap<UserKey, (u32, u32)>>,
}

/// An image's layer digests (bottom first) and a user spec.
type UserKey = (Vec<String>, String);

/// Most remembered [`ImageStore::resolve_user`] answers; past it the map starts over.
const USERS_CACHED: usize = 1024;

impl ImageStore {
    pub fn open(cfg: StoreConfig) -> Result<ImageStore, ImageError> {
        // ring as the TLS provider (oci-client is built without one); an error
        // means one is installed already, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let disk = store::Disk::open(&cfg.root)?;
        let protocol = oci_client::client::ClientProtocol::HttpsExcept(cfg.insecure_registries.clone());
        let client = oci_client::Client::new(oci_client::client::ClientConfig {
            protocol,
            connect_timeout: Some(std::time::Duration::from_secs(10)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            ..Default::default()
        });
        Ok(ImageStore {
            cfg,
            disk,
            client,
            inflight: Mutex::new(HashMap::new()),
            layer_locks: Mutex::new(HashMap::new()),
            progress: Mutex::new(BTreeMap::new()),
            users: Mutex::new(HashMap::new()),
        })
    }

    pub fn uid_base(&self) -> u32 {
        self.cfg.uid_base
    }

    /// `busybox` → `docker.io/library/busybox:latest`; digests kept.
    pub fn normalize(reference: &str) -> Result<String, ImageError> {
        let r: oci_client::Reference = reference.parse().map_err(|e: oci_client::ParseError| {
            ImageError::BadReference { reference: reference.to_string(), message: e.to_string() }
        })?;
        Ok(r.whole())
    }

    /// The stored image named `reference` (any spelling), or with that manifest digest.
    pub fn get(&self, reference: &str) -> Result<ImageRecord, ImageError> {
        if digest::valid(reference) {
            return self
                .disk
                .images()
                .into_iter()
                .find(|i| i.digest == reference)
                .ok_or_else(|| ImageError::NotFound(reference.into()));
        }
        let name = Self::normalize(reference)?;
        self.disk.load_image(&name).ok_or(ImageError::NotFound(name))
    }

    pub fn list(&self) -> Vec<ImageRecord> {
        self.disk.images()
    }

    /// Forgets an image; its layers stay until `prune`.
    pub fn remove(&self, reference: &str) -> Result<ImageRecord, ImageError> {
        let rec = self.get(reference)?;
        self.disk.remove_image(&rec.name)?;
        Ok(rec)
    }

    /// Removes every layer no image lists and `in_use` (layer digests of live
    /// sandboxes) does not name.
    pub fn prune(&self, in_use: &HashSet<String>) -> Result<PruneReport, ImageError> {
        self.disk.prune(in_use)
    }

    /// Layers on disk with how many images use each.
    pub fn layers(&self) -> Vec<(LayerMeta, usize)> {
        self.disk.layers().into_values().collect()
    }

    /// The image's unpacked layers in overlay `lowerdir` order: top first.
    pub fn lower_dirs(&self, rec: &ImageRecord) -> Vec<PathBuf> {
        rec.layers.iter().rev().map(|l| self.disk.layer_rootfs(&l.digest)).collect()
    }

    /// The numeric ids of `user` (a name, uid, `name:group`...) in this image.
    pub fn resolve_user(&self, rec: &ImageRecord, user: &str) -> Result<(u32, u32), ImageError> {
        let key = (rec.layers.iter().map(|l| l.digest.clone()).collect(), user.to_string());
        if let Some(ids) = self.users.lock().get(&key) {
            return Ok(*ids);
        }
        let ids = config::resolve_user(&rec.name, &self.lower_dirs(rec), user)?;
        let mut users = self.users.lock();
        if users.len() >= USERS_CACHED {
            users.clear();
        }
        users.insert(key, ids);
        Ok(ids)
    }

    /// Pulls `reference` into the store; concurrent pulls of the same reference
    /// share one download. The pull runs in its own task, so a caller that goes
    /// away does not cancel it for the others.
    pub async fn pull(self: &Arc<Self>, reference: &str, auth: Auth) -> Result<ImageRecord, ImageError> {
        let name = Self::normalize(reference)?;
        let fut = {
            let mut map = self.inflight.lock();
            match map.get(&name) {
                Some(f) => f.clone(),
                None => {
                    let (store, key) = (self.clone(), name.clone());
                    let task = tokio::spawn(async move {
                        let r = store.clone().pull_once(key.clone(), auth).await;
                        store.progress_end(&key);
                        store.inflight.lock().remove(&key);
                        r.map_err(Arc::new)
                    });
                    let join = task.map(|j| {
                        j.unwrap_or_else(|e| {
                            Err(Arc::new(ImageError::Registry { reference: String::new(), message: e.to_string() }))
                        })
                    });
                    let shared = join.boxed().shared();
                    map.insert(name.clone(), shared.clone());
                    shared
                }
            }
        };
        fut.await.map_err(|e| e.duplicate())
    }

    /// A fresh path in the store's temp dir (emptied at every open), for an
    /// upload about to be imported.
    pub fn temp_path(&self, what: &str) -> PathBuf {
        self.disk.tmp().join(format!("{what}-{}", rand_suffix()))
    }

    fn layer_lock(&self, digest: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut m = self.layer_locks.lock();
        m.retain(|_, l| Arc::strong_count(l) > 1);
        m.entry(digest.to_string()).or_default().clone()
    }

    /// Unpacks the blob `f` (file `blob`, digest `digest`) via `tmp` into the
    /// store, checking the blob's digest and, when given, its diff id, and
    /// refusing it past `max_bytes` decompressed. Returns the decompressed
    /// size. The caller opens `f`, so it decides how `blob` may be resolved.
    /// Blocking.
    pub(crate) fn unpack_file(
        &self,
        (f, blob): (std::fs::File, &Path),
        tmp: &Path,
        (digest, diff_id): (&str, Option<&str>),
        size: u64,
        max_bytes: u64,
    ) -> Result<u64, ImageError> {
        let mut hashing = digest::HashingReader::new(f);
        let _ = std::fs::create_dir(tmp);
        let rootfs = tmp.join("rootfs");
        let unpacked = unpack::unpack_layer_capped(digest, &mut hashing, &rootfs, self.cfg.uid_base, max_bytes)?;
        std::io::copy(&mut hashing, &mut std::io::sink()).map_err(ImageError::io("read blob", blob))?;
        let got = hashing.finish();
        if got != digest {
            return Err(ImageError::DigestMismatch {
                reference: String::new(),
                digest: digest.into(),
                message: format!("got {got}"),
            });
        }
        if let Some(want) = diff_id.filter(|d| *d != unpacked.diff_id) {
            return Err(ImageError::BadLayer {
                digest: digest.into(),
                message: format!("diff id {} does not match the config's {want}", unpacked.diff_id),
            });
        }
        let meta = LayerMeta {
            digest: digest.into(),
            diff_id: unpacked.diff_id,
            size,
            unpacked_bytes: unpacked.bytes,
            skipped_devices: unpacked.skipped_devices,
        };
        self.disk.publish_layer(tmp, &meta)?;
        Ok(unpacked.tar_bytes)
    }

    /// What a layer already in the store counts against an image's cap: its
    /// files' bytes (its tar's size is not kept; the headers are noise).
    pub(crate) fn stored_bytes(&self, digest: &str) -> u64 {
        self.disk.layer_meta(digest).map(|m| m.unpacked_bytes).unwrap_or(0)
    }
}

/// A short random suffix for temp names.
pub(crate) fn rand_suffix() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // Uniqueness is all a temp name needs: the pid and the clock give it here.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        b = (t.as_nanos() as u64 ^ u64::from(std::process::id()) << 40).to_le_bytes();
    }
    digest::hex(&b)
}

impl ImageError {
    /// A copy for each waiter of a shared pull (io errors keep kind and text).
    fn duplicate(&self) -> ImageError {
        use ImageError as E;
        match self {
            E::BadReference { reference, message } => {
                E::BadReference { reference: reference.clone(), message: message.clone() }
            }
            E::NotFound(s) => E::NotFound(s.clone()),
            E::Unauthorized { reference } => E::Unauthorized { reference: reference.clone() },
            E::NotInRegistry { reference } => E::NotInRegistry { reference: reference.clone() },
            E::Registry { reference, message } => {
                E::Registry { reference: reference.clone(), message: message.clone() }
            }
            E::DigestMismatch { reference, digest, message } => {
                E::DigestMismatch { reference: reference.clone(), digest: digest.clone(), message: message.clone() }
            }
            E::NoPlatform { reference, platform } => {
                E::NoPlatform { reference: reference.clone(), platform: platform.clone() }
            }
            E::MediaType { reference, media_type } => {
                E::MediaType { reference: reference.clone(), media_type: media_type.clone() }
            }
            E::UnsafeEntry { digest, entry, message } => {
                E::UnsafeEntry { digest: digest.clone(), entry: entry.clone(), message: message.clone() }
            }
            E::BadLayer { digest, message } => E::BadLayer { digest: digest.clone(), message: message.clone() },
            E::TooLarge { what, subject, limit, why } => {
                E::TooLarge { what, subject: subject.clone(), limit: *limit, why }
            }
            other => E::Registry { reference: String::new(), message: pull_chain(other) },
        }
    }
}

fn pull_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s = format!("{s}: {c}");
        cur = c.source();
    }
    s
}
