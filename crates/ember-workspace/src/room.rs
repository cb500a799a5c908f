//! Room on the store's filesystem. A new volume costs its filesystem's
//! metadata (what `mkfs.ext4` writes into the sparse image) plus whatever is
//! copied into it; the daemon keeps a reserve free on top, for its own state
//! (records, journals, snapshot chunks). A full disk then refuses a new
//! workspace up front with `NoSpace`, naming what is free and what was
//! needed, instead of failing halfway through an image or, worse, failing
//! the next state write of an unrelated request.
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

impl WorkspaceStore {
    /// Refuses `count` new volumes of `size` bytes, each to receive `data`
    /// bytes, unless they fit with the reserve still free after them. A size
    /// out of bounds is refused first, as such: asking for too much is the
    /// caller's error whatever the disk holds.
    pub fn check_room(&self, size: u64, count: u64, data: u64) -> Result<(), WorkspaceError> {
        self.check_size(size)?;
        let (free, total) = free_bytes(self.root())?;
        let reserve = self.limits().reserve.unwrap_or_else(|| default_reserve(total));
        let each = image_cost(size).saturating_add(data);
        let need = each.saturating_mul(count).saturating_add(reserve);
        if free < need {
            return Err(WorkspaceError::NoSpace { path: self.root().to_path_buf(), free, need });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

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
