//! Everything an OCI runtime needs on disk before `<rt> create`: the rootfs
//! (tmpfs + overlay over the template's lowers, [`super::rootfs`]), the socket
//! dir, and `config.json` ([`super::bundle`]). Shared by [`super::OciRuntime`]
//! and by `ember bench create`'s crun reference, so the reference does exactly
//! the work a sandbox of an OCI class gets.
use super::{bundle, rootfs, OciClass};
use crate::RuntimeError;
use ember_sys::beneath::PinnedDir;
use ember_types::{SandboxId, SandboxSpec};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Inputs of one sandbox's bundle, under its own `dir`.
pub struct BundlePlan<'a> {
    pub id: &'a SandboxId,
    pub spec: &'a SandboxSpec,
    pub dir: &'a Path,
    /// The `host` template's layer (used when the spec has no lower dirs).
    pub host_template: &'a Path,
    pub agent: &'a Path,
    /// `/<group>/<id>`, relative to each cgroup hierarchy's root.
    pub cgroups_path: PathBuf,
    /// The host id of the sandbox's root: the first of its id range.
    pub uid_base: u32,
    /// In a range of its own, the lower layers and the volumes as detached
    /// trees idmapped onto it, in the order of `spec.lower_dirs` (or the host
    /// template) and `spec.volumes`; empty: used as they are.
    pub lower_trees: &'a [OwnedFd],
    pub volume_trees: &'a [OwnedFd],
    /// A user namespace for the runtime to join, held by the daemon until
    /// `<rt> create` has joined it ([`ember_sys::idmap::userns_fd_owned`]).
    pub userns: Option<BorrowedFd<'a>>,
    pub class: OciClass,
    pub workspace_slot: Option<&'a Path>,
    /// The agent gets its listening socket as fd 3 (`<rt> create
    /// --preserve-fds 1`), as the native class's agent does, instead of binding
    /// `agent.sock` itself. ember's classes cannot: an OCI runtime started by
    /// the daemon would hold the daemon's fd, and runsc cannot pass one.
    pub listen_fd: bool,
    /// Whether the host runs the unified cgroup v2 hierarchy (crun refuses a
    /// swappiness there).
    pub cgroup_v2: bool,
}

/// What [`prepare_bundle`] made.
pub struct PreparedBundle {
    pub bundle_dir: PathBuf,
    /// The host dir bound at [`bundle::SOCKET_DIR`].
    pub socket_dir: PathBuf,
}

/// Assembles the rootfs and writes `<dir>/bundle/config.json`.
pub fn prepare_bundle(p: &BundlePlan<'_>) -> Result<PreparedBundle, RuntimeError> {
    let (id, spec) = (p.id, p.spec);
    let hostname = format!("sbx-{}", id.short());
    // An image brings its own /usr (bundle.rs binds the host's only for `host`).
    crate::native::rootfs::check_image_root(&spec.lower_dirs)?;
    let lowers = if spec.lower_dirs.is_empty() { vec![p.host_template.to_path_buf()] } else { spec.lower_dirs.clone() };
    let root = rootfs::assemble(p.dir, &lowers, p.lower_trees, spec.resources.disk_bytes, p.uid_base, &hostname)?;
    let volume_sources = match p.volume_trees.is_empty() {
        true => spec.volumes.iter().map(|v| v.host_path.clone()).collect(),
        false => rootfs::attach_trees(&p.dir.join("mnt"), "v", p.volume_trees)?,
    };
    // The sandbox writes its socket dir: made and chowned from the sandbox
    // dir's fd, never following what may already be there.
    let sandbox = PinnedDir::open(p.dir)?;
    let socket_dir = p.dir.join("sock");
    sandbox.ensure_dir("sock", 0o755)?.chown("", p.uid_base, p.uid_base)?;
    let bundle_dir = sandbox.ensure_dir("bundle", 0o711)?;
    let env = crate::native::agent_env(spec, &hostname)
        .into_iter()
        .map(|c| c.to_string_lossy().into_owned())
        .filter(|e| p.listen_fd || !e.starts_with("EMBER_AGENT_LISTEN_FD="))
        .collect();
    let config = bundle::build(&bundle::BundleInputs {
        id,
        spec,
        rootfs: &root,
        socket_dir: &socket_dir,
        agent: p.agent,
        cgroups_path: p.cgroups_path.clone(),
        uid_base: p.uid_base,
        env,
        user_namespace: true,
        // The runtime opens it through the daemon's own fd table.
        user_namespace_path: p.userns.map(|fd| format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd()).into()),
        inherit_rlimits: p.class == OciClass::Runc,
        errno_ret: p.class != OciClass::Runsc,
        pids_limit: p.class.host_pids(spec.resources.pids),
        workspace_slot: p.workspace_slot,
        volume_sources,
        cgroup_v2: p.cgroup_v2,
    })?;
    let json = serde_json::to_vec_pretty(&config)
        .map_err(|e| bundle::BundleError { id: id.to_string(), message: e.to_string() })?;
    // 0600: it holds the sandbox's env.
    bundle_dir.replace_file("config.json", &json, 0o600)?;
    Ok(PreparedBundle { bundle_dir: bundle_dir.path().to_path_buf(), socket_dir })
}
