//! One monitor task per published sandbox. While the sandbox lives it waits
//! for the init to exit, the OOM killer to fire, the TTL to run out, or a
//! command; after the end it stays to answer commands (metadata, removal)
//! until the record is dropped. Checkpoint and restore go through it too, so
//! the Sentry's exit after a checkpoint is not taken for the sandbox's end and
//! the restored init's pidfd replaces the old one.
use super::Sandboxes;
use super::{Command, Entry, Msg};
use crate::record::now_ms;
use ember_runtime::{ExitKind, Launched};
use ember_types::TerminationReason;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

pub(super) fn spawn(engine: Arc<Sandboxes>, entry: Arc<Entry>, launched: Option<Launched>, rx: mpsc::Receiver<Msg>) {
    tokio::spawn(async move {
        let id = entry.snapshot().id;
        let live = match launched.map(|l| Live::new(l, &engine, &entry)).transpose() {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(sandbox = %id, error = %e, "sandbox monitor cannot watch the init");
                None
            }
        };
        Monitor { engine, entry, live }.run(rx).await;
    });
}

/// The running init's descriptors; none while the sandbox is checkpointed
/// or after its end.
pub(super) struct Live {
    pub pidfd: AsyncFd<OwnedFd>,
    oom: Option<super::oom::OomWatch>,
}

impl Live {
    pub fn new(launched: Launched, engine: &Sandboxes, entry: &Entry) -> std::io::Result<Live> {
        let rec = entry.snapshot();
        let rt = engine.rt(&rec.spec.runtime_class);
        let oom = launched.oom.map(|source| engine.oom.watch(source, rec.id, rt)).transpose()?;
        Ok(Live { pidfd: async_fd(launched.pidfd)?, oom })
    }
}

pub(super) struct Monitor {
    /// The service (its runtimes, store, workspaces, network).
    pub engine: Arc<Sandboxes>,
    pub entry: Arc<Entry>,
    pub live: Option<Live>,
}

impl Monitor {
    async fn run(mut self, mut rx: mpsc::Receiver<Msg>) {
        loop {
            let rec = self.entry.snapshot();
            let ended = rec.lifecycle.is_ended();
            let deadline = rec.expires_at_ms.filter(|_| !ended).map(|ms| {
                let left = (ms - now_ms()).max(0) as u64;
                tokio::time::Instant::now() + Duration::from_millis(left)
            });
            let reason = tokio::select! {
                r = exited(self.live.as_ref()) => match r {
                    Ok(()) => Some(self.exit_reason().await),
                    Err(e) => Some(TerminationReason::RuntimeError(format!("watching the init: {e}"))),
                },
                // Only once the sandbox's kill counter moved (`oom.rs`).
                _ = oom_fired(self.live.as_ref().and_then(|l| l.oom.as_ref())) => Some(TerminationReason::OOMKilled),
                _ = sleep_opt(deadline) => {
                    self.entry.snapshot().expires_at_ms.filter(|ms| *ms <= now_ms()).map(|_| TerminationReason::Expired)
                }
                _ = sleep_opt(crate::autopause::deadline(&rec, &self.entry.idle)) => {
                    self.auto_pause().await;
                    None
                }
                m = rx.recv() => match m {
                    Some(Msg { cmd, reply }) => {
                        let res = self.handle(cmd).await;
                        let _ = reply.send(res);
                        None
                    }
                    // The engine is gone: nothing will ask again.
                    None if ended => return,
                    None => Some(TerminationReason::Killed),
                },
            };
            if let Some(reason) = reason {
                self.end(reason).await;
            }
            if self.entry.snapshot().lifecycle == ember_types::lifecycle::Lifecycle::Removing {
                self.forget();
                return;
            }
        }
    }

    async fn handle(&mut self, cmd: Command) -> Result<crate::SandboxRecord, crate::EngineError> {
        match cmd {
            Command::Pause => self.pause().await,
            Command::Resume => self.resume().await,
            Command::Checkpoint => self.checkpoint().await,
            Command::SnapshotFreeze => self.snapshot_freeze().await,
            Command::SnapshotThaw => self.snapshot_thaw().await,
            Command::Claim(patch) => self.claim(*patch).await,
            Command::Edit(edit) => self.edit(edit),
            Command::Stop(reason) => self.stop(reason).await,
            Command::Remove => self.remove().await,
        }
    }

    /// Idle long enough without proxy traffic: the user's freeze, marked
    /// ours so that the next proxy call thaws it (`crate::autopause`).
    async fn auto_pause(&mut self) {
        let rec = self.entry.snapshot();
        if !self.entry.idle.claim_pause(&rec) {
            return;
        }
        let class_can = self.engine.rt(&rec.spec.runtime_class).can_checkpoint();
        if crate::autopause::by_checkpoint(&rec, class_can) {
            match self.checkpoint().await {
                Ok(_) => return,
                // Refused (an open stream, say), or failed with the sandbox
                // still running: the freezer's pause instead.
                Err(e) => tracing::info!(sandbox = %rec.id, error = %e, "auto-pause by checkpoint failed; freezing"),
            }
        }
        if let Err(e) = self.pause().await {
            // Not now (a snapshot's freeze, say): try again a whole period later.
            self.entry.idle.touch();
            tracing::debug!(sandbox = %self.entry.snapshot().id, error = %e, "auto-pause refused");
        }
    }

    /// Why the init exited on its own. A class that keeps the agent's own
    /// exit code (the OCI classes' exit file) is asked first: its init is the
    /// runtime's process (runsc's Sentry), which the daemon, as subreaper, may
    /// have reaped with a status of its own. Then the init's wait status
    /// (native: the agent itself).
    pub(super) async fn exit_reason(&self) -> TerminationReason {
        if self.engine.oom_kills(&self.entry).await > 0 {
            return TerminationReason::OOMKilled;
        }
        let rec = self.entry.snapshot();
        let (rt, id) = (self.engine.rt(&rec.spec.runtime_class), rec.id);
        if let Ok(Some(c)) = tokio::task::spawn_blocking(move || rt.exit_code(&id)).await {
            return TerminationReason::Exited(c);
        }
        match self.live.as_ref().and_then(|l| ember_runtime::try_wait(l.pidfd.get_ref())) {
            Some(ExitKind::Code(c)) => TerminationReason::Exited(c),
            // Killed, or not ours to read (an OCI init reaped by its parent).
            _ => TerminationReason::Killed,
        }
    }
}

/// Resolves when the init exits; never while there is none.
async fn exited(live: Option<&Live>) -> std::io::Result<()> {
    match live {
        Some(l) => {
            let mut guard = l.pidfd.readable().await?;
            guard.clear_ready();
            Ok(())
        }
        None => std::future::pending().await,
    }
}

/// `AsyncFd::new` is deprecated in favour of the unsafe `register`, whose
/// contract (the fd is owned and stays valid) an `OwnedFd` already guarantees;
/// this crate forbids `unsafe`, so it keeps the safe constructor.
#[allow(deprecated, reason = "OwnedFd gives the I/O safety register() asks for")]
fn async_fd(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::new(fd)
}

async fn oom_fired(oom: Option<&super::oom::OomWatch>) {
    match oom {
        Some(w) => w.fired().await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl Sandboxes {
    async fn oom_kills(&self, entry: &Entry) -> u64 {
        let rec = entry.snapshot();
        let (rt, id) = (self.rt(&rec.spec.runtime_class), rec.id);
        tokio::task::spawn_blocking(move || rt.oom_kills(&id).unwrap_or(0)).await.unwrap_or(0)
    }
}
