//! Images without a registry: a rootfs tar (one layer) or an OCI image layout
//! (as a tar), named by the caller.
use crate::config::ConfigBlob;
use crate::store::{remove_any, ImageRecord, LayerRef};
use crate::{digest, ImageError, ImageStore};
use serde::Deserialize;
use std::fs::File;
use std::io::Read;
use std::path::Path;

#[derive(Deserialize)]
struct Index {
    manifests: Vec<IndexEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IndexEntry {
    digest: String,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct LayoutManifest {
    config: LayoutDesc,
    layers: Vec<LayoutDesc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LayoutDesc {
    digest: String,
    #[serde(default)]
    media_type: String,
    #[serde(default)]
    size: u64,
}

fn bad(message: impl Into<String>) -> ImageError {
    ImageError::BadImport { message: message.into() }
}

impl ImageStore {
    /// Imports `tar` (a file) as image `name`: an OCI image layout if the tar
    /// has `oci-layout` and `index.json` at its root, else a root filesystem.
    /// Blocking.
    pub fn import_tar(&self, name: &str, tar: &Path) -> Result<ImageRecord, ImageError> {
        let name = Self::normalize(name)?;
        if is_layout(tar)? {
            return self.import_layout(&name, tar);
        }
        let data_digest = file_digest(tar)?;
        let size = std::fs::metadata(tar).map(|m| m.len()).unwrap_or(0);
        // `tar` is the daemon's own upload file, not something the caller named.
        let f = std::fs::File::open(tar).map_err(ImageError::io("open", tar))?;
        let (layer, _) = self.import_layer((f, tar), &data_digest, None, size, self.cfg.max_unpacked_bytes)?;
        let config = crate::ImageConfig {
            env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
            ..Default::default()
        };
        // The image's identity: its layer and config, as a manifest would have it.
        let id = digest::sha256(format!("{}{:?}", layer.digest, config).as_bytes());
        let rec = ImageRecord { name, digest: id, layers: vec![layer], config, created_ms: crate::store::now_ms() };
        self.disk.save_image(&rec)?;
        Ok(rec)
    }

    /// Unpacks the blob `f` unless the store has it; returns the layer and what
    /// it counts against the image's `budget`.
    fn import_layer(
        &self,
        blob: (File, &Path),
        d: &str,
        diff_id: Option<&str>,
        size: u64,
        budget: u64,
    ) -> Result<(LayerRef, u64), ImageError> {
        let used = if self.disk.has_layer(d) {
            self.stored_bytes(d)
        } else {
            let tmp = self.disk.tmp().join(format!("{}-{}", digest::file_name(d), crate::rand_suffix()));
            match self.unpack_file(blob, &tmp, (d, diff_id), size, budget) {
                Ok(used) => used,
                Err(e) => {
                    let _ = remove_any(&tmp);
                    return Err(e);
                }
            }
        };
        let meta = self.disk.layer_meta(d).unwrap_or_default();
        Ok((LayerRef { digest: d.into(), diff_id: meta.diff_id, size }, used))
    }

    fn import_layout(&self, name: &str, tar: &Path) -> Result<ImageRecord, ImageError> {
        // Unpacked with the same safe unpacker as a layer, into a private temp dir.
        let dir = self.disk.tmp().join(format!("layout-{}", crate::rand_suffix()));
        let res = (|| {
            let f = std::fs::File::open(tar).map_err(ImageError::io("open", tar))?;
            crate::unpack::unpack_layer_capped("oci-layout", f, &dir, 0, self.cfg.max_unpacked_bytes)?;
            self.import_layout_dir(name, &dir)
        })();
        let _ = remove_any(&dir);
        res
    }

    /// The layout came from the caller: every file in it is opened beneath
    /// `dir` without following a symlink, and JSON files are read to
    /// `max_config_bytes` at most.
    fn import_layout_dir(&self, name: &str, dir: &Path) -> Result<ImageRecord, ImageError> {
        let root = File::open(dir).map_err(ImageError::io("open", dir))?;
        let limit = self.cfg.max_config_bytes;
        let read = |rel: &str| -> Result<Vec<u8>, ImageError> {
            let mut data = Vec::new();
            let f = open_beneath(&root, rel)?;
            f.take(limit + 1).read_to_end(&mut data).map_err(|e| bad(format!("{rel}: {e}")))?;
            if data.len() as u64 > limit {
                let why = "ember serve --max-image-config-bytes";
                return Err(ImageError::TooLarge { what: "layout file", subject: rel.into(), limit, why });
            }
            Ok(data)
        };
        let index: Index = serde_json::from_slice(&read("index.json")?).map_err(|e| bad(format!("index.json: {e}")))?;
        let tag = name.rsplit_once(':').map(|(_, t)| t).unwrap_or("latest");
        let entry = index
            .manifests
            .iter()
            .find(|m| m.annotations.get("org.opencontainers.image.ref.name").is_some_and(|r| r == tag))
            .or(index.manifests.first())
            .ok_or_else(|| bad("index.json lists no manifest"))?;
        let blob = |d: &str| -> Result<Vec<u8>, ImageError> {
            if !digest::valid(d) {
                return Err(bad(format!("bad digest {d:?}")));
            }
            let data = read(&format!("blobs/sha256/{}", &d[7..]))?;
            crate::pull::check_digest(name, d, &data)?;
            Ok(data)
        };
        let m: LayoutManifest =
            serde_json::from_slice(&blob(&entry.digest)?).map_err(|e| bad(format!("manifest: {e}")))?;
        let cfg = ConfigBlob::parse(name, &blob(&m.config.digest)?)?;
        let diff_ids = cfg.rootfs.as_ref().map(|r| r.diff_ids.clone()).unwrap_or_default();
        if diff_ids.len() != m.layers.len() {
            return Err(bad("config diff_ids do not match the layers"));
        }
        let mut layers = Vec::new();
        let mut budget = self.cfg.max_unpacked_bytes;
        for (l, id) in m.layers.iter().zip(&diff_ids) {
            if !crate::pull::LAYER_TYPES.contains(&l.media_type.as_str()) || !digest::valid(&l.digest) {
                return Err(bad(format!("layer {} of media type {:?} is not supported", l.digest, l.media_type)));
            }
            let rel = format!("blobs/sha256/{}", &l.digest[7..]);
            let f = open_beneath(&root, &rel)?;
            let (lref, used) = self.import_layer((f, &dir.join(&rel)), &l.digest, Some(id), l.size, budget)?;
            budget = budget.saturating_sub(used);
            layers.push(lref);
        }
        let rec = ImageRecord {
            name: name.into(),
            digest: entry.digest.clone(),
            layers,
            config: cfg.image_config(),
            created_ms: crate::store::now_ms(),
        };
        self.disk.save_image(&rec)?;
        Ok(rec)
    }
}

/// Opens the regular file `rel` beneath `root`: never through a symlink (not
/// even one that stays inside) and never outside `root`.
fn open_beneath(root: &File, rel: &str) -> Result<File, ImageError> {
    use rustix::fs::{OFlags, ResolveFlags};
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let fd = rustix::fs::openat2(root, rel, flags, rustix::fs::Mode::empty(), resolve).map_err(|e| {
        let why = if e == rustix::io::Errno::LOOP || e == rustix::io::Errno::XDEV { " (a symlink?)" } else { "" };
        bad(format!("{rel}: {e}{why}"))
    })?;
    let f = File::from(fd);
    if !f.metadata().map(|m| m.is_file()).unwrap_or(false) {
        return Err(bad(format!("{rel}: not a regular file")));
    }
    Ok(f)
}

fn is_layout(tar: &Path) -> Result<bool, ImageError> {
    let f = std::fs::File::open(tar).map_err(ImageError::io("open", tar))?;
    let mut a = tar::Archive::new(f);
    let (mut layout, mut index) = (false, false);
    let Ok(entries) = a.entries() else { return Ok(false) };
    for e in entries {
        let Ok(e) = e else { return Ok(false) };
        let p = e.path().map(|p| p.into_owned()).unwrap_or_default();
        let p = p.strip_prefix("./").unwrap_or(&p).to_path_buf();
        layout |= p == Path::new("oci-layout");
        index |= p == Path::new("index.json");
        if layout && index {
            return Ok(true);
        }
    }
    Ok(false)
}

fn file_digest(p: &Path) -> Result<String, ImageError> {
    let f = std::fs::File::open(p).map_err(ImageError::io("open", p))?;
    let mut h = digest::HashingReader::new(f);
    std::io::copy(&mut h, &mut std::io::sink()).map_err(ImageError::io("read", p))?;
    Ok(h.finish())
}
