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
/// A volume on a filesystem that cannot be idmapped (EINVAL: an overlay,
/// e.g. a task attempt's own layer over its workspace) keeps the sandbox
/// in the storage range with plain mounts, as every sandbox was before
/// per-sandbox ranges (its user namespace is still not host root's).
pub(super) fn trees(
    ranges: &IdRanges,
    host_template: &Path,
    name: &str,
    spec: &SandboxSpec,
) -> Result<Trees, RuntimeError> {
    if spec.storage_id_range {
        return Ok(Trees { base: ranges.use_storage(name), lowers: Vec::new(), volumes: Vec::new() });
    }
    let base = ranges.allocate(name)?;
    let userns = ember_sys::idmap::userns_fd(&ranges.storage_map(base))?;
    let tree = |p: &Path, ro: bool| ember_sys::idmap::idmapped_tree(p, ro, userns.as_fd());
    let volumes = match spec.volumes.iter().map(|v| tree(&v.host_path, v.read_only)).collect() {
        Ok(v) => v,
        Err(e) if e.source.raw_os_error() == Some(EINVAL) => {
            let base = ranges.use_storage(name);
            return Ok(Trees { base, lowers: Vec::new(), volumes: Vec::new() });
        }
        Err(e) => return Err(e.into()),
    };
    let lowers = if spec.lower_dirs.is_empty() { vec![host_template.to_path_buf()] } else { spec.lower_dirs.clone() };
    Ok(Trees { base, lowers: lowers.iter().map(|l| tree(l, true)).collect::<Result<_, _>>()?, volumes })
}

/// What `mount_setattr` answers for a filesystem without idmapped mounts.
const EINVAL: i32 = 22;

/// Detached idmapped trees of one launch, open until the child has attached them.
pub(super) struct Trees {
    pub(super) base: u32,
    lowers: Vec<OwnedFd>,
    volumes: Vec<OwnedFd>,
}

impl Trees {
    pub(super) fn raw(&self) -> Idmapped {
        let raw = |v: &[OwnedFd]| v.iter().map(|f| f.as_raw_fd()).collect();
        Idmapped { base: self.base, lowers: raw(&self.lowers), volumes: raw(&self.volumes) }
    }
}

/// What the mount plan needs of [`Trees`]: the range and the fds' numbers.
pub(super) struct Idmapped {
    pub(super) base: u32,
    pub(super) lowers: Vec<RawFd>,
    pub(super) volumes: Vec<RawFd>,
}
