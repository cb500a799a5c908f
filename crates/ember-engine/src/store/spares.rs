//! Record files kept for reuse: a removed record's two files (the record and
//! its previous version) are renamed to `.spare-<n>` instead of unlinked, and
//! a new record's temp file is a spare renamed in.
//!
//! Why: a sandbox per task (or a pool's refills) makes and removes records
//! as fast as sandboxes come and go. On this host's ext4 (no journal,
//! `discard`) a new inode is searched for past every recently deleted one in
//! its group, reading inode-table blocks under the directory's lock, and a
//! freed one is discarded synchronously: the creates of a task bench spent
//! 17 % of the host's CPU in `open(O_CREAT)`, most of it in
//! `recently_deleted` (docs/performance.md, "Record files kept for reuse").
//! A rename allocates and frees nothing.
//!
//! A spare is no record: its name has no `.json`, so no scan reads it, and
//! a removal zeroes it (a record holds a sandbox's env). At most `cap` are
//! kept; past that a removal unlinks as before.
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Spares kept per store: a few MiB of disk at most (a record is a block).
pub(super) const MAX_SPARES: usize = 1024;

const PREFIX: &str = ".spare-";

pub(super) struct Spares {
    dir: PathBuf,
    cap: usize,
    /// `None` until first needed: the dir is read once then (a store opened
    /// per call, as the snapshot records' is, pays nothing it does not use).
    list: Mutex<Option<List>>,
}

struct List {
    free: Vec<PathBuf>,
    next: u64,
}

impl Spares {
    pub(super) fn new(dir: PathBuf, cap: usize) -> Spares {
        Spares { dir, cap, list: Mutex::new(None) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut List) -> R) -> R {
        let mut guard = self.list.lock().unwrap_or_else(|p| p.into_inner());
        f(guard.get_or_insert_with(|| scan(&self.dir)))
    }

    /// Makes `tmp` exist from a spare when it does not, so that the save
    /// about to write it allocates no inode. Best effort: without a spare
    /// (or on any error) the save creates the file as before.
    pub(super) fn provide(&self, tmp: &Path) {
        if std::fs::symlink_metadata(tmp).is_ok() {
            return;
        }
        let Some(spare) = self.with(|l| l.free.pop()) else { return };
        match ember_sys::fs::rename_noreplace(&spare, tmp) {
            Ok(true) => {}
            // A temp file appeared meanwhile: the spare stays one.
            Ok(false) => self.with(|l| l.free.push(spare)),
            // Gone or unusable: forgotten (a restart's scan finds it again).
            Err(e) => tracing::debug!(spare = %spare.display(), error = %e, "record spare not taken"),
        }
    }

    /// Keeps `path` as a spare, zeroed: `Ok(true)`. `Ok(false)` when the
    /// spares are full (the caller unlinks it); NotFound is the caller's.
    pub(super) fn keep(&self, path: &Path) -> std::io::Result<bool> {
        let Some(spare) = self.with(|l| {
            (l.free.len() < self.cap).then(|| {
                l.next += 1;
                self.dir.join(format!("{PREFIX}{}", l.next))
            })
        }) else {
            return Ok(false);
        };
        std::fs::rename(path, &spare)?;
        // Renamed first: a crash between the two leaves a spare with old
        // bytes (the dir is 0711, the file 0600), never a zeroed record.
        if let Err(e) = zero(&spare) {
            tracing::warn!(spare = %spare.display(), error = %e, "record spare not zeroed; removed");
            let _ = std::fs::remove_file(&spare);
            return Ok(true);
        }
        self.with(|l| l.free.push(spare));
        Ok(true)
    }
}

/// Overwrites the file's bytes in place (the same blocks: truncating would
/// free them, which is what spares avoid).
/// (The state dir is the daemon's own: no sandbox writes there.)
fn zero(path: &Path) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    let len = f.metadata()?.len() as usize;
    f.write_all_at(&vec![0u8; len], 0)
}

/// The spares a previous run left, and the next free number.
fn scan(dir: &Path) -> List {
    let mut list = List { free: Vec::new(), next: 0 };
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(n) = name.to_str().and_then(|s| s.strip_prefix(PREFIX)).and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        list.next = list.next.max(n);
        list.free.push(e.path());
    }
    list
}
