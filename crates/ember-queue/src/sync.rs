//! Group commit for the journal: lines are written under the queue's lock
//! (a `write(2)`, microseconds), and made durable outside it, one
//! `fdatasync` for every line written so far. A caller waits until a sync
//! that started after its own line was written has finished, so what it was
//! told is on disk exactly as with one sync per line; callers that arrive
//! while a sync runs share the next one instead of queueing one each behind
//! the lock (`ember bench tasks` measured the lock held through every
//! `fdatasync`: 4 per task, one at a time). docs/performance.md has the
//! figures.
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::io;
use std::sync::Arc;

/// What a sync flushes: the journal file (its data, `fdatasync`).
pub(crate) trait SyncTarget: Send + Sync {
    fn sync(&self) -> io::Result<()>;
}

impl SyncTarget for std::fs::File {
    fn sync(&self) -> io::Result<()> {
        self.sync_data()
    }
}

pub(crate) struct GroupSync {
    st: Mutex<State>,
    done: Condvar,
}

struct State {
    target: Arc<dyn SyncTarget>,
    /// Lines written, and of those, the ones known durable.
    written: u64,
    synced: u64,
    syncing: bool,
    /// The last failed sync: the lines up to `.0` may be lost, and a later
    /// sync that succeeds does not prove otherwise (Linux reports a
    /// writeback error once), so their callers all get the error.
    failed: Option<(u64, io::ErrorKind, String)>,
    /// Syncs run, for the test that they are shared.
    syncs: u64,
}

impl GroupSync {
    pub fn new(target: Arc<dyn SyncTarget>) -> GroupSync {
        let st = State { target, written: 0, synced: 0, syncing: false, failed: None, syncs: 0 };
        GroupSync { st: Mutex::new(st), done: Condvar::new() }
    }

    /// A line was written (called under the queue's lock, after the write).
    pub fn wrote(&self) {
        self.st.lock().written += 1;
    }

    /// Lines written so far.
    pub fn written(&self) -> u64 {
        self.st.lock().written
    }

    /// The log was replaced by a file already fsynced with every line
    /// (compaction): everything written so far is durable, and later syncs
    /// go to the new file.
    pub fn replaced(&self, target: Arc<dyn SyncTarget>) {
        let mut st = self.st.lock();
        st.target = target;
        st.synced = st.written;
    }

    /// Returns once every line written before this call is durable: after a
    /// sync that began after they were written, run by this caller or by
    /// another one waiting too.
    pub fn wait(&self) -> io::Result<()> {
        let mut st = self.st.lock();
        let want = st.written;
        loop {
            if let Some((upto, kind, msg)) = &st.failed {
                if want <= *upto && want > st.synced {
                    return Err(io::Error::new(*kind, msg.clone()));
                }
            }
            if st.synced >= want {
                return Ok(());
            }
            if st.syncing {
                self.done.wait(&mut st);
                continue;
            }
            self.sync_once(&mut st)?;
        }
    }

    /// One sync covering every line written so far, with the lock released
    /// while it runs so that appends and other waiters go on.
    fn sync_once(&self, st: &mut MutexGuard<'_, State>) -> io::Result<()> {
        st.syncing = true;
        st.syncs += 1;
        let (upto, target) = (st.written, st.target.clone());
        let res = MutexGuard::unlocked(st, || target.sync());
        st.syncing = false;
        match &res {
            Ok(()) => st.synced = st.synced.max(upto),
            Err(e) => st.failed = Some((upto, e.kind(), e.to_string())),
        }
        self.done.notify_all();
        res
    }

    #[cfg(test)]
    fn syncs(&self) -> u64 {
        self.st.lock().syncs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A sync that blocks until the test lets it go, and says when it starts.
    struct Gate {
        started: Mutex<mpsc::Sender<()>>,
        go: Mutex<mpsc::Receiver<io::Result<()>>>,
    }

    impl SyncTarget for Gate {
        fn sync(&self) -> io::Result<()> {
            let _ = self.started.lock().send(());
            self.go.lock().recv().unwrap_or(Ok(()))
        }
    }

    fn gated() -> (Arc<GroupSync>, mpsc::Receiver<()>, mpsc::Sender<io::Result<()>>) {
        let (started_tx, started) = mpsc::channel();
        let (go, go_rx) = mpsc::channel();
        let gate = Gate { started: Mutex::new(started_tx), go: Mutex::new(go_rx) };
        (Arc::new(GroupSync::new(Arc::new(gate))), started, go)
    }

    /// Four lines written while a sync runs share the next sync: two syncs
    /// for five lines, and nobody returns before a sync covering its line.
    #[test]
    fn writers_that_arrive_during_a_sync_share_the_next_one() {
        let (g, started, go) = gated();
        g.wrote();
        let first = std::thread::spawn({
            let g = g.clone();
            move || g.wait()
        });
        started.recv().expect("the first sync starts");
        let mut later = Vec::new();
        for _ in 0..4 {
            g.wrote();
            let g = g.clone();
            later.push(std::thread::spawn(move || g.wait()));
        }
        // The first sync began before these lines: it must not release them.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(later.iter().all(|h| !h.is_finished()), "a waiter returned before its line was synced");
        go.send(Ok(())).expect("release the first sync");
        first.join().expect("first").expect("first sync");
        started.recv().expect("one more sync starts, for the four");
        go.send(Ok(())).expect("release the second sync");
        for h in later {
            h.join().expect("waiter").expect("second sync");
        }
        assert_eq!(g.syncs(), 2);
        // Nothing new written: no sync at all.
        g.wait().expect("nothing to sync");
        assert_eq!(g.syncs(), 2);
    }

    /// A failed sync fails every line it covered, even if a later sync of the
    /// same file succeeds (the kernel reports a writeback error only once).
    #[test]
    fn a_failed_sync_fails_every_line_it_covered() {
        let (g, started, go) = gated();
        g.wrote();
        let h = std::thread::spawn({
            let g = g.clone();
            move || g.wait()
        });
        started.recv().expect("sync starts");
        go.send(Err(io::Error::other("EIO"))).expect("fail it");
        assert!(h.join().expect("waiter").is_err());
        assert!(g.wait().is_err(), "a line lost to a failed sync was reported durable");
        g.wrote();
        let h = std::thread::spawn({
            let g = g.clone();
            move || g.wait()
        });
        started.recv().expect("a new line gets a new sync");
        go.send(Ok(())).expect("succeed");
        h.join().expect("waiter").expect("the new line is durable");
    }
}
