//! Golden pools from a gVisor checkpoint (docs/warm-pools.md): one runsc
//! checkpoint image, kept under `golden/<key>/`, restored into each new
//! member. A member gets its own dir, cgroups, rootfs (its writable layer
//! seeded beforehand by the engine) and bundle exactly as a launch does;
//! only `runsc create` + `start` is replaced by `runsc restore` of the shared
//! image, then the restored agent (quiesced when the source was
//! checkpointed) gets its socket back as after any restore.
//!
//! The image is read by runsc only; several members restore it at once.
use super::checkpoint::{remove_dir, IMAGE_DIR};
use super::{launched, OciRuntime};
use crate::{LaunchTiming, Launched, RuntimeError};
use ember_sys::beneath::PinnedDir;
use ember_types::{SandboxId, SandboxSpec};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Instant;

/// Under the class's dir: one image per golden pool.
const GOLDEN_DIR: &str = "golden";
/// What `runsc checkpoint` writes (release-20221219 writes the first only;
/// later releases split the memory pages out).
const IMAGE_FILES: [&str; 3] = ["checkpoint.img", "pages_meta.img", "pages.img"];
/// Beyond the sandbox's memory limit, what an image may hold (the Sentry's
/// own state): a copy larger than limit + this is refused, not written on.
const IMAGE_OVERHEAD: u64 = 256 << 20;

impl OciRuntime {
    fn golden_path(&self, key: &str) -> Result<PathBuf, RuntimeError> {
        // A key is a snapshot id: one plain name, never a path.
        SandboxId::try_from(key.to_string()).map_err(|_| RuntimeError::Prepare {
            what: "golden image key",
            path: PathBuf::from(key),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a plain name"),
        })?;
        Ok(self.base.join(GOLDEN_DIR).join(key))
    }

    /// Copies `src`'s checkpoint image to `golden/<key>/`, through pinned
    /// dirs (no symlink followed on either side), each file bounded by the
    /// source's memory limit plus the Sentry's overhead.
    pub(super) fn save_golden(&self, src: &SandboxId, spec: &SandboxSpec, key: &str) -> Result<(), RuntimeError> {
        self.check_checkpoint_class()?;
        let dest = self.golden_path(key)?;
        remove_dir(&dest)?;
        let from = PinnedDir::open(&self.dir(src.as_str()))?.open_dir(IMAGE_DIR)?;
        let to = PinnedDir::open(&self.base)?.ensure_dir(GOLDEN_DIR, 0o700)?.ensure_dir(key, 0o700)?;
        let max = spec.resources.memory_bytes.saturating_add(IMAGE_OVERHEAD);
        let io = |what, source| RuntimeError::Prepare { what, path: dest.clone(), source };
        let mut copied = 0;
        for name in IMAGE_FILES {
            let mut f = match from.open_file(name) {
                Ok(f) => f,
                Err(e) if e.source.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            };
            let mut out = to.create_file(name, 0o600)?;
            let n = std::io::copy(&mut (&mut f).take(max + 1), &mut out).map_err(|e| io("copy golden image", e))?;
            if n > max {
                let _ = remove_dir(&dest);
                let e = std::io::Error::new(std::io::ErrorKind::FileTooLarge, format!("{name} is over {max} bytes"));
                return Err(io("copy golden image", e));
            }
            out.flush().and_then(|()| out.sync_all()).map_err(|e| io("sync golden image", e))?;
            copied += 1;
        }
        if copied == 0 {
            return Err(RuntimeError::Gone { id: src.clone(), message: "no checkpoint image on disk".into() });
        }
        Ok(())
    }

    /// A new member: dir, cgroups, rootfs and bundle as a launch makes them,
    /// then `runsc restore` of golden image `key` and the agent woken.
    pub(super) fn launch_golden(
        &self,
        id: &SandboxId,
        spec: &SandboxSpec,
        key: &str,
    ) -> Result<Launched, RuntimeError> {
        self.check_checkpoint_class()?;
        let image = self.golden_path(key)?;
        if !PinnedDir::open(&image).and_then(|d| d.kind("checkpoint.img")).is_ok_and(|k| k.is_some()) {
            return Err(RuntimeError::Gone { id: id.clone(), message: format!("golden image {key} is not on disk") });
        }
        let t0 = Instant::now();
        let dir = self.make_dir(id)?;
        self.cgroups.create(id.as_str(), &self.limits(spec)).map_err(Self::cg_err(id))?;
        let oom = self.oom.watch(&*self.cgroups, id.as_str()).map_err(Self::cg_err(id))?;
        let t_cg = t0.elapsed();
        // runsc keeps the storage range: no user namespace fd to hold.
        let (bundle_dir, sock_dir, _userns) = self.bundle(id, spec, &dir)?;
        let sock = sock_dir.join("agent.sock");
        let (pid, pidfd) = self.restore_from(id, &image, &bundle_dir, &dir)?;
        let t_spawn = t0.elapsed();
        self.unquiesce(id, &dir, Some(&pidfd))?;
        Ok(launched(pid, pidfd, sock, oom, LaunchTiming::from_marks(t_cg, t_spawn, t0.elapsed())))
    }

    pub(super) fn drop_golden(&self, key: &str) -> Result<(), RuntimeError> {
        remove_dir(&self.golden_path(key)?)
    }
}
