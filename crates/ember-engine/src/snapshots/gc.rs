//! Reclaiming snapshot storage: deleting a snapshot (workspace or sandbox)
//! removes only its manifests; the chunks go when a mark-and-sweep finds no
//! manifest naming them. The sweep runs on a schedule, soon after a delete,
//! and on request (`POST /v1/snapshot-store/gc`, `ember snapshot gc`).
//!
//! Safety against snapshots in flight, in two layers:
//! - in this daemon, every snapshot write holds `snapshot_gate` shared and a
//!   sweep holds it exclusively, so a sweep waits for the writes under way
//!   and new writes wait for the sweep (rather than one of them failing);
//! - across daemons sharing a store, `ember_snapshot`'s marker objects
//!   (`coord.rs`) make the sweep refuse while another writer's marker is
//!   fresh, and that writer refuse while the sweep's lock is.
use super::Snapshots;
use crate::EngineError;
use std::sync::{Arc, Weak};
use std::time::Duration;

impl Snapshots {
    /// One mark-and-sweep of the snapshot store. `min_age`: unreferenced
    /// chunks younger than this are kept (default: `GcOptions::default`).
    pub async fn gc_snapshots(
        self: &Arc<Self>,
        min_age: Option<Duration>,
    ) -> Result<ember_snapshot::GcReport, EngineError> {
        let mut opts = ember_snapshot::GcOptions::default();
        if let Some(m) = min_age {
            opts.min_age = m;
        }
        let _exclusive = self.snapshot_gate.write().await;
        let me = self.clone();
        let report = tokio::task::spawn_blocking(move || ember_snapshot::gc(me.snapshot_store.as_ref(), opts))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))??;
        Ok(report)
    }

    /// Held (shared) by every write to the snapshot store that a sweep must
    /// not overlap.
    pub(crate) async fn snapshot_write_gate(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.snapshot_gate.read().await
    }

    /// A snapshot was deleted: have the scheduled sweep run soon.
    pub(crate) fn snapshot_deleted(&self) {
        self.snapshot_gc_kick.notify_one();
    }
}

/// Sweeps every `interval` (the first time after a random part of it, so
/// that nodes sharing a store and started together do not sweep together),
/// and with `after_delete` after a delete (at most once a minute, so a burst
/// of deletes costs one sweep). A sweep that finds another writer's snapshot
/// in progress is simply tried again at the next turn.
pub(crate) async fn gc_loop(engine: Weak<Snapshots>, interval: Duration, after_delete: bool) {
    let now = tokio::time::Instant::now();
    let mut last = now.checked_sub(interval.mul_f64(random_share())).unwrap_or(now);
    loop {
        let Some(kick) = engine.upgrade().map(|e| e.snapshot_gc_kick.clone()) else { return };
        tokio::select! {
            _ = tokio::time::sleep_until(last + interval) => {}
            _ = kick.notified(), if after_delete => {
                tokio::time::sleep_until(last + Duration::from_secs(60)).await;
            }
        }
        let Some(e) = engine.upgrade() else { return };
        last = tokio::time::Instant::now();
        match e.gc_snapshots(None).await {
            Ok(r) => tracing::info!(
                manifests = r.manifests,
                chunks_deleted = r.chunks_deleted,
                bytes_deleted = r.bytes_deleted,
                spared_young = r.chunks_spared_young,
                missing = r.missing_chunks.len(),
                "snapshot gc"
            ),
            Err(err) => tracing::warn!(error = %err, "snapshot gc skipped"),
        }
    }
}

/// A number in [0, 1), different in each process.
fn random_share() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new().build_hasher().finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}
