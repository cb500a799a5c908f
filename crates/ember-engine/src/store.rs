//! Persisted records (sandboxes, pools): one file per record under a directory
//! of `<data>/state`.
//!
//! Format: a header line `EMBER-STATE v1 <fnv64 of the body>` and the JSON body.
//! Written to a temp file and exchanged with the record (the old version
//! becomes the next save's temp file), so a crash leaves either the old or the
//! new record, never a torn one; a record whose checksum does not match is
//! reported, not trusted. Every save is durable before it returns (the file
//! fsynced, exchanged, then its directory fsynced: [`write_durable`]), so what
//! the API acknowledged survives a power loss too, not only a daemon crash:
//! a pool spec, a sandbox's metadata, a template, a snapshot record. The
//! exceptions: [`Store::save_volatile`], for records whose loss a power loss
//! makes moot (Pending, Stopping, an idle pool member's), and
//! [`Store::save_deferred`], for a warm claim's record, which answers once
//! the record is in place (a daemon crash keeps it) and is fsynced right
//! after by a thread of its own (`flush.rs` says what that trades).
//! A removed record's files are kept as spares for the next records
//! ([`spares`]): records come and go with sandboxes.
mod spares;

use crate::error::EngineError;
use crate::flush::Flusher;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const VERSION: &str = "v1";

pub struct Store<T> {
    dir: PathBuf,
    spares: spares::Spares,
    /// Started by the first [`Store::save_deferred`].
    flusher: std::sync::OnceLock<Flusher>,
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

/// Opens `path` for writing, created 0600: records hold a sandbox's env.
/// Not truncated: [`write_durable`] rewrites it in place.
fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    let f = std::fs::OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(path)?;
    // A temp file a crash left behind keeps its old mode through `open`.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

impl<T: Serialize + DeserializeOwned> Store<T> {
    pub fn open(dir: PathBuf) -> Result<Store<T>, EngineError> {
        Self::open_with_spares(dir, spares::MAX_SPARES)
    }

    fn open_with_spares(dir: PathBuf, max_spares: usize) -> Result<Store<T>, EngineError> {
        private_dir(&dir)?;
        let spares = spares::Spares::new(dir.clone(), max_spares);
        Ok(Store { dir, spares, flusher: Default::default(), _kind: std::marker::PhantomData })
    }

    /// Writes the record through [`write_durable`], its temp file a spare
    /// when it has none yet (a new record's first two saves).
    fn write(&self, id: &str, r: &T, sync: bool) -> Result<(), EngineError> {
        let path = self.path(id);
        self.spares.provide(&path.with_extension("tmp"));
        write_durable(&path, &encode(r)?, sync)
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    pub fn save(&self, id: &str, r: &T) -> Result<(), EngineError> {
        self.write(id, r, true)
    }

    /// [`save`](Self::save) without the fsyncs, for a record that only has to
    /// survive a daemon crash: a create's Pending record, a teardown's
    /// Stopping one. A power loss ends those sandboxes' processes too, and
    /// the restart reaps whatever they left with or without the record.
    pub fn save_volatile(&self, id: &str, r: &T) -> Result<(), EngineError> {
        self.write(id, r, false)
    }

    /// [`save_volatile`](Self::save_volatile) now and the fsyncs right after,
    /// off the caller's path (`flush.rs`): survives a daemon crash on
    /// return, a power loss a moment later.
    pub fn save_deferred(&self, id: &str, r: &T) -> Result<(), EngineError> {
        self.save_volatile(id, r)?;
        self.flusher.get_or_init(Flusher::start).flush(self.path(id));
        Ok(())
    }

    /// Removes the record and its previous version; each file is kept as
    /// a zeroed spare while there is room, else unlinked.
    pub fn remove(&self, id: &str) -> Result<(), EngineError> {
        let path = self.path(id);
        for p in [path.clone(), path.with_extension("tmp")] {
            match self.spares.keep(&p) {
                Ok(true) => {}
                Ok(false) => match std::fs::remove_file(&p) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(store_err(&p)(e)),
                    _ => {}
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(store_err(&p)(e)),
            }
        }
        Ok(())
    }

    /// One record: `None` if there is none, else it or why it could not be read.
    pub fn load(&self, id: &str) -> Option<Result<T, String>> {
        let p = self.path(id);
        p.exists().then(|| load(&p))
    }

    /// Every record on disk: `(file stem, record or why it could not be read)`.
    /// Read only: a temp file may be a write in flight (a list runs beside
    /// saves), so it is left alone.
    pub fn load_all(&self) -> Vec<(String, Result<T, String>)> {
        self.scan(false)
    }

    /// [`load_all`](Self::load_all) at a start, when no write can be in
    /// flight: a temp file is a write a crash cut short (the old record
    /// stands) and is removed.
    pub fn recover_all(&self) -> Vec<(String, Result<T, String>)> {
        self.scan(true)
    }

    fn scan(&self, drop_temps: bool) -> Vec<(String, Result<T, String>)> {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return vec![] };
        let mut out = Vec::new();
        for e in rd.flatten() {
            let p = e.path();
            let Some(stem) = p.file_stem().map(|s| s.to_string_lossy().into_owned()) else { continue };
            match p.extension().and_then(|x| x.to_str()) {
                Some("json") => out.push((stem, load(&p))),
                Some("tmp") if drop_temps => {
                    let _ = std::fs::remove_file(&p);
                }
                _ => {}
            }
        }
        out
    }
}

/// Replaces `path` with `data` so that, once this returns, a crash or a power
/// loss leaves the new file: the temp file (`<path>.tmp`, which
/// `recover_all` clears) written and fsynced, exchanged with `path`, then the
/// directory fsynced (the exchange is durable only once the directory is).
/// On error the old file stands and the temp file is removed.
/// (`sync: false`: the same without the two fsyncs.)
///
/// Exchanged, not renamed over: the old version becomes the next write's
/// temp file, rewritten in place. A rename over `path` freed the old inode
/// and made a new one at every save; on this host's ext4 (no journal,
/// `discard`) that was an inode search and a synchronous discard on a
/// claim's path, under the directory's lock every other save waits for
/// (docs/performance.md, "A record written in place"). Once both names
/// exist a save allocates and frees nothing.
pub(crate) fn write_durable(path: &Path, data: &[u8], sync: bool) -> Result<(), EngineError> {
    use std::os::unix::fs::FileExt;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let f = open_private(&tmp)?;
        f.write_all_at(data, 0)?;
        // Within its block, a shorter record frees nothing either.
        f.set_len(data.len() as u64)?;
        if sync {
            f.sync_all()?;
        }
        if !ember_sys::fs::exchange(&tmp, path)? {
            std::fs::rename(&tmp, path)?;
        }
        Ok(())
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(store_err(path)(e));
    }
    if !sync {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(store_err(dir))
}

/// Removes what [`write_durable`] made at `path`: the file and the previous
/// version beside it (a record's env outlives neither).
pub(crate) fn remove_durable(path: &Path) -> Result<(), EngineError> {
    for p in [path.to_path_buf(), path.with_extension("tmp")] {
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(store_err(&p)(e)),
            _ => {}
        }
    }
    Ok(())
}

fn encode<T: Serialize>(r: &T) -> Result<Vec<u8>, EngineError> {
    let body = serde_json::to_vec(r).map_err(|e| EngineError::Internal(e.to_string()))?;
    let mut data = format!("EMBER-STATE {VERSION} {:016x}\n", fnv64(&body)).into_bytes();
    data.extend_from_slice(&body);
    Ok(data)
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

#[cfg(test)]
mod tests {
    use super::Store;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("ember-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// A list beside a save must not pull the save's temp file away (it did:
    /// the save's rename then failed with ENOENT and the caller got a 500).
    #[test]
    fn a_list_leaves_a_write_in_flight_alone_and_a_start_drops_a_torn_one() {
        let d = dir("inflight");
        let store: Store<u32> = Store::open(d.clone()).expect("open");
        store.save("a", &1).expect("save");
        let in_flight = d.join("b.tmp");
        std::fs::write(&in_flight, b"2").expect("temp file");
        let listed: Vec<_> = store.load_all().into_iter().map(|(k, v)| (k, v.expect("readable"))).collect();
        assert_eq!(listed, vec![("a".to_string(), 1)]);
        assert!(in_flight.exists(), "a list removed a write in flight");
        assert_eq!(store.recover_all().len(), 1);
        assert!(!in_flight.exists(), "a start keeps a torn write");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A save frees no inode: the version it replaces stays linked (as the
    /// next save's temp file), so no save pays for a free (on a `discard`
    /// mount, a synchronous discard) or for a new inode once both exist.
    /// Shorter and longer versions read back whole; a removal takes both.
    #[test]
    fn a_save_keeps_the_old_version_linked_and_removal_takes_both() {
        use std::os::unix::fs::MetadataExt;
        let d = dir("inplace");
        let store: Store<String> = Store::open(d.clone()).expect("open");
        store.save("r", &"x".repeat(3000)).expect("save");
        let mut inodes = std::collections::BTreeSet::new();
        for (i, len) in [10usize, 2500, 1, 4000, 7].into_iter().enumerate() {
            let old = std::fs::File::open(d.join("r.json")).expect("the record");
            let value = format!("{i}{}", "y".repeat(len));
            match i % 3 {
                0 => store.save("r", &value),
                1 => store.save_volatile("r", &value),
                _ => store.save_deferred("r", &value),
            }
            .expect("save");
            let meta = old.metadata().expect("fstat");
            assert_eq!(meta.nlink(), 1, "save {i} unlinked the version it replaced");
            inodes.insert(meta.ino());
            assert_eq!(store.load("r").expect("a record").expect("readable"), value);
        }
        assert_eq!(inodes.len(), 2, "saves made new inodes: {inodes:?}");
        assert_eq!(store.load_all().len(), 1, "the old version is no record of its own");
        store.remove("r").expect("remove");
        assert!(!d.join("r.json").exists() && !d.join("r.tmp").exists(), "a version left behind");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A removed record's files become the next records' (no inode freed or
    /// made while spares last), hold nothing of it meanwhile, are no records
    /// of their own, and outlive a restart; past the cap a removal unlinks.
    #[test]
    fn a_removed_records_files_are_kept_zeroed_for_the_next_records() {
        use std::os::unix::fs::MetadataExt;
        let d = dir("spares");
        let store: Store<String> = Store::open_with_spares(d.clone(), 3).expect("open");
        let mut held = Vec::new();
        for id in ["a", "b"] {
            store.save(id, &format!("secret of {id}")).expect("save");
            store.save_volatile(id, &format!("secret of {id}, again")).expect("save");
            for ext in ["json", "tmp"] {
                held.push(std::fs::File::open(d.join(format!("{id}.{ext}"))).expect("a version"));
            }
        }
        let old: std::collections::BTreeSet<u64> = held.iter().map(|f| f.metadata().unwrap().ino()).collect();
        store.remove("a").expect("remove");
        store.remove("b").expect("remove");
        let linked: Vec<_> = held.iter().filter(|f| f.metadata().unwrap().nlink() == 1).collect();
        assert_eq!(linked.len(), 3, "three files kept (the cap), the fourth unlinked");
        for mut f in linked {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut f, &mut bytes).unwrap();
            assert!(!bytes.is_empty() && bytes.iter().all(|&b| b == 0), "a spare holds a record's bytes");
        }
        assert!(store.load_all().is_empty(), "a spare read as a record");
        assert!(store.load("a").is_none() && store.load("b").is_none());
        drop(store);

        let store: Store<String> = Store::open_with_spares(d.clone(), 3).expect("reopen");
        let mut new = std::collections::BTreeSet::new();
        for id in ["c", "d"] {
            store.save(id, &format!("{id}1")).expect("save");
            store.save_deferred(id, &format!("{id}2")).expect("save");
            for ext in ["json", "tmp"] {
                new.insert(std::fs::metadata(d.join(format!("{id}.{ext}"))).unwrap().ino());
            }
            assert_eq!(store.load(id).expect("a record").expect("readable"), format!("{id}2"));
        }
        assert_eq!(new.intersection(&old).count(), 3, "new records made new inodes past the spares: {new:?} {old:?}");
        store.remove("c").expect("remove");
        store.remove("d").expect("remove");
        let names: Vec<_> =
            std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names.len(), 3, "more than the cap kept: {names:?}");
        assert!(names.iter().all(|n| n.starts_with(".spare-")), "{names:?}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
