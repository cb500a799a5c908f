//! Room on the store's filesystem. A new volume costs its filesystem's
//! metadata (what `mkfs.ext4` writes into the sparse image) plus whatever is
//! copied into it; the daemon keeps a reserve free on top, for its own state
//! (records, journals, snapshot chunks). A full disk then refuses a new
//! workspace up front with `NoSpace`, naming what is free and what was
//! needed, instead of failing halfway through an image or, worse, failing
//! the next state write of an unrelated request.
//!
//! Writes in flight hold what they were admitted for ([`RoomHold`]) until
//! they end: two forks that each fit the disk alone, admitted together,
//! would fill it between them, the second failing halfway (or an unrelated
//! write failing) instead of being refused up front. A hold also counts
//! the bytes its write has already put on disk, which `statfs` counts as
//! used too: while writes run, admission is stricter than it needs to be,
//! never looser.
use crate::volume::{WorkspaceStore, MAX_SIZE};
use crate::{io, WorkspaceError};
use std::path::Path;

/// What the store accepts and what it leaves free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest workspace a create, restore or fork may ask for.
    pub max_size: u64,
    /// Bytes of the store's filesystem that new volumes never take; `None`:
    /// [`default_reserve`] of the filesystem's size.
    pub reserve: Option<u64>,
}

/// The most the default reserve keeps: enough for the daemon's state and a
/// few snapshots' staging on a disk that new workspaces have filled.
pub const DEFAULT_RESERVE: u64 = 1 << 30;

/// The reserve when none is configured: 5 % of a filesystem of `total`
/// bytes, at most [`DEFAULT_RESERVE`]. A flat gigabyte would refuse every
/// workspace on a small disk (the cgroup v2 guest's 1 GiB `/tmp`), where
/// the daemon's state needs a few megabytes.
pub fn default_reserve(total: u64) -> u64 {
    (total / 20).min(DEFAULT_RESERVE)
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_size: MAX_SIZE, reserve: None }
    }
}

/// What `mkfs.ext4` writes into a sparse image of `size` bytes, rounded up:
/// ~1 MiB at 1 GiB, 29 MiB at 2 TiB, 113 MiB at 8 TiB (measured with the
/// options of `make_image`), mostly group descriptors and bitmaps.
pub fn image_cost(size: u64) -> u64 {
    (4 << 20) + size / 65_536
}

/// Bytes an unprivileged writer may still take on the filesystem of `path`
/// (`f_bavail`: the root-reserved blocks are not counted on), and the
/// filesystem's size.
pub fn free_bytes(path: &Path) -> Result<(u64, u64), WorkspaceError> {
    let st = rustix::fs::statvfs(path).map_err(|e| io("statvfs", path)(e.into()))?;
    Ok((st.f_bavail.saturating_mul(st.f_frsize), st.f_blocks.saturating_mul(st.f_frsize)))
}

/// Bytes admitted to writes still in flight, per store.
#[derive(Default)]
pub(crate) struct Ledger(parking_lot::Mutex<u64>);

/// Room a write was admitted for, held until it is dropped (the write done
/// or undone): other admissions count it as taken.
#[must_use = "the room is released when the hold is dropped"]
pub struct RoomHold<'a> {
    ledger: &'a Ledger,
    bytes: u64,
}

impl Drop for RoomHold<'_> {
    fn drop(&mut self) {
        let mut held = self.ledger.0.lock();
        *held = held.saturating_sub(self.bytes);
    }
}

impl WorkspaceStore {
    /// Admits `count` new volumes of `size` bytes, each to receive `data`
    /// bytes, if they fit with the reserve still free after them and after
    /// what writes in flight were admitted for; the hold keeps their room
    /// until it is dropped. A size out of bounds is refused first, as such:
    /// asking for too much is the caller's error whatever the disk holds.
    pub fn reserve_room(&self, size: u64, count: u64, data: u64) -> Result<RoomHold<'_>, WorkspaceError> {
        self.check_size(size)?;
        let bytes = image_cost(size).saturating_add(data).saturating_mul(count);
        // Under the lock: two admissions must not both read the same free
        // space (statfs is a few microseconds).
        let mut held = self.room.0.lock();
        let (free, total) = free_bytes(self.root())?;
        let reserve = self.limits().reserve.unwrap_or_else(|| default_reserve(total));
        let need = bytes.saturating_add(reserve);
        let free = free.saturating_sub(*held);
        if free < need {
            return Err(WorkspaceError::NoSpace { path: self.root().to_path_buf(), free, need });
        }
        *held = held.saturating_add(bytes);
        Ok(RoomHold { ledger: &self.room, bytes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Two writes that each fit alone are not both admitted: the second is
    /// refused while the first holds its room, and admitted once it ends.
    #[test]
    fn room_held_by_a_write_in_flight_is_not_given_twice() {
        /// Unmounted and removed however the test ends.
        struct Tmpfs(std::path::PathBuf);
        impl Drop for Tmpfs {
            fn drop(&mut self) {
                let _ = ember_sys::fs::unmount_detach(&self.0);
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let root = std::env::temp_dir().join(format!("ember-room-hold-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("mkdir");
        ember_sys::fs::mount_tmpfs(&root, "size=67108864,mode=0700").expect("tmpfs (the tests run as root)");
        let _mounted = Tmpfs(root.clone());
        let store = WorkspaceStore::open(root.join("ws"), (0, 0))
            .expect("store")
            .with_limits(Limits { max_size: crate::MAX_SIZE, reserve: Some(8 << 20) });
        let (size, data) = (64u64 << 20, 30u64 << 20);
        let first = store.reserve_room(size, 1, data).expect("64 MiB free: the first fits");
        match store.reserve_room(size, 1, data) {
            Err(WorkspaceError::NoSpace { free, need, .. }) => {
                assert!(free < need, "free {free} need {need}");
                assert!(free <= (64 << 20) - (30 << 20), "the first write's room counted as free: {free}");
            }
            other => panic!("a second write admitted into the first one's room: {:?}", other.map(|h| h.bytes)),
        }
        drop(first);
        let again = store.reserve_room(size, 1, data).expect("the first write ended: room again");
        drop(again);
    }

    #[test]
    fn the_default_reserve_is_a_twentieth_up_to_a_gigabyte() {
        assert_eq!(default_reserve(1 << 30), (1 << 30) / 20);
        assert_eq!(default_reserve(20 << 30), 1 << 30);
        assert_eq!(default_reserve(252 << 30), DEFAULT_RESERVE);
    }

    /// The estimate against what `make_image` really writes into a sparse
    /// image (its allocated blocks), small to largest: never under, and not
    /// wildly over (a fork's admission would refuse what fits).
    #[test]
    fn the_cost_covers_what_mkfs_writes() {
        let root = std::env::temp_dir().join(format!("ember-room-{}", std::process::id()));
        for size in [16u64 << 20, 1 << 30, 64 << 30, 2 << 40, crate::MAX_SIZE] {
            let dir = root.join(size.to_string());
            crate::volume::make_image(&dir, size, (0, 0), None).expect("mkfs");
            let written = std::fs::metadata(dir.join("disk.img")).expect("stat").blocks() * 512;
            std::fs::remove_dir_all(&dir).expect("remove");
            let cost = image_cost(size);
            assert!(cost >= written, "{size}: estimate {cost} < {written} written");
            assert!(cost <= written * 5 + (4 << 20), "{size}: estimate {cost} is far above {written} written");
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
