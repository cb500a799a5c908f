//! Golden pools' hold on their snapshots. Every refill of a golden pool
//! restores its snapshot, so deleting the snapshot under the pool would fail
//! each refill from then on: the delete is refused instead (409
//! `SNAPSHOT::IN_USE`, naming the pools) until the pools are removed. The
//! pins live in memory; the pools pin their snapshots again when the daemon
//! starts (`Pools::load`).
use super::sandbox::SandboxSnapshotState;
use super::Snapshots;
use crate::EngineError;
use std::collections::{BTreeSet, HashMap};
use std::sync::MutexGuard;

/// Snapshot id → the golden pools that start from it.
pub(crate) type Pins = std::sync::Mutex<HashMap<String, BTreeSet<String>>>;

impl Snapshots {
    fn pins(&self) -> MutexGuard<'_, HashMap<String, BTreeSet<String>>> {
        self.pins.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pins snapshot `sid` for the new golden pool `pool`; only a Ready
    /// snapshot can be pinned (checked under the lock the delete takes).
    pub(crate) fn pin(&self, sid: &str, pool: &str) -> Result<(), EngineError> {
        let mut pins = self.pins();
        let snap = self.sandbox_snapshot(sid)?;
        if snap.state != SandboxSnapshotState::Ready {
            return Err(EngineError::SnapshotNotReady { id: snap.id, state: snap.state.as_str() });
        }
        pins.entry(snap.id).or_default().insert(pool.to_string());
        Ok(())
    }

    /// A pool loaded after a restart pins its snapshot as it is (one gone
    /// since, from before pins existed, fails the refills, counted).
    pub(crate) fn repin(&self, sid: &str, pool: &str) {
        self.pins().entry(sid.to_string()).or_default().insert(pool.to_string());
    }

    pub(crate) fn unpin(&self, sid: &str, pool: &str) {
        let mut pins = self.pins();
        if let Some(pools) = pins.get_mut(sid) {
            pools.remove(pool);
            if pools.is_empty() {
                pins.remove(sid);
            }
        }
    }

    /// Runs `mark` (the delete's Deleting record) under the pins' lock unless
    /// a pool pins `sid`, so no pool can pin it between the check and the mark.
    pub(super) fn unless_pinned<T>(
        &self,
        sid: &str,
        mark: impl FnOnce() -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let pins = self.pins();
        if let Some(pools) = pins.get(sid).filter(|p| !p.is_empty()) {
            return Err(EngineError::SnapshotInUse { id: sid.to_string(), pools: pools.iter().cloned().collect() });
        }
        mark()
    }
}
