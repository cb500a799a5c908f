//! The data dir as `ember serve` first meets it: one daemon at a time (an
//! exclusive lock, taken before recovery, network setup or a pool reconciler
//! touches anything), and a path the sandboxes' user range can traverse.
use anyhow::{bail, Context};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Held for the daemon's lifetime; the kernel drops the lock when the process
/// ends, however it ends (no stale lock after a kill -9).
pub struct DataDirLock {
    _file: File,
}

/// Creates the data dir if needed and locks `<data-dir>/ember.lock`,
/// recording this process's pid in it. A second daemon is refused with the
/// holder's pid. The file is opened close-on-exec (std's default), so the
/// sandboxes and runtimes the daemon starts never inherit the lock.
pub fn lock(data_dir: &Path) -> anyhow::Result<DataDirLock> {
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating --data-dir {}", data_dir.display()))?;
    let path = data_dir.join("ember.lock");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            let holder = if pid.is_empty() { "another process".to_string() } else { format!("pid {pid}") };
            bail!(
                "data dir {} is in use by another ember serve ({holder}, lock {}); stop it, or pass a different --data-dir",
                data_dir.display(),
                path.display()
            );
        }
        Err(TryLockError::Error(e)) => return Err(e).with_context(|| format!("locking {}", path.display())),
    }
    file.set_len(0).and_then(|()| file.rewind()).with_context(|| format!("truncating {}", path.display()))?;
    writeln!(file, "{}", std::process::id()).with_context(|| format!("writing {}", path.display()))?;
    Ok(DataDirLock { _file: file })
}

/// Refuses a data dir that a sandbox's root (host uid and gid `uid_base`,
/// without the daemon's capabilities) cannot reach: its mounts under
/// `<data-dir>/sandboxes` would all fail with EACCES. Every directory from `/`
/// down to the data dir must be searchable by that uid. Changing permissions
/// of the user's own directories behind their back is not ember's call, so it
/// names the directory and the fix instead.
pub fn check_traversable(data_dir: &Path, uid_base: u32) -> anyhow::Result<()> {
    let real = data_dir.canonicalize().with_context(|| format!("--data-dir {}", data_dir.display()))?;
    for dir in real.ancestors().collect::<Vec<_>>().into_iter().rev() {
        let meta = std::fs::metadata(dir).with_context(|| format!("stat {}", dir.display()))?;
        if !searchable(meta.uid(), meta.gid(), meta.mode(), uid_base) {
            bail!(
                "--data-dir {}: sandboxes (host uids from {uid_base}) cannot traverse {} (mode {:04o}, owner {}:{}), \
                 so every create would fail at its mounts; run `chmod o+x {}` or choose a data dir whose every parent \
                 is searchable by others (e.g. under /var/lib)",
                data_dir.display(),
                dir.display(),
                meta.mode() & 0o7777,
                meta.uid(),
                meta.gid(),
                dir.display()
            );
        }
    }
    Ok(())
}

/// The permission check the kernel makes for a search (x) by `uid`/`gid`
/// (ACLs aside): the owner bits if it owns the dir, else the group bits if
/// in its group, else the others' bits.
fn searchable(owner: u32, group: u32, mode: u32, uid: u32) -> bool {
    let bit = if owner == uid {
        0o100
    } else if group == uid {
        0o010
    } else {
        0o001
    };
    mode & bit != 0
}

#[cfg(test)]
mod tests {
    use super::searchable;

    #[test]
    fn search_permission_follows_owner_group_other() {
        assert!(!searchable(0, 0, 0o700, 1_000_000_000), "mktemp -d");
        assert!(searchable(0, 0, 0o711, 1_000_000_000));
        assert!(searchable(1_000_000_000, 0, 0o700, 1_000_000_000));
        assert!(!searchable(1_000_000_000, 0, 0o077, 1_000_000_000), "owner bits win even when others may");
        assert!(searchable(0, 1_000_000_000, 0o710, 1_000_000_000));
    }
}
