//! The only crate in ember with `unsafe` code and raw syscalls. Every other crate
//! is `#![forbid(unsafe_code)]` and calls the safe functions here.
//!
//! Every `unsafe` block carries a `SAFETY:` comment naming the invariant it relies on.
//!
//! Layout:
//! - [`beneath`]: file work inside directories a sandbox or a snapshot store
//!   can write, from a pinned dir fd, never following a symlink (openat2).
//! - [`spawn`]: clone into fresh namespaces and the parent/child handshake;
//!   `child.rs` holds the code that runs between clone and exec (no allocation);
//!   `vmclone.rs` the `CLONE_VM` clone on a stack of its own it uses.
//! - [`seccomp`]: the default syscall filter, compiled with seccompiler.
//! - [`pidfd`]: pidfds, signals and reaping without pid-reuse races.
//! - [`fd`]: eventfd and small fd helpers.
//! - [`fs`]: overlay whiteouts and extended attributes; the host-side tmpfs of a
//!   sandbox's writable layer.
//! - [`netns`]: entering a network namespace from a thread of its own.
//! - [`nflog`]: the netfilter log socket (nfnetlink_log) and its message parser.
//! - [`inject`]: mounting a host directory into a running sandbox (setns).
//! - [`slot`]: workspaces for gVisor: mounts into a shared slot dir (from its
//!   fd, never following a symlink), and the in-sandbox bind.
//! - [`process`]: process control for the in-sandbox agent.
//! - [`adopt`]: the daemon as child subreaper, and the thread that reaps the
//!   orphans it adopts (an OCI runtime's container processes) by pidfd.

pub mod adopt;
pub mod beneath;
mod child;
pub mod fd;
pub mod fs;
pub mod idmap;
pub mod inject;
pub mod loopdev;
pub mod mountns;
pub mod netns;
pub mod nflog;
pub mod nice;
pub mod pidfd;
pub mod process;
pub mod pty;
pub mod seccomp;
pub mod slot;
pub mod spawn;
mod vmclone;
pub mod vspawn;

use std::io;

/// A failed system call, with the operation and the path or id it acted on.
#[derive(Debug, thiserror::Error)]
#[error("{op} {target}")]
pub struct SysError {
    pub op: &'static str,
    pub target: String,
    #[source]
    pub source: io::Error,
}

impl SysError {
    pub fn new(op: &'static str, target: impl Into<String>, source: io::Error) -> Self {
        SysError { op, target: target.into(), source }
    }

    pub(crate) fn last(op: &'static str, target: impl Into<String>) -> Self {
        SysError::new(op, target, io::Error::last_os_error())
    }
}
