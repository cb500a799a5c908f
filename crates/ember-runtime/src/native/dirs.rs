//! Where native sandboxes' host dirs live: `<data>/sandboxes`, on a tmpfs
//! of its own.
//!
//! Each launch makes a dir, its writable layer's mount point, its agent's
//! socket and log there, and each removal deletes them: state that lives
//! exactly as long as the sandboxes, which can never outlive the host's
//! boot (as runc and crun keep theirs in `/run`). On a disk filesystem
//! every one of those is an inode allocated and freed under the parent
//! dir's lock; on this project's test hosts (ext4 without a journal,
//! mounted `discard`) the allocation searches past recently deleted inodes
//! and a removal discards synchronously: ~0.13 ms to make the four and
//! ~0.3 ms to remove them per sandbox on a quiet host, against ~0.07 ms
//! each on a tmpfs (docs/performance.md, "Sandbox dirs in memory").
//!
//! The tmpfs stays mounted when the daemon ends (its sandboxes keep running
//! and are adopted by the next one, which finds it mounted); `ember
//! uninstall` unmounts it with the rest of the data dir's mounts.
use std::path::Path;

/// Mode 0755: a sandbox's id range traverses it to reach its layer. The
/// size bounds what agents' logs can take of the host's memory together
/// (each log's pages are charged to its sandbox's memory cgroup as well).
const OPTIONS: &str = "mode=0755,size=10%";

/// Puts `dir` (made) on a tmpfs of its own unless it is on one already (an
/// earlier daemon mounted it, or the data dir is a tmpfs) or holds entries
/// (an earlier daemon kept its sandboxes on disk: mounting over them would
/// hide their sockets from adoption; the next start after they are gone
/// mounts it). Never fatal: where the mount fails the dirs stay on disk.
pub(super) fn in_memory(dir: &Path) {
    let stays = |why: &str| tracing::warn!(dir = %dir.display(), why, "sandbox dirs stay on disk");
    match ember_sys::fs::is_tmpfs(dir) {
        Ok(true) => {}
        Ok(false) => match std::fs::read_dir(dir).map(|mut d| d.next().is_none()) {
            Ok(true) => {
                if let Err(e) = ember_sys::fs::mount_tmpfs(dir, OPTIONS) {
                    stays(&e.to_string());
                }
            }
            Ok(false) => stays("an earlier daemon's sandboxes are there"),
            Err(e) => stays(&e.to_string()),
        },
        Err(e) => stays(&e.to_string()),
    }
}
