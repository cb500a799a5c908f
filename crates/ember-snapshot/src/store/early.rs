//! fsyncs of a batch's staged files in the background, each as soon as it is
//! written, so that a snapshot's commit finds them durable already.
//!
//! Why: a full snapshot keeps both cores busy cutting, hashing and
//! compressing; an fsync waits on the device and uses no core. Done at the
//! commit, the fsyncs of a 500 MB snapshot were 0.2-0.35 s of waiting after
//! the last chunk (docs/performance.md, row 10); done here, they overlap the
//! compression of the next chunks. The commit still renames nothing before
//! every file's fsync has returned ([`EarlySync::finish`]).
use std::fmt;
use std::fs::File;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::StoreError;

/// At most this many fsyncs in flight (they wait on the device, not on a
/// core; several at once let the filesystem flush them together).
const THREADS: usize = 4;

type Job = (File, PathBuf);

/// The background fsyncs of one batch.
#[derive(Default)]
pub(crate) struct EarlySync {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    tx: Option<mpsc::Sender<Job>>,
    rx: Option<Arc<Mutex<mpsc::Receiver<Job>>>>,
    threads: Vec<JoinHandle<Result<(), StoreError>>>,
    /// The first failure of an fsync done inline.
    failed: Option<StoreError>,
    finished: bool,
}

impl fmt::Debug for EarlySync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EarlySync").field("threads", &self.inner.lock().threads.len()).finish()
    }
}

fn fsync((file, path): Job) -> Result<(), StoreError> {
    file.sync_all().map_err(|source| StoreError::Io { op: "fsync", path, source })
}

/// Takes jobs until the channel closes; fsyncs every one (a failure does not
/// stop the others) and returns the first failure.
fn serve(rx: Arc<Mutex<mpsc::Receiver<Job>>>) -> Result<(), StoreError> {
    let mut first = Ok(());
    loop {
        // The lock is held only while waiting for a job.
        let next = rx.lock().recv();
        match next {
            Ok(job) => {
                if let (Err(e), true) = (fsync(job), first.is_ok()) {
                    first = Err(e);
                }
            }
            Err(_) => return first,
        }
    }
}

impl EarlySync {
    /// Queues `file` (written, at `path`) for its fsync. A thread is started
    /// per push until there are [`THREADS`]; if none can be (or the batch is
    /// finished), the fsync runs here. Either way [`finish`](Self::finish)
    /// reports its failure.
    pub(crate) fn push(&self, file: File, path: PathBuf) {
        let mut inner = self.inner.lock();
        if !inner.finished && inner.threads.len() < THREADS {
            let rx = match &inner.rx {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = mpsc::channel();
                    let rx = Arc::new(Mutex::new(rx));
                    (inner.tx, inner.rx) = (Some(tx), Some(rx.clone()));
                    rx
                }
            };
            if let Ok(handle) = std::thread::Builder::new().name("ember-fsync".into()).spawn(move || serve(rx)) {
                inner.threads.push(handle);
            }
        }
        let unsent = match (&inner.tx, inner.threads.is_empty()) {
            // The receiver lives in `inner.rx` until `finish`: a send fails never.
            (Some(tx), false) => tx.send((file, path)).err().map(|mpsc::SendError(job)| job),
            _ => Some((file, path)),
        };
        if let Some(Err(e)) = unsent.map(fsync) {
            inner.failed.get_or_insert(e);
        }
    }

    /// Waits for every queued fsync; the first failure, if any. Files pushed
    /// after this are fsynced inline (and their failure is lost: a batch is
    /// finished once, at its commit).
    pub(crate) fn finish(&self) -> Result<(), StoreError> {
        let (threads, failed) = {
            let mut inner = self.inner.lock();
            inner.finished = true;
            inner.tx = None;
            inner.rx = None;
            (std::mem::take(&mut inner.threads), inner.failed.take())
        };
        let mut first = failed;
        for handle in threads {
            let result = handle.join().unwrap_or_else(|_| {
                Err(StoreError::Io {
                    op: "fsync",
                    path: PathBuf::new(),
                    source: std::io::Error::other("an fsync thread panicked"),
                })
            });
            if let Err(e) = result {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn written(dir: &std::path::Path, name: &str) -> Job {
        let path = dir.join(name);
        let mut f = File::create(&path).unwrap();
        f.write_all(name.as_bytes()).unwrap();
        (f, path)
    }

    /// fsync of a pipe fails (EINVAL): a file whose fsync cannot succeed.
    fn unsyncable(dir: &std::path::Path) -> Job {
        let (reader, _writer) = std::io::pipe().unwrap();
        (File::from(std::os::fd::OwnedFd::from(reader)), dir.join("a-pipe"))
    }

    #[test]
    fn every_pushed_file_is_synced_by_the_finish() {
        let dir = tempfile::tempdir().unwrap();
        let early = EarlySync::default();
        for i in 0..3 * THREADS {
            let (f, path) = written(dir.path(), &format!("f{i}"));
            early.push(f, path);
        }
        assert_eq!(early.inner.lock().threads.len(), THREADS, "one thread per push, up to THREADS");
        early.finish().unwrap();
        assert!(early.inner.lock().threads.is_empty());
    }

    #[test]
    fn a_failed_background_fsync_fails_the_finish_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let early = EarlySync::default();
        for i in 0..2 * THREADS {
            let (f, path) =
                if i == THREADS + 1 { unsyncable(dir.path()) } else { written(dir.path(), &format!("f{i}")) };
            early.push(f, path);
        }
        match early.finish() {
            Err(StoreError::Io { op: "fsync", path, .. }) => assert_eq!(path, dir.path().join("a-pipe")),
            other => panic!("the pipe's fsync failed, finish said {other:?}"),
        }
    }

    #[test]
    fn a_push_after_the_finish_is_synced_inline() {
        let dir = tempfile::tempdir().unwrap();
        let early = EarlySync::default();
        early.finish().unwrap();
        let (f, path) = unsyncable(dir.path());
        early.push(f, path);
        assert!(early.inner.lock().threads.is_empty(), "no thread after the finish");
        assert!(early.inner.lock().failed.is_some(), "the inline fsync ran and failed");
    }
}
