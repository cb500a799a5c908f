//! Idle auto-pause (`autoPause: {afterSeconds}` on create): a Running
//! sandbox with no proxy traffic (exec, files, code, ports: every call that
//! reaches its agent) for that long is frozen by its monitor, with the same
//! cgroup freeze as a user's pause, and thawed by the next proxy call before
//! that call goes through. Reads (`GET`, lists) are not traffic: inspecting a
//! sandbox neither keeps it awake nor wakes it. The TTL keeps running while
//! it is paused. docs/auto-pause.md.
use crate::record::{now_ms, SandboxRecord};
use crate::EngineError;
use ember_types::SandboxState;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

/// A sandbox's last proxy call, and whether the freeze it is in is ours.
#[derive(Debug)]
pub(crate) struct Idle {
    last_ms: AtomicI64,
    paused: AtomicBool,
}

impl Default for Idle {
    fn default() -> Self {
        Idle { last_ms: AtomicI64::new(now_ms()), paused: AtomicBool::new(false) }
    }
}

impl Idle {
    /// A proxy call: returns whether the sandbox was auto-paused (so the
    /// caller resumes it). Stores the time first: a monitor about to pause
    /// sees it (`claim_pause`) and stands down.
    pub fn touch(&self) -> bool {
        self.last_ms.store(now_ms(), Ordering::SeqCst);
        self.paused.swap(false, Ordering::SeqCst)
    }

    /// The monitor's side: marks the coming freeze as ours, unless a call
    /// came in the meantime. `false`: leave it running.
    pub fn claim_pause(&self, rec: &SandboxRecord) -> bool {
        self.paused.store(true, Ordering::SeqCst);
        let due = idle_deadline_ms(rec, self).is_some_and(|at| at <= now_ms());
        if !due {
            self.paused.store(false, Ordering::SeqCst);
        }
        due
    }
}

/// When a Running sandbox with auto-pause falls idle (ms since the epoch):
/// its last proxy call or its claim/creation, whichever is later.
fn idle_deadline_ms(rec: &SandboxRecord, idle: &Idle) -> Option<i64> {
    let secs = rec.spec.auto_pause_secs.filter(|_| rec.state == SandboxState::Running)?;
    let since = idle.last_ms.load(Ordering::SeqCst).max(rec.created_at_ms);
    Some(since.saturating_add((secs as i64).saturating_mul(1000)))
}

/// The monitor's next look, as a tokio instant (none: nothing to watch).
pub(crate) fn deadline(rec: &SandboxRecord, idle: &Idle) -> Option<tokio::time::Instant> {
    let at = idle_deadline_ms(rec, idle)?;
    Some(tokio::time::Instant::now() + Duration::from_millis((at - now_ms()).max(0) as u64))
}

/// Whether this idle pause checkpoints the sandbox instead of freezing it:
/// asked for (`autoPause.checkpoint`), a class that can (runsc), nothing a
/// checkpoint may not keep (workspaces, secrets: `Sandboxes::checkpoint`'s
/// refusals), and never restored before: on this gVisor a sandbox's first
/// restore is the reliable one (docs/gvisor-checkpoint.md).
pub(crate) fn by_checkpoint(rec: &SandboxRecord, class_can: bool) -> bool {
    rec.spec.auto_pause_checkpoint
        && class_can
        && rec.workspaces.is_empty()
        && rec.spec.secret_names.is_empty()
        && rec.restores == 0
}

/// `afterSeconds`: at least 1, at most the longest timeout.
pub(crate) fn check(secs: Option<u64>) -> Result<Option<u64>, EngineError> {
    match secs {
        Some(s) if !(1..=ember_types::limits::MAX_TIMEOUT_SECS).contains(&s) => Err(EngineError::invalid(
            "autoPause.afterSeconds",
            format!("{s}: from 1 to {}", ember_types::limits::MAX_TIMEOUT_SECS),
        )),
        s => Ok(s),
    }
}
