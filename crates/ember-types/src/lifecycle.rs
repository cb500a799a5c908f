//! A sandbox's lifecycle: one explicit state, and the only moves between
//! states. The engine's per-sandbox monitor is the one place that applies an
//! [`Action`]; it does the [`Effect`] a step asks for (freeze or thaw the
//! cgroup) and persists the new state. Everything here is pure, so the whole
//! machine is property-tested (`tests/lifecycle_props.rs`).
//!
//! Why holds and not a flag: a sandbox can be frozen for several reasons at
//! once (the user paused it, one or more snapshots are reading it). Each
//! reason is a hold of its own, and the cgroup is thawed only when the last
//! hold goes: a user's `resume` cannot thaw a writer a snapshot froze, and a
//! snapshot's end cannot undo a user's pause.
use crate::SandboxState;
use serde::{Deserialize, Serialize};

/// Why a live sandbox is frozen; it is frozen while any hold is set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holds {
    /// Paused by the user, until the user resumes it.
    #[serde(default)]
    pub user: bool,
    /// Freezes held by running snapshots, one each.
    #[serde(default)]
    pub snapshots: u32,
}

impl Holds {
    pub fn frozen(self) -> bool {
        self.user || self.snapshots > 0
    }
}

/// Where a sandbox is. Persisted in its record; the wire state
/// ([`SandboxState`]) is derived from it by [`Lifecycle::visible`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "camelCase")]
pub enum Lifecycle {
    /// Written ahead of the launch; nothing runs yet.
    Pending,
    /// Started by a warm pool and idle in it: no caller knows it.
    Pooled,
    /// Its processes run (frozen while any hold is set).
    Live { holds: Holds },
    /// Saved to disk by a gVisor checkpoint: no process until restored.
    Checkpointed,
    /// Being torn down; `remove`: the record goes too once it is down.
    Stopping { remove: bool },
    /// Ended well (exit 0, expiry, removal); the record says why.
    Terminated,
    /// Ended badly (a non-zero exit, OOM, a runtime error).
    Failed,
    /// Down, and its record is being dropped.
    Removing,
}

/// A request to move. Applied only by the sandbox's monitor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The launch finished; `idle`: into its pool, unclaimed.
    Launched { idle: bool },
    /// A pooled sandbox was handed to a caller.
    Claimed,
    /// The user's pause.
    Pause,
    /// The user's resume of a paused (not a checkpointed) sandbox.
    Resume,
    /// A snapshot takes a freeze of its own.
    SnapshotFreeze,
    /// A snapshot gives its freeze back.
    SnapshotThaw,
    /// A gVisor checkpoint saved the sandbox and stopped its processes.
    Checkpointed,
    /// A checkpointed sandbox runs again.
    Restored,
    /// Its end began (exit, OOM, expiry, a stop): teardown follows.
    Stop,
    /// Its removal was asked for: stop if needed, then drop the record.
    Remove,
    /// The teardown finished; `failed`: the reason is a failure.
    Ended { failed: bool },
    /// The daemon restarted: holds of snapshots that died with it go.
    Restarted,
}

/// What the monitor must do to the sandbox for a step to be true.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    Freeze,
    Thaw,
}

/// A move the machine does not allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("sandbox in {from:?} cannot take {action:?}")]
pub struct LifecycleError {
    pub from: Lifecycle,
    pub action: Action,
}

/// A legal move: where it leads and what must be done for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a step is only true once the monitor records `next` and does `effect`"]
pub struct Step {
    pub next: Lifecycle,
    pub effect: Option<Effect>,
}

impl Lifecycle {
    /// The state the API shows.
    pub fn visible(self) -> SandboxState {
        use Lifecycle::*;
        match self {
            Pending => SandboxState::Pending,
            Pooled => SandboxState::Running,
            Live { holds } if holds.user => SandboxState::Paused,
            Live { .. } => SandboxState::Running,
            Checkpointed => SandboxState::Paused,
            Stopping { .. } => SandboxState::Stopping,
            Terminated | Removing => SandboxState::Terminated,
            Failed => SandboxState::Failed,
        }
    }

    /// Whether the sandbox's processes are (to be) frozen.
    pub fn frozen(self) -> bool {
        matches!(self, Lifecycle::Live { holds } if holds.frozen())
    }

    /// Ended: nothing runs and nothing will.
    pub fn is_ended(self) -> bool {
        matches!(self, Lifecycle::Terminated | Lifecycle::Failed | Lifecycle::Removing)
    }

    /// No caller may see it: idle in a pool, or on its way out of the store.
    pub fn is_hidden(self) -> bool {
        matches!(self, Lifecycle::Pooled | Lifecycle::Removing | Lifecycle::Stopping { remove: true })
    }

    /// The one transition function.
    pub fn apply(self, action: Action) -> Result<Step, LifecycleError> {
        use Action as A;
        use Lifecycle::*;
        let step = |next| Ok(Step { next, effect: None });
        let err = Err(LifecycleError { from: self, action });
        match (self, action) {
            (Pending, A::Launched { idle: true }) => step(Pooled),
            (Pending, A::Launched { idle: false }) | (Pooled, A::Claimed) | (Checkpointed, A::Restored) => {
                step(Live { holds: Holds::default() })
            }
            (Live { holds }, A::Pause) if !holds.user => hold(holds, Holds { user: true, ..holds }),
            (Live { holds }, A::Resume) if holds.user => hold(holds, Holds { user: false, ..holds }),
            (Live { holds }, A::SnapshotFreeze) => {
                let Some(snapshots) = holds.snapshots.checked_add(1) else { return err };
                hold(holds, Holds { snapshots, ..holds })
            }
            (Live { holds }, A::SnapshotThaw) if holds.snapshots > 0 => {
                hold(holds, Holds { snapshots: holds.snapshots - 1, ..holds })
            }
            (Live { holds }, A::Restarted) => hold(holds, Holds { snapshots: 0, ..holds }),
            (Live { holds }, A::Checkpointed) if !holds.frozen() => step(Checkpointed),
            (Pooled, A::Stop | A::Remove) => step(Stopping { remove: true }),
            (Pending | Live { .. } | Checkpointed, A::Stop) => step(Stopping { remove: false }),
            (Pending | Live { .. } | Checkpointed | Stopping { .. }, A::Remove) => step(Stopping { remove: true }),
            (Stopping { remove: true }, A::Ended { .. }) => step(Removing),
            (Pending | Stopping { remove: false }, A::Ended { failed }) => {
                step(if failed { Failed } else { Terminated })
            }
            (Terminated | Failed | Removing, A::Remove) => step(Removing),
            (Pending | Pooled | Checkpointed | Stopping { .. } | Terminated | Failed | Removing, A::Restarted) => {
                step(self)
            }
            _ => err,
        }
    }
}

/// A live sandbox's holds change; the cgroup follows the first and the last.
fn hold(before: Holds, after: Holds) -> Result<Step, LifecycleError> {
    let effect = match (before.frozen(), after.frozen()) {
        (false, true) => Some(Effect::Freeze),
        (true, false) => Some(Effect::Thaw),
        _ => None,
    };
    Ok(Step { next: Lifecycle::Live { holds: after }, effect })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action as A;

    fn live(user: bool, snapshots: u32) -> Lifecycle {
        Lifecycle::Live { holds: Holds { user, snapshots } }
    }

    #[test]
    fn a_snapshot_freeze_survives_a_users_resume_and_a_users_pause_survives_a_snapshot() {
        let s = live(false, 0).apply(A::SnapshotFreeze).unwrap();
        assert_eq!(s.effect, Some(Effect::Freeze));
        // The user cannot resume what they did not pause.
        assert!(s.next.apply(A::Resume).is_err());
        let s = s.next.apply(A::Pause).unwrap();
        assert_eq!((s.next, s.effect), (live(true, 1), None));
        let s = s.next.apply(A::SnapshotThaw).unwrap();
        assert_eq!((s.next, s.effect), (live(true, 0), None));
        assert_eq!(s.next.visible(), SandboxState::Paused);
        let s = s.next.apply(A::Resume).unwrap();
        assert_eq!((s.next, s.effect), (live(false, 0), Some(Effect::Thaw)));
    }

    #[test]
    fn a_restart_drops_snapshot_holds_and_keeps_the_users() {
        let s = live(true, 2).apply(A::Restarted).unwrap();
        assert_eq!((s.next, s.effect), (live(true, 0), None));
        let s = live(false, 2).apply(A::Restarted).unwrap();
        assert_eq!((s.next, s.effect), (live(false, 0), Some(Effect::Thaw)));
    }

    #[test]
    fn a_pooled_sandbox_that_stops_is_removed() {
        let s = Lifecycle::Pooled.apply(A::Stop).unwrap();
        assert_eq!(s.next, Lifecycle::Stopping { remove: true });
        assert_eq!(s.next.apply(A::Ended { failed: true }).unwrap().next, Lifecycle::Removing);
    }

    #[test]
    fn serde_shape_is_tagged() {
        let j = serde_json::to_string(&live(true, 1)).unwrap();
        assert_eq!(j, r#"{"phase":"live","holds":{"user":true,"snapshots":1}}"#);
        assert_eq!(serde_json::from_str::<Lifecycle>(r#"{"phase":"checkpointed"}"#).unwrap(), Lifecycle::Checkpointed);
    }
}
