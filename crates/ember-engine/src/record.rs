//! A sandbox's persisted record: its spec, where it is in its lifecycle, and the
//! handles a restarted daemon needs to find it again.
use ember_types::lifecycle::{Action, Effect, Holds, Lifecycle, LifecycleError};
use ember_types::{SandboxId, SandboxSpec, SandboxState, TerminationReason};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRecord {
    /// "cold" or "warm".
    pub kind: String,
    /// Server-side request-to-ready time.
    pub micros: u64,
    pub phases: BTreeMap<String, u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub id: SandboxId,
    pub spec: SandboxSpec,
    pub state: SandboxState,
    pub reason: Option<TerminationReason>,
    pub message: Option<String>,
    pub image_uri: Option<String>,
    pub created_at_ms: i64,
    pub expires_at_ms: Option<i64>,
    pub last_transition_ms: i64,
    /// Host pid of the sandbox init, and its start time: together they identify
    /// the process across daemon restarts (a pid alone can be reused).
    pub pid: Option<i32>,
    pub start_time: Option<u64>,
    pub launch: Option<LaunchRecord>,
    /// Where the sandbox is in its lifecycle; `state` is what it shows.
    /// Changed only by the sandbox's monitor, through [`SandboxRecord::apply`].
    #[serde(default = "pending")]
    pub lifecycle: Lifecycle,
    /// Flags of records written before `lifecycle` existed; read once by
    /// [`SandboxRecord::migrate`], never written.
    #[serde(flatten, skip_serializing)]
    pub(crate) legacy: LegacyFlags,
    /// The egress policy as last set (create, then the egress port's
    /// `/policy`). Recorded and reported; not enforced yet.
    #[serde(default)]
    pub network_policy: Option<ember_types::api::NetworkPolicy>,
    /// Lifecycle events, oldest first, at most [`MAX_EVENTS`]: (unix ms, text).
    #[serde(default)]
    pub events: Vec<(i64, String)>,
    /// The warm pool that started this sandbox, if any.
    #[serde(default)]
    pub pool: Option<String>,
    /// Workspaces mounted in the sandbox, with their lease epochs.
    #[serde(default)]
    pub workspaces: Vec<crate::workspaces::MountedWorkspace>,
    /// The network slot the sandbox joined (egress networking), recorded
    /// before launch so a restart can re-adopt or reclaim it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_slot: Option<u32>,
    /// The sandbox snapshot this sandbox was restored from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// Restores from a gVisor checkpoint so far: only the first is reliable
    /// on the gVisor here, so only the first auto-pause may checkpoint.
    #[serde(default)]
    pub restores: u32,
}

pub const MAX_EVENTS: usize = 200;

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn pending() -> Lifecycle {
    Lifecycle::Pending
}

/// The flags that stood for states before [`Lifecycle`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct LegacyFlags {
    #[serde(default)]
    deleting: bool,
    #[serde(default)]
    pooled: bool,
    #[serde(default)]
    snapshot_freeze: bool,
    #[serde(default)]
    checkpointed: bool,
}

impl SandboxRecord {
    /// Applies `action`: the lifecycle moves, the wire state follows, and an
    /// event is appended. Refused moves change nothing. The returned effect is
    /// the caller's to do (the monitor's: only it calls this).
    #[must_use = "the step's effect must be done and the record persisted"]
    pub(crate) fn apply(
        &mut self,
        action: Action,
        reason: Option<TerminationReason>,
    ) -> Result<Option<Effect>, LifecycleError> {
        let step = self.lifecycle.apply(action)?;
        let to = step.next.visible();
        self.lifecycle = step.next;
        if reason.is_some() {
            self.message = reason.as_ref().map(|r| r.to_string());
            self.reason = reason;
        }
        if self.state != to {
            self.state = to;
            self.last_transition_ms = now_ms();
            let text = match &self.reason {
                Some(r) if to.is_terminal() => format!("{to} ({r})"),
                _ => to.to_string(),
            };
            self.event(text);
        }
        Ok(step.effect)
    }

    /// Gives a record written before [`Lifecycle`] existed its lifecycle,
    /// from its state and flags. A record of today is left as it is.
    pub(crate) fn migrate(&mut self) {
        if self.lifecycle != Lifecycle::Pending || self.state == SandboxState::Pending {
            return;
        }
        let f = &self.legacy;
        let ended = self.state.is_terminal();
        self.lifecycle = match self.state {
            _ if f.deleting && ended => Lifecycle::Removing,
            _ if f.deleting => Lifecycle::Stopping { remove: true },
            SandboxState::Running if f.pooled => Lifecycle::Pooled,
            SandboxState::Paused if f.checkpointed => Lifecycle::Checkpointed,
            SandboxState::Running => {
                Lifecycle::Live { holds: Holds { user: false, snapshots: u32::from(f.snapshot_freeze) } }
            }
            SandboxState::Paused => Lifecycle::Live { holds: Holds { user: true, snapshots: 0 } },
            SandboxState::Stopping => Lifecycle::Stopping { remove: false },
            SandboxState::Failed => Lifecycle::Failed,
            SandboxState::Terminated | SandboxState::Pending => Lifecycle::Terminated,
        };
    }

    /// Appends a lifecycle event, dropping the oldest past [`MAX_EVENTS`].
    pub fn event(&mut self, text: String) {
        self.events.push((now_ms(), text));
        if self.events.len() > MAX_EVENTS {
            self.events.remove(0);
        }
    }
}
