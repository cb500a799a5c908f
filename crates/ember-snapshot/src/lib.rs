//! Content-addressed, incremental snapshots of a directory tree into an object store.
//!
//! A snapshot is a set of chunks plus one manifest. Files are cut by
//! content-defined chunking (FastCDC, ~1 MiB average), each chunk is named by
//! the BLAKE3 digest of its bytes (sha256 in manifests of builds before it:
//! [`ChunkHash`]) and stored as `chunks/<hex digest>` (zstd frames; raw
//! frames for segments that do not compress, see `pack.rs`), uploaded only if
//! absent, so a second snapshot after a small change uploads only the changed
//! chunks. A chunk under 256 KiB (a small file, a file's tail) goes instead
//! into a pack, `packs/<digest of the pack>`, with others (see `packfile.rs`):
//! a tree of small files makes a few objects, not one per file. The manifest
//! (`manifests/<id>.json`: versioned, checksummed, see [`manifest`]) is written
//! last, after every chunk is durable and the caller's commit guard agreed, so
//! a store never holds a manifest pointing at missing chunks. Restores verify
//! every chunk's hash and appear atomically (temp dir, then rename). `gc`
//! sweeps chunks and packs no manifest references.
//!
//! Speed: the calling thread reads and chunks, handing chunks over as ranges
//! of the read window (no copy; windows reused once their chunks are done);
//! a few workers hash, pack and stage chunks (restore: fetch, decompress, verify and write at offsets).
//! Each distinct chunk is looked up once (a packed one: its pack, once per
//! snapshot). A [`LocalStore`] stages objects as temp files, starts their
//! writeback at once and fsyncs each from a few background threads while the
//! workers go on; the commit waits for those fsyncs before renaming the
//! batch into place ([`ObjectStore::put_staged`],
//! [`ObjectStore::commit_staged`]). A fork restores once and copies that tree
//! ([`copy_restored`]).
//!
//! Everything is synchronous: the engine calls it from blocking threads.
//!
//! Layout: `store/` (the [`ObjectStore`] trait, [`LocalStore`], [`S3Store`],
//! [`Staged`]), `manifest.rs` (format), `walk.rs` (tree → entries),
//! `snapshot.rs` (and [`Progress`]), `window.rs` (read and cut), `cdc.rs`
//! (FastCDC's cut points), `upload.rs` (hash, pack, stage), `pack.rs` (the
//! stored form of a chunk), `packfile.rs` (packs of small chunks and where
//! they are), `restore.rs` and `fetch.rs` (its
//! worker pool), `layer.rs` (overlay upper dirs: whiteouts, opaque dirs),
//! `catalog.rs` (list, inspect, delete, gc), `coord.rs` (gc vs
//! snapshot markers), `bench.rs` (`ember bench snapshot`).
//!
//! ```no_run
//! use ember_snapshot::{restore, snapshot, LocalStore, ManifestKey, RestoreOptions, SnapshotOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let key = ManifestKey::load_or_create("/var/lib/ember/snapshot.key".as_ref())?;
//! let store = LocalStore::open("/var/lib/ember/objects", key)?;
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
mod cdc;
mod coord;
mod error;
mod fetch;
mod key;
mod layer;
pub mod manifest;
mod pack;
mod packfile;
mod restore;
mod snapshot;
mod sparse;
mod store;
mod upload;
mod walk;
mod window;

pub use catalog::{delete, gc, inspect, list, GcOptions, GcReport, SnapshotSummary};
pub use error::{SnapshotError, StoreError};
pub use key::ManifestKey;
pub use layer::{layer_marks, restore_layer, scan_marks, snapshot_layer, LayerMarks, LAYER_LABEL};
pub use manifest::{ChunkHash, ChunkId, Chunking, Stats};
pub use restore::{
    copy_loaded, copy_restored, load_snapshot, restore, restore_loaded, LoadedSnapshot, RestoreInfo, RestoreOptions,
};
pub use snapshot::{snapshot, validate_id, Phase, Progress, SnapshotInfo, SnapshotOptions};
#[cfg(feature = "testing")]
pub use store::conformance;
pub use store::{
    check_key, check_size, LocalStore, ObjectMeta, ObjectStore, S3Config, S3Store, Staged, MAX_OBJECT_BYTES,
};
