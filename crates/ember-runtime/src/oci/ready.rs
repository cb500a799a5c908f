//! Waiting for a launched or restored container's agent to answer.
use super::{checkpoint, read_exit_file, OciRuntime, EXIT_FILE};
use crate::RuntimeError;
use ember_types::{SandboxId, SandboxSpec};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::{Duration, Instant};

impl OciRuntime {
    /// Polls until the agent has bound its socket and answers `/ping`, or the
    /// container stopped, or the deadline passed. The container has stopped
    /// when its init has exited (for runsc the sandbox process, which exits
    /// with its root container), seen on the init's pidfd, not by running
    /// `<rt> state` each round (~15 ms for runsc, longer than the wait).
    /// Without the pidfd (a failed checkpoint's resume) `state` says. At launch
    /// (`spec`) a container that stopped early may be a sandbox that ran and
    /// ended ([`ended_before_ready`]); after a restore the agent must answer.
    pub(super) fn wait_ready(
        &self,
        id: &SandboxId,
        sock: &Path,
        init: Option<&OwnedFd>,
        spec: Option<&SandboxSpec>,
    ) -> Result<(), RuntimeError> {
        let deadline = Instant::now() + self.cfg.ready_timeout;
        let mut last = String::from("socket not created");
        while Instant::now() < deadline {
            if sock.exists() {
                match crate::ping_agent(sock, Duration::from_secs(2)) {
                    Ok(()) => return Ok(()),
                    Err(e) => last = e,
                }
            }
            let stopped = match init {
                Some(fd) => ember_sys::pidfd::wait_exited(fd, Duration::from_millis(2)).unwrap_or(false),
                None => {
                    std::thread::sleep(Duration::from_millis(2));
                    self.cli.state(id.as_str()).is_ok_and(|s| s.status == "stopped")
                }
            };
            if stopped {
                let exit_file = sock.with_file_name(EXIT_FILE);
                if let (Some(init), Some(spec)) = (init, spec) {
                    if ended_before_ready(init, spec, &exit_file) {
                        return Ok(());
                    }
                }
                last = "the container stopped".into();
                break;
            }
        }
        let log = checkpoint::log_tail(&self.dir(id.as_str()));
        Err(RuntimeError::AgentNotReady { id: id.clone(), message: format!("{last}; agent log: {log}") })
    }
}

/// A stopped container whose agent ran an entrypoint and left its exit code is
/// a launched sandbox that already ended (as `native::ended_before_ready`): the
/// monitor finds the pidfd readable and records `Exited(n)`. The init (for
/// runsc the Sentry, which may still be writing the file through its gofer)
/// is waited for first, up to 2 s. Without an entrypoint, or without an exit
/// code, it stays a readiness failure.
fn ended_before_ready(init: &OwnedFd, spec: &SandboxSpec, exit_file: &Path) -> bool {
    !spec.entrypoint.is_empty()
        && ember_sys::pidfd::wait_exited(init, Duration::from_secs(2)).unwrap_or(false)
        && read_exit_file(exit_file).is_some()
}
