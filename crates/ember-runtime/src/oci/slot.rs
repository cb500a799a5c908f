//! Workspaces under gVisor (`runsc`), cold and warm alike: the Sentry keeps
//! its own mount table, which a host `setns` cannot reach, so a workspace is
//! mounted in two steps through a slot made at launch.
//!
//! At launch: a small tmpfs at `<sandbox dir>/ws`, owned by host root, made a
//! shared mount, bound into the bundle at [`SLOT_DIR`] as `rslave`, so the
//! gofer's copy receives every mount made later under the host dir. The gofer
//! runs in the sandbox's user namespace (0 → `uid_base`), so root inside
//! cannot write to the slot itself (host root's 0755 dir); the tmpfs bounds
//! it anyway. Ids need no shifting: the gofer maps them as the other classes'
//! user namespaces do.
//!
//! At create or claim: (1) on the host, a detached copy of the workspace's
//! mount goes into a fresh, unguessable directory of the slot, read-only if
//! asked (the gofer's writes then fail with EROFS, as in the other classes); every host step works
//! from the slot's fd, `O_NOFOLLOW` (`ember_sys::slot`). (2) Inside,
//! `runsc exec --cap CAP_SYS_ADMIN` runs the agent's own binary (bound
//! read-only from the host, so the workload cannot substitute it) as
//! `mount-workspace <slot entry> <target>`, a one-shot process that binds it at
//! the requested path in gVisor's VFS. The capability lives in gVisor's kernel
//! only, for that process only: PID 1 and the commands it spawns never hold
//! it. The sandbox sees the workspace under [`SLOT_DIR`] too; that grants
//! nothing it was not given.
use super::bundle::AGENT_PATH;
use super::cli::OciCli;
use crate::RuntimeError;
use ember_types::SandboxId;
use std::path::{Path, PathBuf};

/// Where the slot appears inside the sandbox.
pub const SLOT_DIR: &str = "/.ember/ws";

/// The slot's tmpfs: room for directory entries only (mounted nosuid, nodev
/// and noexec).
const SLOT_TMPFS: &str = "size=1m,nr_inodes=1024,mode=0755";

fn host_dir(dir: &Path) -> PathBuf {
    dir.join("ws")
}

/// Makes the slot of the sandbox in `dir` and returns its host path.
pub fn prepare(dir: &Path) -> Result<PathBuf, RuntimeError> {
    let slot = host_dir(dir);
    std::fs::create_dir_all(&slot).map_err(|source| RuntimeError::Prepare {
        what: "workspace slot",
        path: slot.clone(),
        source,
    })?;
    if !super::rootfs::is_mountpoint(&slot) {
        ember_sys::fs::mount_tmpfs_noexec(&slot, SLOT_TMPFS)?;
    }
    ember_sys::fs::make_shared(&slot)?;
    Ok(slot)
}

/// Detaches the slot and every workspace under it (the gofer holding its
/// copies is gone by then: destroy kills the sandbox first).
pub fn unmount(dir: &Path) -> Result<(), RuntimeError> {
    ember_sys::fs::unmount_detach(&host_dir(dir))?;
    Ok(())
}

/// A fresh slot entry name: 16 hex digits from the kernel's CSPRNG, so the
/// sandbox cannot plant the directory (or a symlink) in advance.
fn fresh_name() -> Result<String, RuntimeError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| RuntimeError::Prepare {
        what: "random slot name",
        path: PathBuf::from("getrandom(2)"),
        source: e
            .raw_os_error()
            .map_or_else(|| std::io::Error::other(e.to_string()), std::io::Error::from_raw_os_error),
    })?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Mounts the host path `source` at `target` inside the running gVisor
/// sandbox `id` whose directory is `dir` (see the module docs).
pub fn attach(
    cli: &OciCli,
    id: &SandboxId,
    dir: &Path,
    source: &Path,
    target: &str,
    readonly: bool,
) -> Result<(), RuntimeError> {
    let slot = host_dir(dir);
    let name = fresh_name()?;
    ember_sys::slot::attach_in_slot(&slot, &name, source, readonly)?;
    let entry = format!("{SLOT_DIR}/{name}");
    let flags = ["--user", "0:0", "--cap", "CAP_SYS_ADMIN"];
    let res = cli.exec_with(id.as_str(), &flags, &[AGENT_PATH, "mount-workspace", &entry, target]);
    if let Err(source) = res {
        // Best effort: what stays is detached with the whole slot at destroy.
        let _ = ember_sys::slot::detach_from_slot(&slot, &name);
        return Err(RuntimeError::Oci { id: id.clone(), source });
    }
    Ok(())
}
