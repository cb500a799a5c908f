//! The sandbox lifecycle under random interleavings of every action the
//! engine can apply (create, claim, pause, resume, snapshot freeze and thaw,
//! checkpoint, restore, stop for exit/OOM/TTL, delete, daemon restart). A
//! model tracks what must be true from the outside; after each step the
//! machine must agree with it.
use ember_types::lifecycle::{Action, Effect, Holds, Lifecycle};
use ember_types::SandboxState;
use proptest::prelude::*;

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        any::<bool>().prop_map(|idle| Action::Launched { idle }),
        Just(Action::Claimed),
        Just(Action::Pause),
        Just(Action::Resume),
        Just(Action::SnapshotFreeze),
        Just(Action::SnapshotThaw),
        Just(Action::Checkpointed),
        Just(Action::Restored),
        Just(Action::Stop),
        Just(Action::Remove),
        any::<bool>().prop_map(|failed| Action::Ended { failed }),
        Just(Action::Restarted),
    ]
}

/// What an observer knows: whether the cgroup is frozen (the effects done so
/// far), the user's pause, the snapshots holding a freeze, and whether a
/// removal or an end was ever accepted.
#[derive(Debug, Default)]
struct Model {
    cgroup_frozen: bool,
    user_paused: bool,
    open_snapshots: u32,
    removal_asked: bool,
    ended: bool,
}

impl Model {
    /// Follows an accepted action; the processes go away on a checkpoint or a
    /// stop, so their cgroup's freezer state goes with them.
    fn follow(&mut self, a: Action, effect: Option<Effect>) {
        match effect {
            Some(Effect::Freeze) => {
                assert!(!self.cgroup_frozen, "froze an already frozen sandbox");
                self.cgroup_frozen = true;
            }
            Some(Effect::Thaw) => {
                assert!(self.cgroup_frozen, "thawed a sandbox that was not frozen");
                self.cgroup_frozen = false;
            }
            None => {}
        }
        match a {
            Action::Pause => self.user_paused = true,
            Action::Resume => self.user_paused = false,
            Action::SnapshotFreeze => self.open_snapshots += 1,
            Action::SnapshotThaw => self.open_snapshots -= 1,
            Action::Restarted => self.open_snapshots = 0,
            Action::Checkpointed | Action::Stop | Action::Remove => {
                self.removal_asked |= a == Action::Remove;
                self.user_paused = false;
                self.open_snapshots = 0;
                self.cgroup_frozen = false;
            }
            Action::Ended { .. } => self.ended = true,
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_after_every_step(actions in proptest::collection::vec(action(), 1..60)) {
        let mut s = Lifecycle::Pending;
        let mut m = Model::default();
        for a in actions {
            let before = s;
            match s.apply(a) {
                Ok(step) => {
                    // Every legal move a caller can see is legal on the wire too.
                    let (v0, v1) = (before.visible(), step.next.visible());
                    prop_assert!(step.next.is_hidden() || v0 == v1 || v0.check_transition(v1).is_ok(), "{before:?} -{a:?}-> {:?}: {v0} -> {v1}", step.next);
                    m.follow(a, step.effect);
                    s = step.next;
                }
                Err(e) => {
                    prop_assert_eq!(e.from, before);
                    // Ended sandboxes refuse everything but their removal (and a restart).
                    prop_assert!(!(before.is_ended() && a == Action::Remove), "removal of {before:?} refused");
                    continue;
                }
            }
            // The cgroup is frozen exactly while a live sandbox holds a freeze.
            prop_assert_eq!(m.cgroup_frozen, s.frozen(), "{:?} after {:?}", s, a);
            if let Lifecycle::Live { holds } = s {
                // A snapshot's freeze survives a user's resume; a user's pause survives a snapshot's thaw.
                prop_assert_eq!(holds, Holds { user: m.user_paused, snapshots: m.open_snapshots });
                prop_assert_eq!(s.visible() == SandboxState::Paused, m.user_paused);
            }
            // A removal, once accepted, is never undone; an end is final.
            if m.removal_asked {
                prop_assert!(matches!(s, Lifecycle::Stopping { remove: true } | Lifecycle::Removing), "{s:?}");
                prop_assert!(s.is_hidden());
            }
            if m.ended {
                prop_assert!(s.is_ended(), "{s:?} after an end");
            }
            // What is persisted is what is read back after a restart.
            let json = serde_json::to_string(&s).unwrap();
            prop_assert_eq!(serde_json::from_str::<Lifecycle>(&json).unwrap(), s);
        }
    }
}
