//! A sandbox's persisted record: its spec, where it is in its lifecycle, and the
//! handles a restarted daemon needs to find it again.
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
    /// Set before a removal starts, so a restart finishes it instead of
    /// re-adopting the sandbox.
    pub deleting: bool,
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
    /// True while the sandbox waits, idle, in its pool. Cleared (and persisted)
    /// before a claim is answered; from then on it is never returned to a pool.
    #[serde(default)]
    pub pooled: bool,
    /// Workspaces mounted in the sandbox, with their lease epochs.
    #[serde(default)]
    pub workspaces: Vec<crate::workspaces::MountedWorkspace>,
    /// Paused by ember for a consistent workspace snapshot (not by the user): a
    /// restart that finds it set thaws the sandbox.
    #[serde(default)]
    pub snapshot_freeze: bool,
    /// The network slot the sandbox joined (egress networking), recorded
    /// before launch so a restart can re-adopt or reclaim it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_slot: Option<u32>,
    /// Saved to disk by a gVisor checkpoint: no process runs (state Paused,
    /// `pid` unset) and `resume` restores it from the image.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub checkpointed: bool,
    /// The sandbox snapshot this sandbox was restored from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
}

pub const MAX_EVENTS: usize = 200;

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl SandboxRecord {
    /// Moves to `to`, checking the transition is legal; terminal states take the
    /// reason with them.
    pub fn transition(&mut self, to: SandboxState, reason: Option<TerminationReason>) -> bool {
        if self.state.check_transition(to).is_err() {
            return false;
        }
        self.state = to;
        if reason.is_some() {
            self.message = reason.as_ref().map(|r| r.to_string());
            self.reason = reason;
        }
        self.last_transition_ms = now_ms();
        let text = match &self.reason {
            Some(r) if to.is_terminal() => format!("{to} ({r})"),
            _ => to.to_string(),
        };
        self.event(text);
        true
    }

    /// Appends a lifecycle event, dropping the oldest past [`MAX_EVENTS`].
    pub fn event(&mut self, text: String) {
        self.events.push((now_ms(), text));
        if self.events.len() > MAX_EVENTS {
            self.events.remove(0);
        }
    }
}
