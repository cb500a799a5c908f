//! A launched sandbox's CPU weight once its agent is up.
//!
//! A launch weighs the most or the least until its agent answers
//! ([`CpuShare::Foreground`], [`CpuShare::Background`]), then its limit's
//! share. While the node recovers a dead node's sessions its sandboxes'
//! group is lowered, and a session re-created here is back only once its
//! first calls have run: at its limit's share it was one of the group's
//! forty busy sandboxes, and on the 300-session drill its first append took
//! up to 2.9 s after the rebind ended (docs/performance.md). So a launch
//! someone waits on, or a claim (a rebind's standby, a pool's member), is
//! kept ahead of the group's others ([`CpuShare::Ahead`], behind the
//! launches still starting) while the recovery lasts and at least
//! [`KEEP_AFTER_UP`] after it was up: the last ones re-created come
//! up as the recovery ends, when the node's other sessions, held back
//! through it, all call at once. The weight is a share, not a limit: the
//! sandbox's CPU quota holds either way.
use ember_cgroups::{Cgroups, CpuShare};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long past its launch a sandbox made while the node recovers keeps
/// its weight ahead, the recovery over or not: the client's retry that
/// the rebind held lands within a second of it, and its first calls then.
pub const KEEP_AFTER_UP: Duration = Duration::from_secs(3);

/// The node's recovery as the native class sees it, and the sandboxes kept
/// ahead through it.
#[derive(Debug, Default)]
pub(super) struct Recovery {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    on: bool,
    kept: Vec<Kept>,
}

#[derive(Debug)]
struct Kept {
    name: String,
    cpu_millis: u64,
    until: Instant,
}

impl Recovery {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets sandbox `name`, launched at `launch` and now up, to its limit's
    /// share, unless the node recovers and someone waits on it: it is then
    /// kept ahead ([`CpuShare::Ahead`]) until the recovery ends, and
    /// [`KEEP_AFTER_UP`] at least. Decided under the lock, so a recovery
    /// ending meanwhile either finds it kept or was over before.
    pub(super) fn settle(
        &self,
        cg: &dyn Cgroups,
        name: &str,
        launch: CpuShare,
        cpu_millis: u64,
    ) -> Result<(), ember_cgroups::CgroupError> {
        let mut state = self.state();
        if state.on && launch == CpuShare::Foreground {
            cg.set_cpu_share(name, CpuShare::Ahead)?;
            let until = Instant::now() + KEEP_AFTER_UP;
            state.kept.push(Kept { name: name.to_string(), cpu_millis, until });
            return Ok(());
        }
        drop(state);
        cg.set_cpu_share(name, CpuShare::Limit(cpu_millis))
    }

    /// An idle sandbox `name`, up already, is claimed: while the node
    /// recovers it weighs as a launch someone waits on, kept so as
    /// [`Self::settle`] keeps one (a standby claimed by a rebind was one of
    /// the group's busy sandboxes at its limit's share, and its session back
    /// 2 s after it, p50, on the 300-session drill). Set under the lock: a
    /// recovery ending meanwhile finds it kept, or was over before.
    pub(super) fn hasten(
        &self,
        cg: &dyn Cgroups,
        name: &str,
        cpu_millis: u64,
    ) -> Result<(), ember_cgroups::CgroupError> {
        let mut state = self.state();
        if !state.on {
            return Ok(());
        }
        cg.set_cpu_share(name, CpuShare::Ahead)?;
        let until = Instant::now() + KEEP_AFTER_UP;
        state.kept.push(Kept { name: name.to_string(), cpu_millis, until });
        Ok(())
    }

    /// The node's recovery starts (`true`) or ends: then each sandbox kept
    /// is set to its limit's share once [`KEEP_AFTER_UP`] has passed since
    /// it was up, by a thread that waits for the last of them.
    pub(super) fn set(self: &Arc<Self>, cg: &Arc<dyn Cgroups>, on: bool) {
        self.state().on = on;
        if on {
            return;
        }
        if let Some(last) = self.set_back_due(&**cg) {
            let (recovery, cgroups) = (self.clone(), cg.clone());
            let spawned = std::thread::Builder::new().name("ember-weight".into()).spawn(move || {
                std::thread::sleep(last.saturating_duration_since(Instant::now()));
                recovery.set_back_due(&*cgroups);
            });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no thread to set the sandboxes made in the recovery back; now instead");
                self.set_back(&**cg, std::mem::take(&mut self.state().kept));
            }
        }
    }

    /// Unless a recovery runs again, sets back the kept sandboxes whose
    /// time is up; the latest time of those left.
    fn set_back_due(&self, cg: &dyn Cgroups) -> Option<Instant> {
        let now = Instant::now();
        let due = {
            let mut state = self.state();
            if state.on {
                return None;
            }
            let (due, left): (Vec<Kept>, Vec<Kept>) = state.kept.drain(..).partition(|k| k.until <= now);
            state.kept = left;
            due
        };
        self.set_back(cg, due);
        self.state().kept.iter().map(|k| k.until).max()
    }

    /// Each sandbox of `kept` to its limit's share (one removed meanwhile is skipped).
    fn set_back(&self, cg: &dyn Cgroups, kept: Vec<Kept>) {
        for k in kept.into_iter().filter(|k| cg.exists(&k.name)) {
            if let Err(e) = cg.set_cpu_share(&k.name, CpuShare::Limit(k.cpu_millis)) {
                tracing::warn!(sandbox = %k.name, error = %e, "setting a sandbox made in the recovery back to its CPU share");
            }
        }
    }
}
