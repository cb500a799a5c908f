//! Pulls from OCI/Docker registries with `oci-client`: manifest (an index is
//! resolved to this node's platform), config, then each layer streamed to a temp
//! file, its digest checked by oci-client as it arrives (and again here before
//! the file is used), unpacked to a temp dir, its diff id checked against the
//! config, and renamed into the store.
use crate::bounds::CappedWriter;
use crate::config::ConfigBlob;
use crate::digest;
use crate::progress::{LayerState, ProgressWriter};
use crate::store::{remove_any, ImageRecord, LayerRef};
use crate::{ImageError, ImageStore};
use oci_client::errors::OciDistributionError as OciErr;
use oci_client::manifest::{self as mt, OciDescriptor};
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;
use serde::Deserialize;
use std::sync::Arc;

/// Registry credentials for one pull.
#[derive(Clone, Debug, Default)]
pub enum Auth {
    #[default]
    Anonymous,
    Basic {
        username: String,
        password: String,
    },
    Bearer(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Desc {
    #[serde(default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    size: i64,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    os: String,
    architecture: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<Desc>,
    #[serde(default)]
    layers: Vec<Desc>,
    #[serde(default)]
    manifests: Vec<Desc>,
}

/// The node's platform in OCI terms.
pub fn platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    };
    ("linux", arch)
}

pub(crate) const LAYER_TYPES: &[&str] = &[
    mt::IMAGE_LAYER_MEDIA_TYPE,
    mt::IMAGE_LAYER_GZIP_MEDIA_TYPE,
    "application/vnd.oci.image.layer.v1.tar+zstd",
    mt::IMAGE_DOCKER_LAYER_TAR_MEDIA_TYPE,
    mt::IMAGE_DOCKER_LAYER_GZIP_MEDIA_TYPE,
];

fn map_err(reference: &str, e: OciErr) -> ImageError {
    let reference = reference.to_string();
    match e {
        OciErr::UnauthorizedError { .. } | OciErr::AuthenticationFailure(_) => ImageError::Unauthorized { reference },
        OciErr::ImageManifestNotFoundError(_) => ImageError::NotInRegistry { reference },
        OciErr::ServerError { code: 401 | 403, .. } => ImageError::Unauthorized { reference },
        OciErr::ServerError { code: 404, .. } => ImageError::NotInRegistry { reference },
        OciErr::DigestError(d) => {
            ImageError::DigestMismatch { reference, digest: String::new(), message: d.to_string() }
        }
        OciErr::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|x| {
                matches!(
                    x.code,
                    oci_client::errors::OciErrorCode::Unauthorized | oci_client::errors::OciErrorCode::Denied
                )
            }) =>
        {
            ImageError::Unauthorized { reference }
        }
        OciErr::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|x| {
                matches!(
                    x.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown | oci_client::errors::OciErrorCode::NameUnknown
                )
            }) =>
        {
            ImageError::NotInRegistry { reference }
        }
        other => ImageError::Registry { reference, message: chain(&other) },
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s = format!("{s}: {m}");
        }
        cur = c.source();
    }
    s
}

impl ImageStore {
    /// Pulls `reference` (the work of one pull; callers go through
    /// [`ImageStore::pull`], which shares it between concurrent callers).
    pub(crate) async fn pull_once(self: Arc<Self>, name: String, auth: Auth) -> Result<ImageRecord, ImageError> {
        let r: Reference = name.parse().map_err(|e: oci_client::ParseError| ImageError::BadReference {
            reference: name.clone(),
            message: e.to_string(),
        })?;
        let auth = match auth {
            Auth::Anonymous => RegistryAuth::Anonymous,
            Auth::Basic { username, password } => RegistryAuth::Basic(username, password),
            Auth::Bearer(t) => RegistryAuth::Bearer(t),
        };
        let (manifest_digest, m) = self.manifest(&r, &name, &auth).await?;
        let cfg_desc = m.config.ok_or_else(|| ImageError::Registry {
            reference: name.clone(),
            message: "manifest has no config".into(),
        })?;
        for l in &m.layers {
            if !LAYER_TYPES.contains(&l.media_type.as_str()) {
                return Err(ImageError::MediaType { reference: name.clone(), media_type: l.media_type.clone() });
            }
        }
        let config = self.pull_config(&r, &name, &cfg_desc).await?;
        let blob = ConfigBlob::parse(&name, &config)?;
        let diff_ids = blob.rootfs.as_ref().map(|r| r.diff_ids.clone()).unwrap_or_default();
        if diff_ids.len() != m.layers.len() {
            return Err(ImageError::Registry {
                reference: name.clone(),
                message: "config diff_ids do not match the layers".into(),
            });
        }
        self.progress_start(&name, m.layers.iter().map(|l| (l.digest.clone(), l.size.max(0) as u64)).collect());
        let mut layers = Vec::new();
        // What the image's layers may still decompress to.
        let mut budget = self.cfg.max_unpacked_bytes;
        for (l, diff_id) in m.layers.iter().zip(&diff_ids) {
            let (lref, used) = self.clone().ensure_layer(&r, &name, l, diff_id, budget).await.map_err(|e| match e {
                // The cap is the image's, not the layer's share of it.
                ImageError::TooLarge { what: "decompressed layer", why, .. } => {
                    let limit = self.cfg.max_unpacked_bytes;
                    ImageError::TooLarge { what: "decompressed layers", subject: name.clone(), limit, why }
                }
                other => other,
            })?;
            budget = budget.saturating_sub(used);
            layers.push(lref);
        }
        let rec = ImageRecord {
            name: name.clone(),
            digest: manifest_digest,
            layers,
            config: blob.image_config(),
            created_ms: crate::store::now_ms(),
        };
        self.disk.save_image(&rec)?;
        Ok(rec)
    }

    /// The image manifest for this platform and its digest, verified.
    async fn manifest(&self, r: &Reference, name: &str, auth: &RegistryAuth) -> Result<(String, Manifest), ImageError> {
        let accept = [
            mt::OCI_IMAGE_MEDIA_TYPE,
            mt::IMAGE_MANIFEST_MEDIA_TYPE,
            mt::OCI_IMAGE_INDEX_MEDIA_TYPE,
            mt::IMAGE_MANIFEST_LIST_MEDIA_TYPE,
        ];
        let (raw, _) = self.client.pull_manifest_raw(r, auth, &accept).await.map_err(|e| map_err(name, e))?;
        if let Some(d) = r.digest() {
            check_digest(name, d, &raw)?;
        }
        let mut digest = digest::sha256(&raw);
        let mut m: Manifest = parse_manifest(name, &raw)?;
        if !m.manifests.is_empty() {
            let (os, arch) = platform();
            let pick = m
                .manifests
                .iter()
                .find(|d| d.platform.as_ref().is_some_and(|p| p.os == os && p.architecture == arch))
                .ok_or_else(|| ImageError::NoPlatform { reference: name.into(), platform: format!("{os}/{arch}") })?;
            let pr = Reference::with_digest(r.registry().into(), r.repository().into(), pick.digest.clone());
            let (raw, _) = self.client.pull_manifest_raw(&pr, auth, &accept).await.map_err(|e| map_err(name, e))?;
            check_digest(name, &pick.digest, &raw)?;
            digest = pick.digest.clone();
            m = parse_manifest(name, &raw)?;
        }
        if let Some(t) =
            m.media_type.as_deref().filter(|t| ![mt::OCI_IMAGE_MEDIA_TYPE, mt::IMAGE_MANIFEST_MEDIA_TYPE].contains(t))
        {
            return Err(ImageError::MediaType { reference: name.into(), media_type: t.into() });
        }
        Ok((digest, m))
    }

    /// The config blob, at most `max_config_bytes` of it, digest checked.
    async fn pull_config(&self, r: &Reference, name: &str, d: &Desc) -> Result<Vec<u8>, ImageError> {
        let limit = self.cfg.max_config_bytes;
        let too_large = || ImageError::TooLarge {
            what: "config blob",
            subject: format!("{name} ({})", d.digest),
            limit,
            why: "ember serve --max-image-config-bytes",
        };
        if d.size.max(0) as u64 > limit {
            return Err(too_large());
        }
        let mut w = CappedWriter::new(Vec::new(), limit);
        let res = self.client.pull_blob(r, &descriptor(d), &mut w).await;
        if w.exceeded {
            return Err(too_large());
        }
        res.map_err(|e| map_err(name, e))?;
        let config = w.into_inner();
        check_digest(name, &d.digest, &config)?;
        Ok(config)
    }

    /// Makes sure the layer is unpacked in the store: one download per digest
    /// at a time, node-wide, so images sharing a layer never fetch it twice.
    /// Returns the layer and what it counts against the image's `budget`.
    async fn ensure_layer(
        self: Arc<Self>,
        r: &Reference,
        name: &str,
        l: &Desc,
        diff_id: &str,
        budget: u64,
    ) -> Result<(LayerRef, u64), ImageError> {
        if !digest::valid(&l.digest) {
            return Err(ImageError::Registry {
                reference: name.into(),
                message: format!("bad layer digest {:?}", l.digest),
            });
        }
        let lref = LayerRef { digest: l.digest.clone(), diff_id: diff_id.to_string(), size: l.size.max(0) as u64 };
        let lock = self.layer_lock(&l.digest);
        let _guard = lock.lock().await;
        if self.disk.has_layer(&l.digest) {
            self.progress_layer(name, &l.digest, LayerState::Cached);
            return Ok((lref, self.stored_bytes(&l.digest)));
        }
        // A blob larger than what its tar may decompress to is not worth
        // fetching; one the registry sends past its stated size is a lie.
        let why = "ember serve --max-image-bytes";
        if lref.size > budget {
            return Err(ImageError::TooLarge {
                what: "decompressed layer",
                subject: l.digest.clone(),
                limit: budget,
                why,
            });
        }
        let blob_cap = if l.size > 0 { lref.size } else { budget };
        let tmp = self.disk.tmp().join(format!("{}-{}", digest::file_name(&l.digest), crate::rand_suffix()));
        let blob = tmp.with_extension("blob");
        let res = async {
            let file = tokio::fs::File::create(&blob).await.map_err(ImageError::io("create", &blob))?;
            let w = ProgressWriter::new(file, self.clone(), name.to_string(), l.digest.clone());
            let mut w = CappedWriter::new(w, blob_cap);
            self.progress_layer(name, &l.digest, LayerState::Downloading);
            let res = self.client.pull_blob(r, &descriptor(l), &mut w).await;
            if w.exceeded {
                let what = "layer blob";
                let why = "the size its manifest states";
                return Err(ImageError::TooLarge { what, subject: l.digest.clone(), limit: blob_cap, why });
            }
            res.map_err(|e| match map_err(name, e) {
                ImageError::DigestMismatch { reference, message, .. } => {
                    ImageError::DigestMismatch { reference, digest: l.digest.clone(), message }
                }
                other => other,
            })?;
            drop(w);
            self.progress_layer(name, &l.digest, LayerState::Unpacking);
            let store = self.clone();
            let (b, t, d, id) = (blob.clone(), tmp.clone(), l.digest.clone(), diff_id.to_string());
            tokio::task::spawn_blocking(move || {
                let f = std::fs::File::open(&b).map_err(ImageError::io("open blob", &b))?;
                store.unpack_file((f, &b), &t, (&d, Some(&id)), l_size(&b), budget)
            })
            .await
            .map_err(|e| ImageError::BadLayer { digest: l.digest.clone(), message: e.to_string() })?
        }
        .await;
        let _ = remove_any(&blob);
        if res.is_err() {
            let _ = remove_any(&tmp);
        }
        let used = res?;
        self.progress_layer(name, &l.digest, LayerState::Done);
        Ok((lref, used))
    }
}

fn l_size(p: &std::path::Path) -> u64 {
    std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)
}

fn parse_manifest(name: &str, raw: &[u8]) -> Result<Manifest, ImageError> {
    serde_json::from_slice(raw)
        .map_err(|e| ImageError::Registry { reference: name.into(), message: format!("manifest: {e}") })
}

fn descriptor(d: &Desc) -> OciDescriptor {
    OciDescriptor { media_type: d.media_type.clone(), digest: d.digest.clone(), size: d.size, ..Default::default() }
}

pub(crate) fn check_digest(name: &str, want: &str, data: &[u8]) -> Result<(), ImageError> {
    let got = digest::sha256(data);
    if got != want {
        return Err(ImageError::DigestMismatch {
            reference: name.into(),
            digest: want.into(),
            message: format!("got {got}"),
        });
    }
    Ok(())
}
