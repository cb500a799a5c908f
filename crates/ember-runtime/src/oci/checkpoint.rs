//! gVisor checkpoint / restore of a sandbox (runsc only; docs/gvisor-checkpoint.md).
//!
//! gVisor cannot save a socket bound to a host endpoint, and the agent's
//! listener is one (`--host-uds=create`). So a checkpoint is: ask the agent to
//! quiesce (`POST /ember/v1/quiesce`: it drains, drops its listener and writes
//! `quiesced` beside its socket), remove the stale socket path on the host
//! (gVisor refuses to unlink it from inside), `runsc checkpoint`, `runsc
//! delete` (frees the id for the restore; ember's cgroups and rootfs mounts are
//! ember's and stay). A restore is `runsc restore` from the same bundle, then
//! `resume` beside the socket: the agent binds again and the daemon waits for
//! `/ping` as at launch. The image lives in the sandbox's dir, so removing the
//! sandbox removes it.
use super::{OciClass, OciRuntime};
use crate::{LaunchTiming, Launched, RuntimeError};
use ember_sys::beneath::{FileType, PinnedDir};
use ember_types::{SandboxId, SandboxSpec};
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

/// The checkpoint image, in the sandbox's dir.
pub const IMAGE_DIR: &str = "checkpoint";
/// Written by the agent once its listener is gone (the agent's `quiesce::QUIESCED`).
const QUIESCED: &str = "quiesced";
/// Written by the daemon when the agent may listen again (the agent's `quiesce::RESUME`).
const RESUME: &str = "resume";
/// How long the agent gets to drain its connections and let go of its socket.
const QUIESCE_TIMEOUT: Duration = Duration::from_secs(10);

impl OciRuntime {
    pub(super) fn check_checkpoint_class(&self) -> Result<(), RuntimeError> {
        if self.cfg.class != OciClass::Runsc {
            return Err(RuntimeError::Unsupported { class: self.cfg.class.name(), what: "checkpoint and restore" });
        }
        Ok(())
    }

    pub(super) fn checkpoint_sandbox(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        self.check_checkpoint_class()?;
        let dir = self.dir(id.as_str());
        let (sock_dir, image) = (dir.join("sock"), dir.join(IMAGE_DIR));
        let sock = sock_dir.join("agent.sock");
        remove_dir(&image)?;
        std::fs::create_dir_all(&image).map_err(|source| RuntimeError::Prepare {
            what: "checkpoint dir",
            path: image.clone(),
            source,
        })?;
        for f in [QUIESCED, RESUME] {
            let _ = std::fs::remove_file(sock_dir.join(f));
        }
        self.quiesce(id, &sock)?;
        // The listener is gone inside; its host path is left for us to remove.
        let _ = std::fs::remove_file(&sock);
        let _ = std::fs::remove_file(sock_dir.join(QUIESCED));
        if let Err(e) = self.cli.checkpoint(id.as_str(), &image) {
            // A failed checkpoint usually ends the Sentry; if it did not, give
            // the agent its socket back so the sandbox stays usable.
            if self.cli.state(id.as_str()).is_ok_and(|s| s.status == "running") {
                let _ = self.unquiesce(id, &dir, None);
            }
            let _ = remove_dir(&image);
            return Err(RuntimeError::Oci { id: id.clone(), source: e });
        }
        // Stopped now; the id must be free for `runsc restore`.
        self.cli.delete(id.as_str()).map_err(Self::oci_err(id))
    }

    /// Asks the agent to let go of its socket and waits until it has.
    fn quiesce(&self, id: &SandboxId, sock: &Path) -> Result<(), RuntimeError> {
        let busy = |message: String| RuntimeError::Busy { id: id.clone(), message };
        match crate::post_agent(sock, "/ember/v1/quiesce", Duration::from_secs(5)) {
            Ok(reply) if reply.is_success() => {}
            Ok(reply) if reply.status == 409 => return Err(busy(reply.message())),
            Ok(reply) => return Err(busy(format!("the agent answered {}: {}", reply.status, reply.message()))),
            Err(e) => return Err(busy(format!("the agent did not answer the quiesce: {}", e.report()))),
        }
        let sock_dir = sock.parent().unwrap_or(Path::new("/"));
        let deadline = Instant::now() + QUIESCE_TIMEOUT;
        while !is_regular(sock_dir, QUIESCED) {
            if Instant::now() > deadline {
                let _ = self.unquiesce(id, sock_dir.parent().unwrap_or(Path::new("/")), None);
                return Err(busy("connections to the agent stayed open; checkpoint called off".into()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Lets a quiesced agent listen again and waits for its `/ping` (or for
    /// `init`, the container's init if the caller holds its pidfd, to exit).
    pub(super) fn unquiesce(&self, id: &SandboxId, dir: &Path, init: Option<&OwnedFd>) -> Result<(), RuntimeError> {
        let sock_dir = dir.join("sock");
        let pinned = PinnedDir::open(&sock_dir)?;
        let _ = pinned.remove_file("agent.sock");
        write_resume(&pinned)?;
        self.wait_ready(id, &sock_dir.join("agent.sock"), init, None)
    }

    pub(super) fn restore_sandbox(&self, id: &SandboxId, spec: &SandboxSpec) -> Result<Launched, RuntimeError> {
        self.check_checkpoint_class()?;
        let t0 = Instant::now();
        let dir = self.dir(id.as_str());
        let image = dir.join(IMAGE_DIR);
        if !image.join("checkpoint.img").is_file() {
            return Err(RuntimeError::Gone { id: id.clone(), message: "no checkpoint image on disk".into() });
        }
        // ember made the cgroups and runsc only joined them, so they survive
        // the checkpoint; recreated with the same limits if anything removed them.
        if !self.cgroups.exists(id.as_str()) {
            self.cgroups.create(id.as_str(), &self.limits(spec)).map_err(Self::cg_err(id))?;
        }
        let oom = self.oom.watch(&*self.cgroups, id.as_str()).map_err(Self::cg_err(id))?;
        let t_cg = t0.elapsed();
        // The bundle binds `<rootfs>/tmp`, resolved on the host by runsc again;
        // the layer was the sandbox's to write while it ran.
        crate::native::rootfs::check_layer_root(&dir.join("mnt/upper"), &[])?;
        let sock = dir.join("sock/agent.sock");
        let _ = std::fs::remove_file(&sock);
        let (pid, pidfd) = self.restore_from(id, &image, &dir.join("bundle"), &dir)?;
        let t_spawn = t0.elapsed();
        self.unquiesce(id, &dir, Some(&pidfd))?;
        Ok(super::launched(pid, pidfd, sock, oom, LaunchTiming::from_marks(t_cg, t_spawn, t0.elapsed())))
    }

    /// `runsc restore` of `image` into `bundle`, and the restored sandbox
    /// process's pid (from its `--pid-file`, not a `runsc state`: ~15 ms a
    /// run) and pidfd, the process handed to the daemon's reaper. One that
    /// already exited (a zombie the daemon, its subreaper, has not reaped)
    /// is a failed restore.
    pub(super) fn restore_from(
        &self,
        id: &SandboxId,
        image: &Path,
        bundle: &Path,
        dir: &Path,
    ) -> Result<(i32, OwnedFd), RuntimeError> {
        let (log, pid_file) = (dir.join("agent.log"), dir.join(super::PID_FILE));
        let _ = std::fs::remove_file(&pid_file);
        let restore = || self.cli.restore(id.as_str(), image, bundle, &log, &pid_file);
        let pid = match restore() {
            Ok(pid) => pid,
            // A restore a daemon crash interrupted may have left a container
            // under this id: removed, then tried once more (not removed
            // before every restore: a run of runsc is ~15 ms).
            Err(_) => {
                let _ = self.cli.delete(id.as_str());
                restore().map_err(Self::oci_err(id))?
            }
        };
        let pidfd = ember_sys::pidfd::pidfd_open(pid)?;
        self.adopt_container_procs(id, pid);
        if ember_sys::pidfd::wait_exited(&pidfd, Duration::ZERO).unwrap_or(false) {
            let message = format!("restored, then stopped (pid {pid}); log: {}", log_tail(dir));
            return Err(RuntimeError::Gone { id: id.clone(), message });
        }
        Ok((pid, pidfd))
    }

    /// At adoption: an agent a crashed daemon left quiesced (it waits for
    /// `resume` with no listener) gets its socket back.
    pub(super) fn wake_quiesced_agent(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        let dir = self.dir(id.as_str());
        if self.cfg.class != OciClass::Runsc || !is_regular(&dir.join("sock"), QUIESCED) {
            return Ok(());
        }
        let _ = std::fs::remove_file(dir.join("sock").join(QUIESCED));
        // The file is in a dir the sandbox can write: trust a live agent over it.
        if crate::ping_agent(&dir.join("sock/agent.sock"), Duration::from_secs(2)).is_ok() {
            return Ok(());
        }
        self.unquiesce(id, &dir, None)
    }

    pub(super) fn drop_checkpoint_image(&self, id: &SandboxId) -> Result<(), RuntimeError> {
        remove_dir(&self.dir(id.as_str()).join(IMAGE_DIR))
    }
}

/// The last 1,500 bytes of a sandbox's `agent.log` (the agent's and runsc's
/// output, which the workload can fill), for error messages: only those
/// bytes are read.
pub(super) fn log_tail(dir: &Path) -> String {
    const TAIL: u64 = 1500;
    let Ok(mut f) = std::fs::File::open(dir.join("agent.log")) else { return String::new() };
    let len = f.metadata().map_or(0, |m| m.len());
    let mut buf = Vec::new();
    if f.seek(SeekFrom::Start(len.saturating_sub(TAIL))).is_err() || f.take(TAIL).read_to_end(&mut buf).is_err() {
        return String::new();
    }
    String::from_utf8_lossy(&buf).trim().to_string()
}

/// Whether `name` in the socket dir is a regular file (a symlink the sandbox
/// planted there is not followed, and does not count).
fn is_regular(sock_dir: &Path, name: &str) -> bool {
    let kind = PinnedDir::open(sock_dir).and_then(|d| d.kind(name));
    matches!(kind, Ok(Some(FileType::RegularFile)))
}

/// Writes `resume` in the socket dir, which root inside the sandbox can write:
/// whatever is there (a symlink to a host file, re-planted in a loop) is
/// unlinked, never followed, and the file created `O_EXCL`. A sandbox that
/// keeps winning the race between the two only keeps its own agent asleep.
fn write_resume(sock_dir: &PinnedDir) -> Result<(), RuntimeError> {
    let mut tries = 0;
    loop {
        match sock_dir.replace_file(RESUME, b"1\n", 0o644) {
            Err(e) if e.source.kind() == std::io::ErrorKind::AlreadyExists && tries < 16 => tries += 1,
            res => return Ok(res?),
        }
    }
}

pub(super) fn remove_dir(path: &Path) -> Result<(), RuntimeError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(RuntimeError::Prepare { what: "remove checkpoint dir", path: path.to_path_buf(), source: e })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::log_tail;
    use std::io::Write;

    fn peak_rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// A workload can fill its agent log; an error message reads its end only.
    #[test]
    fn only_the_tail_of_a_large_agent_log_is_read() {
        let dir = std::env::temp_dir().join(format!("ember-logtail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = std::fs::File::create(dir.join("agent.log")).unwrap();
        f.set_len(256 << 20).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(dir.join("agent.log")).unwrap();
        f.write_all(b"the last line\n").unwrap();
        let before = peak_rss_kib();
        let tail = log_tail(&dir);
        let grown = peak_rss_kib().saturating_sub(before);
        assert!(tail.ends_with("the last line") && tail.len() <= 1500, "{:?}", &tail[tail.len().saturating_sub(40)..]);
        assert!(grown < 64 << 10, "peak RSS grew by {grown} KiB reading the tail of a 256 MiB log");
        assert_eq!(log_tail(&dir.join("none")), "");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
