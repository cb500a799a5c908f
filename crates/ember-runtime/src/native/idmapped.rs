//! The idmapped mounts of one native launch: the sandbox's host id range and
//! the shared layers and volumes as detached trees shifted onto it.
use crate::idrange::IdRanges;
use crate::RuntimeError;
use ember_types::SandboxSpec;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;

/// The sandbox's range, and its lower layers and volumes (stored in the
/// storage range) as detached idmapped trees onto it: the child attaches
/// them in its own mount namespace ([`ember_sys::spawn::FsOp::Attach`]), so the host's table
/// never has them.
///
/// A host volume (`--allow-host-path`) on a filesystem that cannot be
/// idmapped (EINVAL: an overlay, a FUSE filesystem...) keeps the sandbox in
/// the storage range with plain mounts, as every sandbox was before
/// per-sandbox ranges (its user namespace is still not host root's).
/// Task attempts' layers, overlays too, are not volumes: they are built over
/// idmapped layers ([`attach_shifted`]) and injected after the launch.
pub(crate) fn trees(
    ranges: &IdRanges,
    host_template: &Path,
    name: &str,
    spec: &SandboxSpec,
) -> Result<Trees, RuntimeError> {
    if spec.volumes.iter().any(|v| !in_storage_range(ranges, &v.host_path)) {
        // A host volume whose files are the host's own (owned by host users,
        // not the storage range): through a mount idmapped from the storage
        // range the sandbox could not create a file in it (EACCES in a 0777
        // directory owned by root: the OpenSandbox SDK suite's host volume
        // test). Such a sandbox stays in the storage range with plain
        // mounts. A workspace or task layer (storage-owned) is idmapped.
        let base = ranges.use_storage(name);
        return Ok(Trees { base, lowers: Vec::new(), volumes: Vec::new(), layer: None });
    }
    let base = ranges.allocate(name)?;
    let userns = ember_sys::idmap::userns_fd(&ranges.storage_map(base))?;
    let tree = |p: &Path, ro: bool| ember_sys::idmap::idmapped_tree(p, ro, userns.as_fd());
    let lowers = if spec.lower_dirs.is_empty() { vec![host_template.to_path_buf()] } else { spec.lower_dirs.clone() };
    let volumes = spec.volumes.iter().map(|v| tree(&v.host_path, v.read_only)).collect::<Result<Vec<_>, _>>();
    let made = volumes.and_then(|v| Ok((v, lowers.iter().map(|l| tree(l, true)).collect::<Result<Vec<_>, _>>()?)));
    match made {
        Ok((volumes, lowers)) => Ok(Trees { base, lowers, volumes, layer: None }),
        // A volume or a layer on a filesystem without idmapped mounts (a
        // tmpfs or initramfs data dir: every create failed in the cgroup v2
        // guest): the storage range with plain mounts.
        Err(e) if e.source.raw_os_error() == Some(EINVAL) => {
            let base = ranges.use_storage(name);
            Ok(Trees { base, lowers: Vec::new(), volumes: Vec::new(), layer: None })
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether `dir`'s filesystem takes idmapped mounts (a probe: one detached
/// idmapped tree, dropped at once). A restore seeds its writable layer for
/// the sandbox's range before the launch: on a filesystem without them the
/// launch falls back to the storage range, and so must the seeding.
pub(crate) fn supported(ranges: &IdRanges, dir: &Path) -> bool {
    let probe = ranges.storage_base().saturating_add(crate::idrange::RANGE);
    let Ok(userns) = ember_sys::idmap::userns_fd(&ranges.storage_map(probe)) else { return false };
    ember_sys::idmap::idmapped_tree(dir, true, userns.as_fd()).is_ok()
}

/// The volume's root is owned by an id of the storage range (not followed
/// if it is a symlink; a path that cannot be read counts as not).
fn in_storage_range(ranges: &IdRanges, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let base = u64::from(ranges.storage_base());
    std::fs::symlink_metadata(path)
        .is_ok_and(|m| (base..base + u64::from(crate::idrange::RANGE)).contains(&u64::from(m.uid())))
}

/// What `mount_setattr` answers for a filesystem without idmapped mounts.
const EINVAL: i32 = 22;

/// Detached trees of one launch, open until the child has attached them.
pub(crate) struct Trees {
    pub(crate) base: u32,
    /// Empty in the storage range: the layers and volumes are used as they
    /// are (by path; from a launch namespace the volumes by plain trees,
    /// [`Trees::for_launch_ns`]).
    pub(crate) lowers: Vec<OwnedFd>,
    pub(crate) volumes: Vec<OwnedFd>,
    /// The writable layer's tmpfs, for a launch from a launch namespace.
    pub(crate) layer: Option<OwnedFd>,
}

impl Trees {
    pub(super) fn raw(&self) -> Idmapped {
        let raw = |v: &[OwnedFd]| v.iter().map(|f| f.as_raw_fd()).collect();
        Idmapped {
            base: self.base,
            lowers: raw(&self.lowers),
            volumes: raw(&self.volumes),
            layer: self.layer.as_ref().map(|f| f.as_raw_fd()),
        }
    }

    /// What a child cloned from a launch namespace needs of the host's mounts
    /// made since it was: the layer's tmpfs at `mnt` and, in the storage
    /// range, each volume, as detached trees of the host's table (the
    /// idmapped ones are trees already; the lowers and `/usr` are not mounts
    /// ember makes).
    pub(crate) fn for_launch_ns(
        &mut self,
        mnt: &Path,
        volumes: &[ember_types::VolumeMount],
    ) -> Result<(), RuntimeError> {
        if self.volumes.len() != volumes.len() {
            let plain = |v: &ember_types::VolumeMount| ember_sys::idmap::plain_tree(&v.host_path, v.read_only);
            self.volumes = volumes.iter().map(plain).collect::<Result<_, _>>()?;
        }
        self.layer = Some(ember_sys::idmap::plain_tree(mnt, false)?);
        Ok(())
    }
}

/// What the mount plan needs of [`Trees`]: the range and the fds' numbers.
pub(super) struct Idmapped {
    pub(super) base: u32,
    pub(super) lowers: Vec<RawFd>,
    pub(super) volumes: Vec<RawFd>,
    pub(super) layer: Option<RawFd>,
}

/// Mounts `source` (a workspace) at `target` in the running sandbox `id`,
/// idmapped from the storage range onto the sandbox's own. A sandbox in the
/// storage range sees storage ids as they are (and an overlay, a task
/// attempt's layer, cannot be idmapped anyway).
pub(crate) fn inject(
    ranges: &IdRanges,
    id: &ember_types::SandboxId,
    pid: i32,
    source: &Path,
    target: &str,
    readonly: bool,
) -> Result<(), RuntimeError> {
    let gone = || RuntimeError::Gone { id: id.clone(), message: "it holds no id range".into() };
    let base = ranges.of(id.as_str()).ok_or_else(gone)?;
    let userns =
        (base != ranges.storage_base()).then(|| ember_sys::idmap::userns_fd(&ranges.storage_map(base))).transpose()?;
    // An overlay cannot be idmapped: ember's (a task attempt's layer) is
    // built over layers already shifted onto the sandbox's range.
    let idmap = userns.as_ref().filter(|_| !ember_sys::idmap::is_overlay(source).unwrap_or(false)).map(|u| u.as_fd());
    Ok(ember_sys::inject::inject_mount(pid, source, target, readonly, (base, base), idmap)?)
}

/// Attaches a copy of the host dir `source` at the host dir `target`, its
/// ids shifted from the storage range onto the range at `to`, id 0 kept (an
/// overlay's mounter, host root, makes its work dirs through it): a layer of
/// a task attempt's overlay (`ember_workspace::Idmap`'s contract).
pub fn attach_shifted(ranges: &IdRanges, to: u32, source: &Path, target: &Path) -> std::io::Result<()> {
    let sys = |e: ember_sys::SysError| e.source;
    let userns = ember_sys::idmap::userns_fd(&ranges.layer_map(to)).map_err(sys)?;
    let tree = ember_sys::idmap::idmapped_tree(source, false, userns.as_fd()).map_err(sys)?;
    let dir = ember_sys::beneath::PinnedDir::open(target).map_err(sys)?;
    ember_sys::idmap::attach_tree(tree.as_fd(), dir.as_fd(), target).map_err(sys)
}
