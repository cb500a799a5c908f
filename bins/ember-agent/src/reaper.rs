//! The one owner of `waitpid(-1)`.
//!
//! As PID 1 (or a subreaper) the agent inherits every orphan of the sandbox
//! and must reap them all, so it cannot wait on its own children one by one
//! (tokio::process would race it for their statuses). Instead:
//!
//! 1. commands are spawned (`ember_sys::vspawn`, or `std::process::Command`
//!    for a terminal) while holding the table lock, and registered under that
//!    same lock;
//! 2. on every SIGCHLD the reaper takes the lock and reaps with WNOHANG until
//!    nothing is left, handing each registered pid's status to its waiter and
//!    dropping the statuses of orphans.
//!
//! Holding the lock across spawn closes two races: a child that exits before
//! it is registered is still found (the reaper waits for the lock), and the
//! internal `waitpid(pid)` a spawn does when exec fails never finds its
//! child already stolen by the reaper.
use ember_sys::process::{self as sys, ExitKind, Reaped};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::process::{Child, Command};
use tokio::signal::unix::Signal;
use tokio::sync::oneshot;

#[derive(Default)]
pub struct Reaper {
    /// Live children we spawned, by pid. A std Mutex: it is never held across
    /// an await, and spawn itself is synchronous.
    table: Mutex<HashMap<i32, oneshot::Sender<ExitKind>>>,
}

/// Whether reaping left children behind.
#[derive(Debug, PartialEq, Eq)]
pub enum Remaining {
    Some,
    None,
}

impl Reaper {
    /// Spawns `cmd` and returns the child with a receiver of its exit. Never
    /// call `wait` on the returned `Child`: its status belongs to the reaper.
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<(Child, oneshot::Receiver<ExitKind>)> {
        let mut table = self.lock();
        let child = cmd.spawn()?;
        let (tx, rx) = oneshot::channel();
        table.insert(child.id() as i32, tx);
        Ok((child, rx))
    }

    /// Runs `spawn` (which starts a child, reaping it itself if it fails)
    /// and registers the pid it returns, both under the table lock.
    pub fn spawn_with(
        &self,
        spawn: impl FnOnce() -> io::Result<i32>,
    ) -> io::Result<(i32, oneshot::Receiver<ExitKind>)> {
        let mut table = self.lock();
        let pid = spawn()?;
        let (tx, rx) = oneshot::channel();
        table.insert(pid, tx);
        Ok((pid, rx))
    }

    /// Sends `sig` to the process group led by `pid` if that leader is still
    /// ours and unreaped, so a recycled pid is never signalled. Returns
    /// whether the signal was sent.
    pub fn signal_group(&self, pid: i32, sig: i32) -> bool {
        let table = self.lock();
        table.contains_key(&pid) && sys::killpg(pid, sig).is_ok()
    }

    /// Signals the groups of every command still running.
    pub fn signal_all_groups(&self, sig: i32) {
        let table = self.lock();
        for pid in table.keys() {
            let _ = sys::killpg(*pid, sig);
        }
    }

    /// How many spawned children have not been reaped yet.
    pub fn tracked(&self) -> usize {
        self.lock().len()
    }

    /// Reaps every child that has ended, without blocking.
    pub fn reap(&self) -> Remaining {
        let mut table = self.lock();
        loop {
            match sys::reap_any() {
                Ok(Reaped::Child { pid, exit }) => {
                    if let Some(tx) = table.remove(&pid) {
                        // The waiter may be gone (client left); nothing to do.
                        let _ = tx.send(exit);
                    }
                }
                Ok(Reaped::NoneReady) => return Remaining::Some,
                Ok(Reaped::NoChildren) => return Remaining::None,
                Err(e) => {
                    eprintln!("ember-agent: waitpid: {e}");
                    return Remaining::Some;
                }
            }
        }
    }

    /// Reaps on every SIGCHLD, forever. `sigchld` must have been registered
    /// before the first child was spawned so no exit goes unnoticed.
    pub async fn run(&self, mut sigchld: Signal) {
        // Children (the entrypoint) may have ended before this task started.
        self.reap();
        while sigchld.recv().await.is_some() {
            self.reap();
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<i32, oneshot::Sender<ExitKind>>> {
        // parking_lot does not poison: each operation is one insert or remove,
        // so a panic elsewhere leaves the table consistent and usable.
        self.table.lock()
    }
}
