//! The volumes: sparse ext4 images, loop-mounted on the host, plus their records.
//!
//! Layout of one workspace `<root>/<name>/`: `disk.img`, `meta.json`, `fs/`
//! (the image's filesystem, host only), `mnt/` (a bind of `fs/.ember-ws/data`,
//! the tree sandboxes see), `attempts/<holder>` (an attempt layer's overlay,
//! `layer.rs`). Inside the filesystem, `.ember-ws/` is root's and never shown
//! to a sandbox: `data/` (the workspace), `attempts/` (the layers' upper and
//! work dirs, on the same filesystem so a commit is renames), `committed/`.
//! Images from before the attempt layers kept the tree at the filesystem's
//! root; the first mount moves it into `data/` (`migrate`).
use crate::lease::LeaseState;
use crate::{check_name, io, WorkspaceError};
use ember_sys::loopdev;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// ext4 needs a few MiB for its own metadata.
pub const MIN_SIZE: u64 = 16 << 20;
/// The largest workspace: ext4's 16 TiB file-size limit on the host (4 KiB
/// blocks) minus headroom; a larger sparse image cannot even be truncated.
pub const MAX_SIZE: u64 = 8 << 40;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceMeta {
    pub name: String,
    pub size_bytes: u64,
    pub created_at_ms: i64,
    #[serde(flatten)]
    pub leases: LeaseState,
}

pub struct WorkspaceStore {
    root: PathBuf,
    /// Host uid/gid that owns each filesystem's root (the sandbox user's).
    pub(crate) owner: (u32, u32),
    /// Serialises the attempt layers' open, commit and discard (`layer.rs`):
    /// a std Mutex, held over renames and mounts on a blocking thread.
    pub(crate) layers: parking_lot::Mutex<()>,
    /// Serialises mounting, unmounting and removal: a status read that mounts
    /// a workspace on demand must never remount one a removal has just
    /// unmounted (the remount would leak, and the removal fail). Taken before
    /// `layers` wherever both are held.
    mounts: parking_lot::Mutex<()>,
    /// Which sizes to keep spare volumes of (`spares.rs`).
    pub(crate) spares: crate::spares::Spares,
    /// Room admitted to volume writes in flight (`room.rs`).
    pub(crate) room: crate::room::Ledger,
    /// Where `mkfs.ext4` runs (see [`make_image`]); the host's namespace
    /// when it could not be made.
    quiet: Option<ember_sys::mountns::LaunchNs>,
    /// The largest size accepted and the disk reserve (`room.rs`).
    limits: crate::Limits,
}

/// The host-only dir at the root of every workspace filesystem.
pub(crate) const HOST_DIR: &str = ".ember-ws";

pub(crate) fn run(command: &'static str, args: &[&str], path: &Path) -> Result<(), WorkspaceError> {
    let out = Command::new(command).args(args).output().map_err(io("run", Path::new(command)))?;
    if out.status.success() {
        return Ok(());
    }
    Err(WorkspaceError::Command {
        command,
        path: path.to_path_buf(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// Makes the renames in `dir` durable. The record holds the lease and its
/// fencing epoch: were the rename lost to a power loss, the epoch would roll
/// back and a fenced writer's commit could be accepted again.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), WorkspaceError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io("fsync", dir))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl WorkspaceStore {
    pub fn open(root: PathBuf, owner: (u32, u32)) -> Result<WorkspaceStore, WorkspaceError> {
        std::fs::create_dir_all(&root).map_err(io("mkdir", &root))?;
        let quiet = quiet_namespace(&root);
        Ok(WorkspaceStore {
            root,
            owner,
            layers: parking_lot::Mutex::new(()),
            mounts: parking_lot::Mutex::new(()),
            spares: Default::default(),
            room: Default::default(),
            quiet,
            limits: crate::Limits::default(),
        })
    }

    /// Refuses a size below ext4's needs or above the configured maximum.
    pub fn check_size(&self, size: u64) -> Result<(), WorkspaceError> {
        if size < MIN_SIZE {
            return Err(WorkspaceError::TooSmall(size));
        }
        if size > self.limits.max_size {
            return Err(WorkspaceError::TooLarge { size, max: self.limits.max_size });
        }
        Ok(())
    }

    /// The store with `limits` in place of the defaults.
    pub fn with_limits(mut self, limits: crate::Limits) -> Self {
        self.limits = limits;
        self
    }

    pub fn limits(&self) -> crate::Limits {
        self.limits
    }

    /// The namespace `mkfs.ext4` runs in, if there is one.
    pub(crate) fn quiet(&self) -> Option<&ember_sys::mountns::LaunchNs> {
        self.quiet.as_ref()
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Where the workspace's whole filesystem is mounted (host only).
    pub(crate) fn fs_path(&self, name: &str) -> PathBuf {
        self.dir(name).join("fs")
    }

    /// Where the workspace is mounted on the host.
    pub fn mount_path(&self, name: &str) -> PathBuf {
        self.dir(name).join("mnt")
    }

    /// Creates the image, the filesystem (root owned by the sandbox user) and
    /// the record, in a temp dir renamed into place, then mounts it. A spare
    /// volume of that size, made ahead (`spares.rs`), stands in for the image
    /// and the mounts when there is one.
    pub fn create(&self, name: &str, size_bytes: u64) -> Result<WorkspaceMeta, WorkspaceError> {
        self.create_in(name, size_bytes, false)
    }

    /// [`create`](Self::create) for a volume whose room `_hold` already
    /// admitted (a restore's or fork's volumes, admitted together with the
    /// data they receive).
    pub fn create_within(
        &self,
        name: &str,
        size_bytes: u64,
        _hold: &crate::RoomHold<'_>,
    ) -> Result<WorkspaceMeta, WorkspaceError> {
        self.create_in(name, size_bytes, true)
    }

    fn create_in(&self, name: &str, size_bytes: u64, admitted: bool) -> Result<WorkspaceMeta, WorkspaceError> {
        check_name(name)?;
        self.check_size(size_bytes)?;
        let dir = self.dir(name);
        if dir.exists() {
            return Err(WorkspaceError::Exists(name.to_string()));
        }
        let tmp = self.root.join(format!(".{name}.tmp"));
        discard_dir(&tmp)?;
        let meta =
            WorkspaceMeta { name: name.into(), size_bytes, created_at_ms: now_ms(), leases: LeaseState::default() };
        let spare = self.take_spare(size_bytes, &tmp);
        if !spare {
            let _room = if admitted { None } else { Some(self.reserve_room(size_bytes, 1, 0)?) };
            make_image(&tmp, size_bytes, self.owner, self.quiet())?;
        }
        let placed = self.write_meta(&tmp, &meta).and_then(|()| {
            std::fs::rename(&tmp, &dir).map_err(io("rename", &dir))?;
            sync_dir(&self.root)
        });
        if let Err(e) = placed {
            let _ = discard_dir(&tmp);
            return Err(e);
        }
        self.ensure_mounted(name)?;
        Ok(meta)
    }

    fn write_meta(&self, dir: &Path, meta: &WorkspaceMeta) -> Result<(), WorkspaceError> {
        let p = dir.join("meta.json");
        let t = dir.join("meta.json.tmp");
        let data = serde_json::to_vec_pretty(meta).map_err(|e| io("encode", &p)(std::io::Error::other(e)))?;
        let mut f = std::fs::File::create(&t).map_err(io("create", &t))?;
        f.write_all(&data).map_err(io("write", &t))?;
        f.sync_all().map_err(io("fsync", &t))?;
        std::fs::rename(&t, &p).map_err(io("rename", &p))?;
        sync_dir(dir)
    }

    pub fn save(&self, meta: &WorkspaceMeta) -> Result<(), WorkspaceError> {
        self.write_meta(&self.dir(&meta.name), meta)
    }

    pub fn meta(&self, name: &str) -> Result<WorkspaceMeta, WorkspaceError> {
        check_name(name)?;
        let p = self.dir(name).join("meta.json");
        let data = std::fs::read(&p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => WorkspaceError::NotFound(name.to_string()),
            _ => io("read", &p)(e),
        })?;
        serde_json::from_slice(&data).map_err(|e| io("decode", &p)(std::io::Error::other(e)))
    }

    pub fn list(&self) -> Vec<WorkspaceMeta> {
        let Ok(rd) = std::fs::read_dir(&self.root) else { return vec![] };
        let mut v: Vec<_> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| !n.starts_with('.'))
            .filter_map(|n| self.meta(&n).ok())
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn is_mounted(&self, name: &str) -> bool {
        mounted(&self.mount_path(name))
    }

    /// Mounts the workspace on the host if it is not (after a reboot, say):
    /// the filesystem at `fs/`, its tree bound at `mnt/`. Commits decided
    /// before a crash are finished first (`layer.rs`). Returns `mnt/`.
    pub fn ensure_mounted(&self, name: &str) -> Result<PathBuf, WorkspaceError> {
        let _g = self.mounts.lock();
        self.ensure_mounted_locked(name)
    }

    fn ensure_mounted_locked(&self, name: &str) -> Result<PathBuf, WorkspaceError> {
        let (fs, mnt) = (self.fs_path(name), self.mount_path(name));
        if !mounted(&fs) {
            let img = self.dir(name).join("disk.img");
            if !img.exists() {
                return Err(WorkspaceError::NotFound(name.to_string()));
            }
            if mounted(&mnt) {
                // An image mounted at mnt/ by a daemon from before `fs/`.
                loopdev::unmount(&mnt)?;
            }
            std::fs::create_dir_all(&fs).map_err(io("mkdir", &fs))?;
            mount_image(&img, &fs)?;
        }
        let data = migrate(&fs, self.owner)?;
        self.roll_forward(name)?;
        if !mounted(&mnt) {
            std::fs::create_dir_all(&mnt).map_err(io("mkdir", &mnt))?;
            loopdev::bind(&data, &mnt)?;
        }
        Ok(mnt)
    }

    pub fn unmount(&self, name: &str) -> Result<(), WorkspaceError> {
        let _g = self.mounts.lock();
        self.unmount_locked(name)
    }

    fn unmount_locked(&self, name: &str) -> Result<(), WorkspaceError> {
        self.unmount_layers(name)?;
        for p in [self.mount_path(name), self.fs_path(name)] {
            if mounted(&p) {
                loopdev::unmount(&p)?;
            }
        }
        Ok(())
    }

    /// Bytes used and the filesystem's size (what `df` shows as used and
    /// size), from `statvfs`: no process per status read.
    pub fn usage(&self, name: &str) -> Result<(u64, u64), WorkspaceError> {
        let mnt = self.ensure_mounted(name)?;
        let st = rustix::fs::statvfs(&mnt).map_err(|e| io("statvfs", &mnt)(e.into()))?;
        let used = st.f_blocks.saturating_sub(st.f_bfree).saturating_mul(st.f_frsize);
        Ok((used, st.f_blocks.saturating_mul(st.f_frsize)))
    }

    /// Unmounts and deletes the workspace and its data. Refused while a live
    /// sandbox holds its lease (`alive` tells).
    pub fn remove(&self, name: &str, alive: impl Fn(&str) -> bool) -> Result<(), WorkspaceError> {
        let _g = self.mounts.lock();
        let meta = self.meta(name)?;
        if let Some(l) = meta.leases.lease.filter(|l| alive(&l.holder)) {
            return Err(WorkspaceError::InUse { name: name.into(), holder: l.holder });
        }
        self.unmount_locked(name)?;
        let dir = self.dir(name);
        std::fs::remove_dir_all(&dir).map_err(io("remove", &dir))
    }
}

/// A volume's dir `dir` (not yet a workspace's): `mnt/`, `fs/` and a sparse
/// `disk.img` of `size` bytes holding a fresh ext4 whose root is `owner`'s.
/// A new sparse image in `dir` with an ext4 filesystem on it, made in the
/// mount namespace `quiet` if given.
///
/// `mkfs.ext4` first checks that its target is not mounted: it reads the
/// whole mount table and stats every mount's source, ~4 µs per mount. On a
/// node with 300 sandboxes (1,300 mounts) that was most of its CPU, and in a
/// rebind storm `mkfs.ext4` was 8 % of the host's (docs/performance.md,
/// "mkfs.ext4 reads the mount table"). In a namespace holding only what
/// leads to the store (`quiet_namespace`) it reads a few dozen; the image is
/// new, so mounted nowhere. The journal is not zeroed
/// (`lazy_journal_init`): the file is new and sparse and reads as zeros
/// already, so that only wrote 32 MiB of zeros per volume.
pub(crate) fn make_image(
    dir: &Path,
    size: u64,
    owner: (u32, u32),
    quiet: Option<&ember_sys::mountns::LaunchNs>,
) -> Result<(), WorkspaceError> {
    std::fs::create_dir_all(dir.join("mnt")).map_err(io("mkdir", dir))?;
    std::fs::create_dir(dir.join("fs")).map_err(io("mkdir", dir))?;
    let img = dir.join("disk.img");
    let f = std::fs::File::create_new(&img).map_err(io("create", &img))?;
    f.set_len(size).map_err(io("truncate", &img))?;
    drop(f);
    let opts = format!("root_owner={}:{},lazy_journal_init=1", owner.0, owner.1);
    let img_s = img.to_string_lossy().into_owned();
    let mkfs = || run("mkfs.ext4", &["-q", "-F", "-m", "0", "-E", &opts, &img_s], &img);
    match quiet {
        Some(ns) => ns.run("mkfs.ext4", mkfs)?,
        None => mkfs(),
    }
}

/// A mount namespace with only the mounts that lead to the store's `root`
/// (`/`, `/proc`, `/dev`, `/usr`, the root's own), where `mkfs.ext4` finds a
/// short table whatever the host holds. None (and `mkfs.ext4` runs in the
/// host's) without the privilege to make one.
pub(crate) fn quiet_namespace(root: &Path) -> Option<ember_sys::mountns::LaunchNs> {
    ember_sys::mountns::LaunchNs::for_dir(root, &[], &[])
        .map_err(|e| tracing::debug!(error = %e, "mkfs.ext4 runs in the host's mount namespace"))
        .ok()
}

/// Removes a volume's dir that no workspace record names (a create's temp
/// dir, a spare): its bind and its filesystem are unmounted first, so that
/// the removal never walks into a mounted filesystem. Absent is fine.
pub(crate) fn discard_dir(dir: &Path) -> Result<(), WorkspaceError> {
    if !dir.exists() {
        return Ok(());
    }
    for p in [dir.join("mnt"), dir.join("fs")] {
        if mounted(&p) {
            loopdev::unmount(&p)?;
        }
    }
    std::fs::remove_dir_all(dir).map_err(io("remove", dir))
}

/// Mounts a workspace's ext4 image at `fs` (nosuid, nodev) through a loop
/// device, with syscalls: mount(8) was a process per mount that read the
/// host's whole mount table (ember_sys::loopdev).
pub(crate) fn mount_image(img: &Path, fs: &Path) -> Result<(), WorkspaceError> {
    Ok(loopdev::mount_image(img, fs, c"ext4")?)
}

/// Whether something is mounted at `path` (one `statx`: every status read
/// and mount check passes here, and a scan of the mount table was 17 % of
/// the machine's CPU on the 10-node drill).
pub(crate) fn mounted(path: &Path) -> bool {
    ember_sys::fs::mounted(path)
}

/// Makes `.ember-ws/{data,attempts,committed}` in the filesystem mounted at
/// `fs` and returns `data`. A filesystem whose tree is still at its root (made
/// before the attempt layers) has it moved into `data` first: every root entry
/// but `.ember-ws` and `lost+found` goes to `data.new`, renamed `data` last, so
/// a crash half-way is finished by the next mount. Paths here are the host's:
/// no sandbox ever saw the filesystem's root through `fs/`.
pub(crate) fn migrate(fs: &Path, owner: (u32, u32)) -> Result<PathBuf, WorkspaceError> {
    use std::os::unix::fs::{chown, PermissionsExt};
    let host = fs.join(HOST_DIR);
    let data = host.join("data");
    for d in ["attempts", "committed"] {
        std::fs::create_dir_all(host.join(d)).map_err(io("mkdir", &host))?;
    }
    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o700)).map_err(io("chmod", &host))?;
    if data.is_dir() {
        return Ok(data);
    }
    let new = host.join("data.new");
    match std::fs::create_dir(&new) {
        Ok(()) => {
            // The tree's root keeps the filesystem root's owner and mode.
            let meta = std::fs::metadata(fs).map_err(io("stat", fs))?;
            std::fs::set_permissions(&new, meta.permissions()).map_err(io("chmod", &new))?;
            chown(&new, Some(owner.0), Some(owner.1)).map_err(io("chown", &new))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("mkdir", &new)(e)),
    }
    for e in std::fs::read_dir(fs).map_err(io("read", fs))? {
        let e = e.map_err(io("read", fs))?;
        let n = e.file_name();
        if n == HOST_DIR || n == "lost+found" {
            continue;
        }
        std::fs::rename(e.path(), new.join(&n)).map_err(io("rename", &e.path()))?;
    }
    std::fs::rename(&new, &data).map_err(io("rename", &data))?;
    Ok(data)
}
