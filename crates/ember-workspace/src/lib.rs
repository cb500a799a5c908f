//! Workspaces: named, durable volumes that hold an agent's state apart from the
//! sandbox that runs it. Kill the sandbox and a fresh one mounts the same
//! workspace and carries on.
//!
//! Each workspace is an ext4 filesystem in a sparse image file under
//! `<data>/workspaces/<name>/disk.img`, loop-mounted on the host at
//! `<name>/mnt` while the daemon runs: the filesystem's size is the quota, and
//! the kernel enforces it. Its root belongs to the sandbox user's host uid, so
//! sandboxes (whose ids map to the shared range) can write it.
//!
//! One writer at a time: mounting read-write takes a lease with a monotonically
//! increasing epoch (a fencing token), persisted in `meta.json`. A holder whose
//! epoch is no longer current can no longer commit snapshots.
//!
//! Task attempts write through a layer of their own (`layer.rs`): an overlay
//! over the workspace, merged into it (`merge.rs`) only when the attempt
//! succeeds under a current epoch, dropped otherwise.
//!
//! Synchronous: mkfs takes tens of milliseconds, a mount (syscalls,
//! `ember_sys::loopdev`) around one; the engine calls this
//! from blocking threads and serialises operations on one workspace.
#![forbid(unsafe_code)]

pub mod bench;
mod layer;
mod lease;
mod merge;
mod room;
mod spares;
mod volume;

pub use layer::Idmap;
pub use lease::{Lease, LeaseError, LeaseState};
pub use room::{default_reserve, free_bytes, image_cost, Limits, RoomHold, DEFAULT_RESERVE};
pub use volume::{WorkspaceMeta, WorkspaceStore, MAX_SIZE, MIN_SIZE};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("invalid workspace name {0:?}: 1-63 characters of [a-z0-9-], not starting with '-'")]
    Name(String),
    #[error("workspace {0} not found")]
    NotFound(String),
    #[error("workspace {0} already exists")]
    Exists(String),
    #[error("workspace size {0} bytes is below the minimum of {MIN_SIZE} bytes")]
    TooSmall(u64),
    #[error("workspace size {size} bytes is above the maximum of {max} bytes")]
    TooLarge { size: u64, max: u64 },
    /// The store's filesystem has no room for the volumes asked for with the
    /// daemon's reserve left free (`room.rs`), or a write found it full.
    #[error("not enough disk on {path}: {free} bytes free, {need} needed (the daemon's reserve included)")]
    NoSpace { path: PathBuf, free: u64, need: u64 },
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed for {path}: {stderr}")]
    Command { command: &'static str, path: PathBuf, stderr: String },
    /// A mount, bind or unmount the daemon made itself (op and path inside).
    #[error(transparent)]
    Sys(#[from] ember_sys::SysError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("workspace {name} is in use by sandbox {holder}; remove that sandbox first")]
    InUse { name: String, holder: String },
}

pub(crate) fn io(op: &'static str, path: &std::path::Path) -> impl FnOnce(std::io::Error) -> WorkspaceError {
    let path = path.to_path_buf();
    move |source| WorkspaceError::Io { op, path, source }
}

/// Workspace names double as directory names: the same rule as sandbox ids.
pub fn check_name(name: &str) -> Result<(), WorkspaceError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('-')
        && name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
    if ok {
        Ok(())
    } else {
        Err(WorkspaceError::Name(name.to_string()))
    }
}
