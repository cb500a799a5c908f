//! Spare volumes, made ahead: an image, its fresh ext4, the loop mount at
//! `fs/` and the bind at `mnt/`, in a dir `.spare-<size>-<n>` of the store's
//! root. Creating a workspace of that size renames a spare into place instead
//! of running `mkfs.ext4` and two `mount`s, which under load took 1–5 s of a
//! rebind's restore (docs/chaos.md). A rename keeps the mounts inside the dir:
//! the kernel shows them under the new path.
//!
//! A spare is taken by renaming it to the create's temp dir, which is atomic:
//! two creates never get the same one. Spares are made only by the refill
//! (one caller at a time, the engine's loop), in a `.sparebuild-<n>` dir
//! renamed to its ready name once whole, so a crash leaves either a whole
//! spare or a build, and [`WorkspaceStore::clear_spares`] removes both at the
//! next start. Names starting with `.` are never workspaces (`list`).
use crate::volume::{discard_dir, make_image, migrate, mount_image, WorkspaceStore};
use crate::{io, WorkspaceError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const READY: &str = ".spare-";
const BUILDING: &str = ".sparebuild-";
/// The sizes asked for within this long are the ones kept spare.
const REMEMBER: Duration = Duration::from_secs(3600);
/// At most this many sizes are kept spare (the most recently asked).
const SIZES: usize = 3;

/// Which sizes creates have asked for lately.
#[derive(Default)]
pub(crate) struct Spares {
    asked: parking_lot::Mutex<Vec<(u64, Instant)>>,
    seq: AtomicU64,
    taken: AtomicU64,
}

impl Spares {
    fn asked(&self, size: u64) {
        let mut a = self.asked.lock();
        a.retain(|(s, _)| *s != size);
        a.push((size, Instant::now()));
        if a.len() > SIZES {
            a.remove(0);
        }
    }

    /// The sizes to keep spares of: those asked for lately, else `default`.
    fn sizes(&self, default: u64) -> Vec<u64> {
        let mut a = self.asked.lock();
        a.retain(|(_, t)| t.elapsed() < REMEMBER);
        if a.is_empty() {
            vec![default]
        } else {
            a.iter().map(|(s, _)| *s).collect()
        }
    }
}

/// The size a ready spare's dir name holds, if it is one.
fn ready_size(name: &str) -> Option<u64> {
    name.strip_prefix(READY)?.split_once('-')?.0.parse().ok()
}

impl WorkspaceStore {
    /// The ready spares' dirs, by size.
    fn ready(&self) -> BTreeMap<u64, Vec<PathBuf>> {
        let mut out: BTreeMap<u64, Vec<PathBuf>> = BTreeMap::new();
        let Ok(rd) = std::fs::read_dir(self.root()) else { return out };
        for e in rd.flatten() {
            if let Some(size) = e.file_name().to_str().and_then(ready_size) {
                out.entry(size).or_default().push(e.path());
            }
        }
        out
    }

    /// How many spares are ready, by size.
    pub fn spares_ready(&self) -> BTreeMap<u64, usize> {
        self.ready().into_iter().map(|(s, v)| (s, v.len())).collect()
    }

    /// Moves a ready spare of `size` bytes to `to`, a fresh path in the root;
    /// false when there is none. Remembers the size for the refill either way.
    pub(crate) fn take_spare(&self, size: u64, to: &Path) -> bool {
        self.spares.asked(size);
        let Some(dirs) = self.ready().remove(&size) else { return false };
        // A rename that fails lost the race for that spare to another create.
        let took = dirs.iter().any(|d| std::fs::rename(d, to).is_ok());
        if took {
            self.spares.taken.fetch_add(1, Ordering::Relaxed);
        }
        took
    }

    /// How many creates took a spare since the store was opened.
    pub fn spares_taken(&self) -> u64 {
        self.spares.taken.load(Ordering::Relaxed)
    }

    /// Makes spares until `want` are ready of each size asked for within the
    /// last hour (of `default` if none was), and removes the others. Blocking;
    /// returns how many it made. One caller at a time (the engine's refill
    /// loop); a create may take a spare meanwhile, its rename then fails here
    /// and there is one fewer to remove.
    pub fn refill_spares(&self, want: usize, default: u64) -> Result<usize, WorkspaceError> {
        let sizes = self.spares.sizes(default);
        // Spares of sizes no longer asked for, and beyond `want`, go.
        for (size, dirs) in self.ready() {
            let keep = if sizes.contains(&size) { want } else { 0 };
            for d in dirs.iter().skip(keep) {
                // Renamed away first, as a create takes one: a create racing
                // for this spare either has it whole or does not get it.
                let gone = self.root().join(format!("{BUILDING}{}", self.next_seq()));
                if std::fs::rename(d, &gone).is_ok() {
                    discard_dir(&gone)?;
                }
            }
        }
        let mut made = 0;
        for size in sizes {
            let have = self.ready().get(&size).map_or(0, Vec::len);
            for _ in have..want {
                self.build_spare(size)?;
                made += 1;
            }
        }
        Ok(made)
    }

    /// A name part no other spare or build of this store has.
    fn next_seq(&self) -> String {
        format!("{}-{}", std::process::id(), self.spares.seq.fetch_add(1, Ordering::Relaxed))
    }

    fn build_spare(&self, size: u64) -> Result<(), WorkspaceError> {
        // A spare is made ahead, never at the cost of the reserve.
        let _room = self.reserve_room(size, 1, 0)?;
        let n = self.next_seq();
        let tmp = self.root().join(format!("{BUILDING}{n}"));
        let built = make_image(&tmp, size, self.owner, self.quiet()).and_then(|()| {
            let (img, fs, mnt) = (tmp.join("disk.img"), tmp.join("fs"), tmp.join("mnt"));
            mount_image(&img, &fs)?;
            let data = migrate(&fs, self.owner)?;
            ember_sys::loopdev::bind(&data, &mnt)?;
            let ready = self.root().join(format!("{READY}{size}-{n}"));
            std::fs::rename(&tmp, &ready).map_err(io("rename", &ready))
        });
        if built.is_err() {
            let _ = discard_dir(&tmp);
        }
        built
    }

    /// Unmounts and removes every spare and unfinished build: at start (what
    /// a crash left) and when spares are turned off. Returns how many.
    pub fn clear_spares(&self) -> Result<usize, WorkspaceError> {
        let Ok(rd) = std::fs::read_dir(self.root()) else { return Ok(0) };
        let mut n = 0;
        for e in rd.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(READY) || name.starts_with(BUILDING) {
                discard_dir(&e.path())?;
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ready_names_have_a_size() {
        assert_eq!(ready_size(".spare-67108864-12-3"), Some(64 << 20));
        assert_eq!(ready_size(".sparebuild-12-3"), None);
        assert_eq!(ready_size(".spare-x-1"), None);
        assert_eq!(ready_size("spare-1-1"), None);
    }

    #[test]
    fn the_sizes_kept_are_the_latest_asked_or_the_default() {
        let s = Spares::default();
        assert_eq!(s.sizes(7), vec![7]);
        for size in [1, 2, 1, 3, 4] {
            s.asked(size);
        }
        assert_eq!(s.sizes(7), vec![1, 3, 4]);
    }
}
