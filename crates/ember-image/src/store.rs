//! The on-disk store: content-addressed unpacked layers and image records.
//!
//! Layout under `<data>/images/`:
//! - `layers/sha256-<hex>/rootfs`: one unpacked layer, named by its blob digest,
//!   shared by every image that has it; `layer.json` beside it. A layer dir
//!   appears only by `rename` of a finished temp dir, so a half-written layer is
//!   never visible.
//! - `refs/<sha256 of the name>.json`: one image record per name (`name:tag`).
//! - `tmp/`: downloads and unpacks in progress; emptied when the store opens.
//!
//! Layers are reference-counted by the image records that list them; `prune`
//! removes the ones no record (and no running sandbox) uses.
//!
//! The store is the only writer of `refs/`, so it keeps the records it has
//! read or written in memory: a create from an image reads no file for its
//! record (a read and a JSON parse per create, several times over, before).
use crate::config::ImageConfig;
use crate::digest;
use crate::ImageError;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerRef {
    /// Digest of the blob as stored in the registry (compressed).
    pub digest: String,
    /// Digest of the uncompressed tar.
    pub diff_id: String,
    /// Compressed size in bytes.
    pub size: u64,
}

/// An image the store holds: a name, its manifest digest, its layers bottom
/// first, and the config ember honours.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    pub name: String,
    pub digest: String,
    pub layers: Vec<LayerRef>,
    pub config: ImageConfig,
    pub created_ms: i64,
}

impl ImageRecord {
    pub fn size(&self) -> u64 {
        self.layers.iter().map(|l| l.size).sum()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerMeta {
    pub digest: String,
    pub diff_id: String,
    pub size: u64,
    /// Bytes of regular files once unpacked.
    pub unpacked_bytes: u64,
    /// Device nodes the unpacker left out of this layer.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_devices: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneReport {
    pub removed_layers: Vec<String>,
    pub freed_bytes: u64,
}

pub(crate) struct Disk {
    pub root: PathBuf,
    /// Records by name, as last read from or written to `refs/` (a std
    /// Mutex: held for a lookup or an insert, never across IO).
    records: Mutex<HashMap<String, ImageRecord>>,
}

impl Disk {
    pub fn open(root: &Path) -> Result<Disk, ImageError> {
        for d in ["layers", "refs", "tmp"] {
            let p = root.join(d);
            std::fs::create_dir_all(&p).map_err(ImageError::io("create image store dir", &p))?;
        }
        let tmp = root.join("tmp");
        // Leftovers of an interrupted download or unpack: never part of the store.
        for e in std::fs::read_dir(&tmp).map_err(ImageError::io("read", &tmp))?.flatten() {
            let _ = remove_any(&e.path());
        }
        Ok(Disk { root: root.to_path_buf(), records: Mutex::new(HashMap::new()) })
    }

    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    pub fn layer_dir(&self, digest: &str) -> PathBuf {
        self.root.join("layers").join(digest::file_name(digest))
    }

    /// The unpacked root of a layer (an overlay lower dir).
    pub fn layer_rootfs(&self, digest: &str) -> PathBuf {
        self.layer_dir(digest).join("rootfs")
    }

    pub fn has_layer(&self, digest: &str) -> bool {
        self.layer_dir(digest).join("layer.json").is_file()
    }

    pub fn layer_meta(&self, digest: &str) -> Option<LayerMeta> {
        serde_json::from_slice(&std::fs::read(self.layer_dir(digest).join("layer.json")).ok()?).ok()
    }

    /// Publishes a finished temp dir (with `rootfs/` inside) as a layer.
    pub fn publish_layer(&self, tmp_dir: &Path, meta: &LayerMeta) -> Result<(), ImageError> {
        let f = tmp_dir.join("layer.json");
        let json = serde_json::to_vec_pretty(meta).unwrap_or_default();
        std::fs::write(&f, json).map_err(ImageError::io("write", &f))?;
        let dest = self.layer_dir(&meta.digest);
        match std::fs::rename(tmp_dir, &dest) {
            Ok(()) => Ok(()),
            // Another unpack of the same content won the race: same bytes, keep it.
            Err(_) if self.has_layer(&meta.digest) => remove_any(tmp_dir),
            Err(e) => Err(ImageError::Io { what: "publish layer", path: dest, source: e }),
        }
    }

    fn ref_path(&self, name: &str) -> PathBuf {
        self.root.join("refs").join(format!("{}.json", &digest::sha256(name.as_bytes())[7..]))
    }

    pub fn save_image(&self, rec: &ImageRecord) -> Result<(), ImageError> {
        let p = self.ref_path(&rec.name);
        let tmp = self.tmp().join(format!("ref-{}", &digest::sha256(rec.name.as_bytes())[7..23]));
        let json = serde_json::to_vec_pretty(rec).unwrap_or_default();
        std::fs::write(&tmp, json).map_err(ImageError::io("write", &tmp))?;
        std::fs::rename(&tmp, &p).map_err(ImageError::io("publish image record", &p))?;
        self.records.lock().insert(rec.name.clone(), rec.clone());
        Ok(())
    }

    pub fn load_image(&self, name: &str) -> Option<ImageRecord> {
        if let Some(rec) = self.records.lock().get(name) {
            return Some(rec.clone());
        }
        let rec: ImageRecord = serde_json::from_slice(&std::fs::read(self.ref_path(name)).ok()?).ok()?;
        self.records.lock().insert(name.to_string(), rec.clone());
        Some(rec)
    }

    pub fn images(&self) -> Vec<ImageRecord> {
        let mut out: Vec<ImageRecord> = std::fs::read_dir(self.root.join("refs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    pub fn remove_image(&self, name: &str) -> Result<(), ImageError> {
        let p = self.ref_path(name);
        // Forgotten first: a failed remove reads the file again next time.
        self.records.lock().remove(name);
        std::fs::remove_file(&p).map_err(ImageError::io("remove image record", &p))
    }

    /// Every layer on disk with the number of image records that use it.
    pub fn layers(&self) -> BTreeMap<String, (LayerMeta, usize)> {
        let mut out = BTreeMap::new();
        for e in std::fs::read_dir(self.root.join("layers")).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().replace('-', ":");
            if digest::valid(&name) {
                let meta =
                    self.layer_meta(&name).unwrap_or_else(|| LayerMeta { digest: name.clone(), ..Default::default() });
                out.insert(name, (meta, 0));
            }
        }
        for img in self.images() {
            for l in img.layers {
                if let Some(e) = out.get_mut(&l.digest) {
                    e.1 += 1;
                }
            }
        }
        out
    }

    /// Removes layers that no image record lists and `in_use` does not name.
    pub fn prune(&self, in_use: &HashSet<String>) -> Result<PruneReport, ImageError> {
        let mut report = PruneReport::default();
        for (digest, (meta, refs)) in self.layers() {
            if refs > 0 || in_use.contains(&digest) {
                continue;
            }
            // Rename first so a half-removed layer is never taken for a whole one.
            let dir = self.layer_dir(&digest);
            let doomed = self.tmp().join(format!("prune-{}", digest::file_name(&digest)));
            std::fs::rename(&dir, &doomed).map_err(ImageError::io("prune layer", &dir))?;
            remove_any(&doomed)?;
            report.freed_bytes += meta.unpacked_bytes;
            report.removed_layers.push(digest);
        }
        Ok(report)
    }
}

pub(crate) fn remove_any(p: &Path) -> Result<(), ImageError> {
    let r = match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(_) => Ok(()),
    };
    r.map_err(ImageError::io("remove", p))
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str, digest: &str) -> ImageRecord {
        ImageRecord {
            name: name.into(),
            digest: digest.into(),
            layers: Vec::new(),
            config: ImageConfig::default(),
            created_ms: 0,
        }
    }

    /// The in-memory records follow every write: a replaced record is the new
    /// one, a removed one is gone, and a store opened afresh reads the same.
    #[test]
    fn remembered_records_follow_saves_and_removes() {
        let d = std::env::temp_dir().join(format!("ember-image-records-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let disk = Disk::open(&d).unwrap();
        let name = "docker.io/library/busybox:latest";
        assert_eq!(disk.load_image(name), None);
        disk.save_image(&record(name, "sha256:aa")).unwrap();
        assert_eq!(disk.load_image(name).unwrap().digest, "sha256:aa");
        disk.save_image(&record(name, "sha256:bb")).unwrap();
        assert_eq!(disk.load_image(name).unwrap().digest, "sha256:bb");
        assert_eq!(Disk::open(&d).unwrap().load_image(name).unwrap().digest, "sha256:bb");
        disk.remove_image(name).unwrap();
        assert_eq!(disk.load_image(name), None);
        assert_eq!(Disk::open(&d).unwrap().load_image(name), None);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
