//! Content-addressed, incremental snapshots of a directory tree into an object store.
//!
//! A snapshot is a set of chunks plus one manifest. Files are cut by
//! content-defined chunking (FastCDC, ~1 MiB average), each chunk is named by
//! the sha256 of its bytes and stored zstd-compressed as `chunks/<sha256>`,
//! uploaded only if absent, so a second snapshot after a small change uploads
//! only the changed chunks. The manifest (`manifests/<id>.json`: versioned,
//! checksummed, see [`manifest`]) is written last, after the caller's commit
//! guard, so a store never holds a manifest pointing at missing chunks.
//! Restores verify every chunk's hash and appear atomically (temp dir, then
//! rename). `gc` sweeps chunks no manifest references.
//!
//! Everything is synchronous: the engine calls it from blocking threads.
//!
//! Layout: `store/` (the [`ObjectStore`] trait, [`LocalStore`], [`S3Store`]),
//! `manifest.rs` (format), `walk.rs` (tree → entries), `snapshot.rs`,
//! `upload.rs` (parallel chunk upload), `restore.rs`, `layer.rs` (overlay upper dirs: whiteouts, opaque dirs), `catalog.rs` (list, inspect, delete, gc), `coord.rs` (gc vs
//! snapshot markers), `bench.rs` (`ember bench snapshot`).
//!
//! ```no_run
//! use ember_snapshot::{restore, snapshot, LocalStore, RestoreOptions, SnapshotOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = LocalStore::open("/var/lib/ember/objects")?;
//! let fenced = || true; // the caller's lease check
//! let mut opts = SnapshotOptions::new("ws1-0001").label("workspace", "ws1");
//! opts.commit_guard = &fenced;
//! let info = snapshot("/var/lib/ember/workspaces/ws1".as_ref(), &store, opts)?;
//! println!("uploaded {} bytes, dedup {:.1}x", info.summary.stats.bytes_uploaded, info.summary.stats.dedup_ratio());
//! restore(&store, "ws1-0001", "/var/lib/ember/workspaces/ws1-copy".as_ref(), RestoreOptions::default())?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod bench;
mod catalog;
mod coord;
mod error;
mod layer;
pub mod manifest;
mod restore;
mod snapshot;
mod store;
mod upload;
mod walk;

pub use catalog::{delete, gc, inspect, list, GcOptions, GcReport, SnapshotSummary};
pub use error::{SnapshotError, StoreError};
pub use layer::{layer_marks, restore_layer, scan_marks, snapshot_layer, LayerMarks, LAYER_LABEL};
pub use manifest::{Chunking, Stats};
pub use restore::{restore, RestoreInfo, RestoreOptions};
pub use snapshot::{snapshot, validate_id, Progress, SnapshotInfo, SnapshotOptions};
pub use store::{LocalStore, ObjectMeta, ObjectStore, S3Config, S3Store};
