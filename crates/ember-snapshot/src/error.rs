//! Errors: [`StoreError`] for the object stores, [`SnapshotError`] for the
//! snapshot operations. Every variant names the key, path, id or chunk that
//! failed; `Display` never repeats the source, which is in the chain.
use std::path::PathBuf;

/// An object store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The key is not in the store.
    #[error("object {key} not found")]
    NotFound { key: String },
    /// The key is not a relative, `/`-separated path of plain names.
    #[error("invalid object key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    /// A file operation of [`LocalStore`](crate::LocalStore) failed.
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A request to the S3 endpoint failed.
    #[error("s3 {op} {key}")]
    S3 {
        op: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
    /// The S3 configuration was refused, or its runtime could not start.
    #[error("s3 store for bucket {bucket}: {reason}")]
    Config { bucket: String, reason: String },
    /// The [`S3Store`](crate::S3Store)'s runtime dropped the request (it is shutting down).
    #[error("s3 {op} {key}: the store's runtime stopped")]
    RuntimeStopped { op: &'static str, key: String },
    /// An object over [`MAX_OBJECT_BYTES`](crate::MAX_OBJECT_BYTES): refused
    /// before it is written, and before it is read into memory.
    #[error("object {key} is {size} bytes, over the store's cap of {limit}")]
    TooLarge { key: String, size: u64, limit: u64 },
    /// A request to a store implemented outside this crate (the cluster's
    /// JetStream object store) failed for good: `backend` names it.
    #[error("{backend} {op} {key}: {reason}")]
    Backend { backend: &'static str, op: &'static str, key: String, reason: String },
    /// The store did not answer within its retry budget (a cluster store
    /// whose servers or leader stayed unreachable).
    #[error("{backend} {op} {key}: unavailable: {reason}")]
    Unavailable { backend: &'static str, op: &'static str, key: String, reason: String },
}

impl StoreError {
    /// True when the error says the key does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::NotFound { .. })
    }
}

/// A snapshot, restore, list, inspect, delete or gc failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Ids are 1..=128 characters of `[A-Za-z0-9._-]`, not starting with `.`.
    #[error("invalid snapshot id {id:?}: {reason}")]
    InvalidId { id: String, reason: &'static str },
    /// Chunking parameters outside what the chunker supports.
    #[error("invalid snapshot options: {reason}")]
    InvalidOptions { reason: String },
    #[error("snapshot {id} already exists")]
    AlreadyExists { id: String },
    #[error("snapshot {id} not found")]
    NotFound { id: String },
    /// Reading the source tree or writing the restored tree failed.
    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("object store")]
    Store(#[from] StoreError),
    /// The caller's commit guard (its lease fencing) said no; no manifest was written.
    #[error("commit of snapshot {id} refused: the commit guard returned false (lease lost or fenced)")]
    CommitRefused { id: String },
    #[error("manifest {key} is corrupt: {reason}")]
    CorruptManifest { key: String, reason: String },
    /// The manifest's MAC is missing or does not verify with this node's key:
    /// someone other than a holder of the key wrote it. Nothing is restored from it.
    #[error("snapshot {id}: refusing its manifest: {reason}")]
    Tampered { id: String, reason: String },
    /// The manifest key file cannot be created, read or used.
    #[error("snapshot key {}: {reason}", path.display())]
    Key { path: PathBuf, reason: String },
    #[error("manifest {key} has format version {found}; this build reads version {supported}")]
    UnsupportedVersion { key: String, found: u32, supported: u32 },
    /// A chunk's bytes do not decompress, or do not hash to its name.
    #[error("chunk {chunk} is corrupt: {reason}")]
    CorruptChunk { chunk: String, reason: String },
    #[error("chunk {chunk} is missing from the store")]
    MissingChunk { chunk: String },
    /// A manifest entry would escape the restore directory or has no directory parent.
    #[error("snapshot {id}: refusing entry {path:?}: {reason}")]
    UnsafeEntry { id: String, path: String, reason: &'static str },
    /// The snapshot's file data (holes excluded) exceeds the target's quota;
    /// nothing was written.
    #[error("snapshot {id} holds {bytes} bytes of file data; the target's quota is {limit} bytes")]
    TooLarge { id: String, bytes: u64, limit: u64 },
    #[error("restore target {} already exists", path.display())]
    TargetExists { path: PathBuf },
    #[error("{} is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    /// The chunk workers (upload or restore) stopped without reporting an error (one panicked).
    #[error("chunk workers stopped")]
    UploadStopped,
    /// A gc holds the store's lock; the snapshot did not start.
    #[error("gc is running on this store (lock {key}); retry later")]
    GcRunning { key: String },
    /// Snapshots are being written; gc did not sweep.
    #[error("gc refused: snapshots in progress ({ids:?})")]
    SnapshotsInProgress { ids: Vec<String> },
}
