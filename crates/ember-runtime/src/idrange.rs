//! One host id range per sandbox (as Kubernetes user namespaces and `podman
//! --userns=auto` do): per-uid kernel counts (inotify instances, processes,
//! user namespaces) are then a sandbox's own, not shared with its neighbours.
//!
//! Range `i` is host ids `base + i * 65536 .. + 65536`. Range 0 is the storage
//! range: shared layers and workspaces are owned by it on disk, and each
//! sandbox sees them through idmapped mounts ([`ember_sys::idmap`]); no
//! sandbox runs in it, except one whose volumes cannot be idmapped
//! ([`IdRanges::use_storage`]). Sandboxes get ranges 1..=count, the lowest free first.
//! The record of which sandbox has which range is the kernel's: a live
//! sandbox's init has it in its `uid_map`, read back on adoption after a
//! daemon restart ([`IdRanges::adopt`]).
use crate::RuntimeError;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Ids in one range: what a sandbox's user namespace maps.
pub const RANGE: u32 = 65536;

/// The pure bookkeeping: which range index each sandbox holds.
#[derive(Debug, Default)]
struct Table {
    by_id: BTreeMap<String, u32>,
}

impl Table {
    fn allocate(&mut self, id: &str, count: u32) -> Option<u32> {
        if let Some(i) = self.by_id.get(id) {
            return Some(*i);
        }
        let mut taken: Vec<u32> = self.by_id.values().copied().collect();
        taken.sort_unstable();
        let mut next = 1;
        for t in taken {
            if t == next {
                next += 1;
            } else if t > next {
                break;
            }
        }
        (next <= count).then(|| {
            self.by_id.insert(id.to_string(), next);
            next
        })
    }
}

/// The ranges of one daemon, shared by its runtime classes.
#[derive(Debug)]
pub struct IdRanges {
    base: u32,
    count: u32,
    table: Mutex<Table>,
}

impl IdRanges {
    /// `count` sandbox ranges after the storage range at `base`. Refuses a
    /// span that does not fit below the largest uid.
    pub fn new(base: u32, count: u32) -> Result<IdRanges, RuntimeError> {
        let end = u64::from(base) + (u64::from(count) + 1) * u64::from(RANGE);
        if count == 0 || end > u64::from(u32::MAX) {
            return Err(RuntimeError::IdRanges {
                message: format!("{count} ranges of {RANGE} ids from {base} do not fit below 2^32-1"),
            });
        }
        Ok(IdRanges { base, count, table: Mutex::new(Table::default()) })
    }

    /// The storage range's first host id (what on-disk layers are owned by).
    pub fn storage_base(&self) -> u32 {
        self.base
    }

    /// The first host id of `id`'s range, allocating one if it has none.
    pub fn allocate(&self, id: &str) -> Result<u32, RuntimeError> {
        let i = self.lock().allocate(id, self.count).ok_or_else(|| RuntimeError::IdRanges {
            message: format!("all {} id ranges are in use (ember serve --id-ranges)", self.count),
        })?;
        Ok(self.host_base(i))
    }

    /// Puts `id` in the storage range (shared, never allocated): for a
    /// sandbox whose volumes cannot be idmapped. Frees any range it held.
    pub fn use_storage(&self, id: &str) -> u32 {
        self.lock().by_id.insert(id.to_string(), 0);
        self.base
    }

    /// Re-records the range a live sandbox's init maps to (`host_base`, read
    /// from its `uid_map`). A base outside this daemon's ranges is refused.
    pub fn adopt(&self, id: &str, host_base: u32) -> Result<(), RuntimeError> {
        let off = host_base.checked_sub(self.base).filter(|o| o % RANGE == 0).map(|o| o / RANGE);
        match off {
            Some(i) if i <= self.count => {
                self.lock().by_id.insert(id.to_string(), i);
                Ok(())
            }
            _ => Err(RuntimeError::IdRanges {
                message: format!("sandbox {id} maps to host id {host_base}, not one of this daemon's ranges"),
            }),
        }
    }

    /// The first host id of `id`'s range, if it holds one.
    pub fn of(&self, id: &str) -> Option<u32> {
        self.lock().by_id.get(id).map(|i| self.host_base(*i))
    }

    /// Frees `id`'s range for reuse (its sandbox is removed).
    pub fn free(&self, id: &str) {
        self.lock().by_id.remove(id);
    }

    /// The host id a snapshot's recorded host id `x` becomes in the range at
    /// `to`: an id of any of this daemon's ranges keeps its offset in the
    /// range; any other id is kept as it is.
    pub fn shift(&self, x: u32, to: u32) -> u32 {
        match x.checked_sub(self.base) {
            Some(off) if u64::from(off) < (u64::from(self.count) + 1) * u64::from(RANGE) => to + off % RANGE,
            _ => x,
        }
    }

    /// `base:count` (the idmap of `to`): storage ids onto the range at `to`.
    pub fn storage_map(&self, to: u32) -> String {
        format!("{} {to} {RANGE}\n", self.base)
    }

    /// [`Self::storage_map`] with id 0 kept as 0: the map of a layer the host
    /// mounts an overlay over (the mounter, host root, writes its work dirs
    /// through it).
    pub fn layer_map(&self, to: u32) -> String {
        match self.base {
            0 => self.storage_map(to),
            _ => format!("0 0 1\n{}", self.storage_map(to)),
        }
    }

    fn host_base(&self, i: u32) -> u32 {
        self.base + i * RANGE
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // The table is plain data, consistent after every statement: a
        // panic elsewhere while it was held leaves nothing half-done.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u32 = 1_000_000_000;

    #[test]
    fn ranges_are_distinct_reused_after_free_and_capped() {
        let r = IdRanges::new(B, 2).unwrap();
        let a = r.allocate("a").unwrap();
        assert_eq!(a, B + RANGE, "range 0 is storage, never a sandbox's");
        assert_eq!(r.allocate("a").unwrap(), a, "idempotent per sandbox");
        let b = r.allocate("b").unwrap();
        assert_eq!(b, B + 2 * RANGE);
        assert!(matches!(r.allocate("c"), Err(RuntimeError::IdRanges { .. })));
        r.free("a");
        assert_eq!(r.allocate("c").unwrap(), a, "the lowest free range is reused");
        assert_eq!(r.of("b"), Some(b));
        assert_eq!(r.of("a"), None);
        r.free("c");
        assert_eq!(r.use_storage("c"), B);
        assert_eq!(r.use_storage("d"), B, "shared by every sandbox put there");
        assert_eq!(r.allocate("e").unwrap(), a, "and never handed out");
    }

    #[test]
    fn adoption_takes_the_range_out_of_the_free_set() {
        let r = IdRanges::new(B, 3).unwrap();
        r.adopt("old", B + RANGE).unwrap();
        assert_eq!(r.allocate("new").unwrap(), B + 2 * RANGE);
        r.adopt("shared", B).unwrap();
        assert_eq!(r.of("shared"), Some(B), "the storage range, shared");
        assert!(r.adopt("x", B + 4 * RANGE).is_err(), "past the cap");
        assert!(r.adopt("x", B + RANGE + 1).is_err(), "not a range start");
    }

    #[test]
    fn shift_keeps_the_offset_in_the_range() {
        let r = IdRanges::new(B, 3).unwrap();
        let to = B + 3 * RANGE;
        assert_eq!(r.shift(B + RANGE + 1000, to), to + 1000);
        assert_eq!(r.shift(B + 1000, to), to + 1000, "storage ids too");
        assert_eq!(r.shift(0, to), 0, "ids outside every range are kept");
        assert_eq!(r.shift(B + 4 * RANGE, to), B + 4 * RANGE);
    }

    #[test]
    fn a_span_past_the_largest_uid_is_refused() {
        assert!(IdRanges::new(u32::MAX - RANGE, 1).is_err());
        assert!(IdRanges::new(B, 0).is_err());
    }
}
