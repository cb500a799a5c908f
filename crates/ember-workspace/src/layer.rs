//! Attempt layers: a task attempt writes into an overlay over the workspace,
//! and its writes reach the workspace only if the attempt succeeds while its
//! epoch is current; otherwise they are dropped whole.
//!
//! The overlay's lower is the workspace tree (`.ember-ws/data`), its upper
//! and work dirs are in `.ember-ws/attempts/<holder>/` on the same ext4
//! filesystem (so the quota covers them and a commit is renames, no copy),
//! mounted on the host at `<name>/attempts/<holder>` and injected into the
//! sandbox like a plain workspace. `redirect_dir`, `index` and `metacopy` are
//! off: the upper then holds whole files, whiteouts and opaque dirs only.
//!
//! A sandbox in an id range of its own (not the storage range the tree is
//! owned by) gets the overlay over idmapped layers (`open_layer_mapped`):
//! the tree and the layer's dir are attached, shifted onto its range, at
//! `<name>/attempts/<holder>.lower` and `.rw`, the overlay is mounted over
//! those, and they are detached again (overlayfs keeps private clones of its
//! layers). The merged view then shows the range's ids, and writes land on
//! disk in the storage range. The overlay itself cannot be idmapped
//! (`mount_setattr(MOUNT_ATTR_IDMAP)` on it is EINVAL: overlayfs does not
//! set `FS_ALLOW_IDMAP`), hence the layers.
//!
//! Commit, with the writer frozen: 1. `decide` (the caller checks the lease
//! epoch and the task lease) under the layer lock; 2. write `commit` (the
//! intent, naming the task) in the layer's dir; 3. detach the host overlay;
//! 4. merge upper into the tree (`merge.rs`); 5. record `committed/<key>`;
//! 6. remove the layer's dir. A crash after step 2 is finished by the next
//! `ensure_mounted` (`roll_forward`); before it, the layer is dropped.
use crate::merge::{copy_owner_and_mode, merge, open_dir};
use crate::volume::{mounted, HOST_DIR};
use crate::{check_name, io, WorkspaceError, WorkspaceStore};
use std::path::{Path, PathBuf};

const INTENT: &str = "commit";

/// Attaches a copy of the host directory `source` (first argument) at
/// `target` (second), its ids shifted from the storage range onto a
/// sandbox's: an idmapped mount, made by the runtime, which owns the
/// sandbox's range. The map must also keep id 0 as it is: overlayfs makes
/// its work dirs as the mounter (host root), refused (EOVERFLOW) through a
/// mount that does not map it, and the overlay then mounts read-only.
pub type Idmap<'a> = &'a dyn Fn(&Path, &Path) -> std::io::Result<()>;

impl WorkspaceStore {
    fn host_dir(&self, name: &str) -> PathBuf {
        self.fs_path(name).join(HOST_DIR)
    }

    fn layer_dir(&self, name: &str, holder: &str) -> PathBuf {
        self.host_dir(name).join("attempts").join(holder)
    }

    fn merged_path(&self, name: &str, holder: &str) -> PathBuf {
        self.dir(name).join("attempts").join(holder)
    }

    fn lock_layers(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.layers.lock()
    }

    /// Mounts a fresh layer for `holder` over the workspace and returns the
    /// host path to hand to the sandbox instead of the workspace itself.
    pub fn open_layer(&self, name: &str, holder: &str) -> Result<PathBuf, WorkspaceError> {
        self.open_layer_mapped(name, holder, None)
    }

    /// [`WorkspaceStore::open_layer`], over layers shifted by `idmap` if given
    /// (a holder in an id range of its own; see the module's doc).
    pub fn open_layer_mapped(&self, name: &str, holder: &str, idmap: Option<Idmap>) -> Result<PathBuf, WorkspaceError> {
        check_name(holder)?;
        let data = self.ensure_mounted(name).map(|_| self.host_dir(name).join("data"))?;
        let _g = self.lock_layers();
        let dir = self.layer_dir(name, holder);
        self.drop_layer(name, holder)?;
        let (upper, work, merged) = (dir.join("upper"), dir.join("work"), self.merged_path(name, holder));
        for d in [&upper, &work, &merged] {
            std::fs::create_dir_all(d).map_err(io("mkdir", d))?;
        }
        // The merged root shows the upper root's owner and mode: the tree's.
        let (from, to) = (open(&data)?, open(&upper)?);
        copy_owner_and_mode(&from, &to).map_err(io("chown", &upper))?;
        let mounted = self.mapped_layers(name, holder, idmap, &dir, &data).and_then(|(lower, rw)| {
            let (upper, work) = (rw.join("upper"), rw.join("work"));
            let opts = format!(
                "lowerdir={},upperdir={},workdir={},redirect_dir=off,index=off,metacopy=off,xino=off",
                option_path(&lower)?,
                option_path(&upper)?,
                option_path(&work)?
            );
            Ok(ember_sys::fs::mount_overlay(&merged, &opts)?)
        });
        let detached = self.detach_mapped(name, holder);
        if let Err(e) = mounted.and(detached) {
            let _ = self.drop_layer(name, holder);
            return Err(e);
        }
        Ok(merged)
    }

    /// The overlay's lower dir and the dir holding its upper and work dirs:
    /// the tree and the layer's dir themselves, or, with `idmap`, their
    /// shifted copies. The layer's dir is attached first, while nothing is
    /// mounted below it (its copy is recursive).
    fn mapped_layers(
        &self,
        name: &str,
        holder: &str,
        idmap: Option<Idmap>,
        dir: &Path,
        data: &Path,
    ) -> Result<(PathBuf, PathBuf), WorkspaceError> {
        let Some(idmap) = idmap else { return Ok((data.to_path_buf(), dir.to_path_buf())) };
        let [lower, rw] = self.mapped_paths(name, holder);
        for (source, target) in [(dir, &rw), (data, &lower)] {
            std::fs::create_dir_all(target).map_err(io("mkdir", target))?;
            idmap(source, target).map_err(io("idmapped mount", target))?;
        }
        Ok((lower, rw))
    }

    /// Where [`Self::mapped_layers`] attaches the shifted tree and layer dir:
    /// beside the merged dir, outside the workspace's filesystem.
    fn mapped_paths(&self, name: &str, holder: &str) -> [PathBuf; 2] {
        let attempts = self.dir(name).join("attempts");
        [attempts.join(format!("{holder}.lower")), attempts.join(format!("{holder}.rw"))]
    }

    /// Detaches and removes the shifted copies, if any (the overlay holds
    /// its own clones of its layers).
    fn detach_mapped(&self, name: &str, holder: &str) -> Result<(), WorkspaceError> {
        for p in self.mapped_paths(name, holder) {
            detach(&p)?;
            match std::fs::remove_dir(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("remove", &p)(e)),
                _ => {}
            }
        }
        Ok(())
    }

    /// Commits `holder`'s layer into the workspace if `decide()` agrees, else
    /// drops it. The caller has stopped every writer in the layer (frozen the
    /// sandbox). Returns whether it committed; `false` also when there is no
    /// layer (it was dropped: its holder ended, or a newer one swept it).
    pub fn commit_layer(
        &self,
        name: &str,
        holder: &str,
        key: &str,
        decide: impl FnOnce() -> bool,
    ) -> Result<bool, WorkspaceError> {
        check_name(holder)?;
        check_key(key)?;
        let _g = self.lock_layers();
        let dir = self.layer_dir(name, holder);
        if !dir.join("upper").is_dir() {
            return Ok(false);
        }
        if !decide() {
            self.drop_layer(name, holder)?;
            return Ok(false);
        }
        let (intent, tmp) = (dir.join(INTENT), dir.join("commit.tmp"));
        std::fs::write(&tmp, key).map_err(io("write", &tmp))?;
        std::fs::rename(&tmp, &intent).map_err(io("rename", &intent))?;
        self.apply(name, holder)?;
        Ok(true)
    }

    /// Drops `holder`'s layer (its attempt failed, or its sandbox ended), or
    /// finishes its commit if one was decided.
    pub fn discard_layer(&self, name: &str, holder: &str) -> Result<(), WorkspaceError> {
        check_name(holder)?;
        let _g = self.lock_layers();
        if self.layer_dir(name, holder).join(INTENT).is_file() {
            return self.apply(name, holder);
        }
        self.drop_layer(name, holder)
    }

    /// Drops the layers whose holder is gone (`alive` says), finishing any
    /// decided commit: what a daemon that died with layers open left.
    pub fn sweep_layers(&self, name: &str, alive: impl Fn(&str) -> bool) -> Result<(), WorkspaceError> {
        for h in self.layer_holders(name)? {
            if !alive(&h) {
                self.discard_layer(name, &h)?;
            }
        }
        Ok(())
    }

    /// Whether an attempt of the task `key` committed into this workspace
    /// (its report may have been lost after the commit).
    pub fn committed(&self, name: &str, key: &str) -> Result<bool, WorkspaceError> {
        check_key(key)?;
        self.ensure_mounted(name)?;
        let _g = self.lock_layers();
        Ok(self.host_dir(name).join("committed").join(key).exists())
    }

    /// Forgets the commit record of `key` once its result is recorded.
    pub fn forget_committed(&self, name: &str, key: &str) -> Result<(), WorkspaceError> {
        check_key(key)?;
        let p = self.host_dir(name).join("committed").join(key);
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", &p)(e)),
            _ => Ok(()),
        }
    }

    /// Finishes every commit decided before a crash (called on each mount).
    pub(crate) fn roll_forward(&self, name: &str) -> Result<(), WorkspaceError> {
        let _g = self.lock_layers();
        for h in self.layer_holders(name)? {
            if self.layer_dir(name, &h).join(INTENT).is_file() {
                self.apply(name, &h)?;
            }
        }
        Ok(())
    }

    /// Detaches every layer's host overlay (before the filesystem's unmount).
    pub(crate) fn unmount_layers(&self, name: &str) -> Result<(), WorkspaceError> {
        let dir = self.dir(name).join("attempts");
        let Ok(rd) = std::fs::read_dir(&dir) else { return Ok(()) };
        for e in rd.flatten() {
            detach(&e.path())?;
        }
        Ok(())
    }

    fn layer_holders(&self, name: &str) -> Result<Vec<String>, WorkspaceError> {
        let dir = self.host_dir(name).join("attempts");
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("read", &dir)(e)),
        };
        Ok(rd.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
    }

    /// Steps 3–6 of a commit whose intent is written. Idempotent.
    fn apply(&self, name: &str, holder: &str) -> Result<(), WorkspaceError> {
        let dir = self.layer_dir(name, holder);
        detach(&self.merged_path(name, holder))?;
        let key = std::fs::read_to_string(dir.join(INTENT)).map_err(io("read", &dir))?;
        check_key(&key)?;
        let (upper, data) = (dir.join("upper"), self.host_dir(name).join("data"));
        if upper.is_dir() {
            let (up, low) = (open(&upper)?, open(&data)?);
            merge(&up, &low).map_err(io("merge", &upper))?;
            copy_owner_and_mode(&up, &low).map_err(io("chown", &data))?;
        }
        let rec = self.host_dir(name).join("committed").join(&key);
        std::fs::write(&rec, b"").map_err(io("write", &rec))?;
        self.drop_layer(name, holder)
    }

    /// Removes a layer's overlay and dirs, committed or not.
    fn drop_layer(&self, name: &str, holder: &str) -> Result<(), WorkspaceError> {
        let merged = self.merged_path(name, holder);
        detach(&merged)?;
        let _ = std::fs::remove_dir(&merged);
        // Before the dir's removal: a copy of it attached below would be walked.
        self.detach_mapped(name, holder)?;
        let dir = self.layer_dir(name, holder);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", &dir)(e)),
            _ => Ok(()),
        }
    }
}

/// Detaches the host overlay at `path` if mounted. Lazily: a sandbox's clone
/// of it is a mount of its own, and the host side must go regardless.
fn detach(path: &Path) -> Result<(), WorkspaceError> {
    if mounted(path) {
        ember_sys::fs::unmount_detach(path)?;
    }
    Ok(())
}

fn open(p: &Path) -> Result<std::os::fd::OwnedFd, WorkspaceError> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io("open", p)(std::io::ErrorKind::InvalidInput.into()))?;
    open_dir(rustix::fs::CWD, &c).map_err(io("open", p))
}

/// A path as an overlay mount option: `,` `:` `\` would be read as syntax.
fn option_path(p: &Path) -> Result<String, WorkspaceError> {
    let s = p.to_string_lossy().into_owned();
    if s.contains([',', ':', '\\']) {
        return Err(io("overlay option", p)(std::io::ErrorKind::InvalidInput.into()));
    }
    Ok(s)
}

/// A commit record's key names a file: a task id's characters only.
fn check_key(key: &str) -> Result<(), WorkspaceError> {
    let ok = (1..=128).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok && key != "." && key != ".." {
        Ok(())
    } else {
        Err(WorkspaceError::Name(key.to_string()))
    }
}
