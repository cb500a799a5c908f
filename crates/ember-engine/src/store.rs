//! Persisted records (sandboxes, pools): one file per record under a directory
//! of `<data>/state`.
//!
//! Format: a header line `EMBER-STATE v1 <fnv64 of the body>` and the JSON body.
//! Written to a temp file and renamed into place, so a crash leaves either the old
//! or the new record, never a torn one; a record whose checksum does not match is
//! reported, not trusted. No fsync: a record describes processes that do not
//! survive a host crash, while a daemon crash (the case this guards) keeps the
//! page cache.
use crate::error::EngineError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const VERSION: &str = "v1";

pub struct Store<T> {
    dir: PathBuf,
    _kind: std::marker::PhantomData<fn() -> T>,
}

fn fnv64(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100000001b3))
}

fn store_err(path: &Path) -> impl FnOnce(std::io::Error) -> EngineError {
    let path = path.to_path_buf();
    move |source| EngineError::Store { path, source }
}

/// Makes `dir` (and missing parents) `0711`: records hold sandboxes' env
/// (secrets, often), so other host users may pass through, never list.
pub(crate) fn private_dir(dir: &Path) -> Result<(), EngineError> {
    std::fs::DirBuilder::new().recursive(true).mode(0o711).create(dir).map_err(store_err(dir))?;
    // A dir an older version made 0755.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(store_err(dir))
}

/// Writes `data` to `path` as a `0600` file (callers write a temp file and
/// rename it into place): records hold sandboxes' env.
pub(crate) fn write_private(path: &Path, data: &[u8]) -> Result<(), EngineError> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(store_err(path))?;
    // A temp file a crash left behind keeps its old mode through `open`.
    f.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(store_err(path))?;
    f.write_all(data).map_err(store_err(path))
}

impl<T: Serialize + DeserializeOwned> Store<T> {
    pub fn open(dir: PathBuf) -> Result<Store<T>, EngineError> {
        private_dir(&dir)?;
        Ok(Store { dir, _kind: std::marker::PhantomData })
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    pub fn save(&self, id: &str, r: &T) -> Result<(), EngineError> {
        let body = serde_json::to_vec(r).map_err(|e| EngineError::Internal(e.to_string()))?;
        let mut data = format!("EMBER-STATE {VERSION} {:016x}\n", fnv64(&body)).into_bytes();
        data.extend_from_slice(&body);
        let path = self.path(id);
        let tmp = path.with_extension("tmp");
        write_private(&tmp, &data)?;
        std::fs::rename(&tmp, &path).map_err(store_err(&path))
    }

    pub fn remove(&self, id: &str) -> Result<(), EngineError> {
        match std::fs::remove_file(self.path(id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(store_err(&self.path(id))(e)),
            _ => Ok(()),
        }
    }

    /// One record: `None` if there is none, else it or why it could not be read.
    pub fn load(&self, id: &str) -> Option<Result<T, String>> {
        let p = self.path(id);
        p.exists().then(|| load(&p))
    }

    /// Every record on disk: `(file stem, record or why it could not be read)`.
    pub fn load_all(&self) -> Vec<(String, Result<T, String>)> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return vec![] };
        let mut out = Vec::new();
        for e in rd.flatten() {
            let p = e.path();
            let Some(stem) = p.file_stem().map(|s| s.to_string_lossy().into_owned()) else { continue };
            match p.extension().and_then(|x| x.to_str()) {
                Some("json") => out.push((stem, load(&p))),
                // A temp file is a write that never got renamed: the old record stands.
                Some("tmp") => {
                    let _ = std::fs::remove_file(&p);
                }
                _ => {}
            }
        }
        out
    }
}

fn load<T: DeserializeOwned>(p: &Path) -> Result<T, String> {
    let data = std::fs::read(p).map_err(|e| e.to_string())?;
    let nl = data.iter().position(|&b| b == b'\n').ok_or("no header")?;
    let header = String::from_utf8_lossy(&data[..nl]);
    let body = &data[nl + 1..];
    let mut parts = header.split_whitespace();
    if parts.next() != Some("EMBER-STATE") || parts.next() != Some(VERSION) {
        return Err(format!("unknown header {header:?}"));
    }
    if parts.next() != Some(format!("{:016x}", fnv64(body)).as_str()) {
        return Err("checksum mismatch".into());
    }
    serde_json::from_slice(body).map_err(|e| e.to_string())
}
