//! Status and output of every command, foreground and background, for
//! `/command/status/{id}` and `/command/{id}/logs`.
//!
//! Bounded: at most [`MAX_FINISHED`] finished commands are kept, each log
//! holds at most [`LOG_CAP`] bytes, and the logs of finished commands
//! together at most [`FINISHED_LOG_BUDGET`]; past that the oldest go first.
use super::lines::LineLog;
use crate::stream::rfc3339;
use ember_types::execd::CommandStatus;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::time::SystemTime;

pub const MAX_FINISHED: usize = 1000;
pub const LOG_CAP: usize = 8 << 20;
pub const FINISHED_LOG_BUDGET: usize = 64 << 20;

#[derive(Debug)]
struct Record {
    content: String,
    /// Leader of the command's process group while it runs.
    pid: Option<i32>,
    started_at: SystemTime,
    finished_at: Option<SystemTime>,
    exit_code: Option<i32>,
    error: Option<String>,
    log: LineLog,
}

/// What an interrupt request finds.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    Unknown,
    Running(i32),
    Finished,
}

#[derive(Default)]
pub struct Registry {
    /// A std Mutex: every section is a short map operation with no await.
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    records: HashMap<String, Record>,
    /// Finished ids, oldest first.
    finished: VecDeque<String>,
    seq: u64,
}

impl Registry {
    /// Registers a command, running as the group led by `pid` or already
    /// failed to start (`None`), and returns its id.
    /// `name` fixes the id (the entrypoint's is "entrypoint") instead of a
    /// fresh random one.
    pub fn create(&self, name: Option<&str>, content: String, pid: Option<i32>) -> String {
        let mut inner = self.lock();
        let id = match name {
            Some(n) => n.to_string(),
            None => loop {
                inner.seq += 1;
                let id = new_id(inner.seq);
                if !inner.records.contains_key(&id) {
                    break id;
                }
            },
        };
        let record = Record {
            content,
            pid,
            started_at: SystemTime::now(),
            finished_at: None,
            exit_code: None,
            error: None,
            log: LineLog::new(LOG_CAP),
        };
        inner.records.insert(id.clone(), record);
        id
    }

    pub fn append(&self, id: &str, line: &str) {
        if let Some(r) = self.lock().records.get_mut(id) {
            r.log.push(line);
        }
    }

    /// Marks a command finished with its exit code and error text.
    pub fn finish(&self, id: &str, exit_code: i32, error: Option<String>) {
        let mut inner = self.lock();
        let Some(r) = inner.records.get_mut(id) else {
            return;
        };
        if r.finished_at.is_some() {
            return;
        }
        r.pid = None;
        r.finished_at = Some(SystemTime::now());
        r.exit_code = Some(exit_code);
        r.error = error;
        inner.finished.push_back(id.to_string());
        inner.evict();
    }

    pub fn lookup(&self, id: &str) -> Lookup {
        match self.lock().records.get(id) {
            None => Lookup::Unknown,
            Some(Record { pid: Some(pid), finished_at: None, .. }) => Lookup::Running(*pid),
            Some(_) => Lookup::Finished,
        }
    }

    pub fn status(&self, id: &str) -> Option<CommandStatus> {
        let inner = self.lock();
        let r = inner.records.get(id)?;
        Some(CommandStatus {
            id: id.to_string(),
            content: r.content.clone(),
            running: r.finished_at.is_none(),
            exit_code: r.exit_code,
            error: r.error.clone(),
            started_at: rfc3339(r.started_at),
            finished_at: r.finished_at.map(rfc3339),
        })
    }

    /// The log after line `cursor` and the next cursor.
    pub fn logs(&self, id: &str, cursor: Option<u64>) -> Option<(String, u64)> {
        self.lock().records.get(id).map(|r| r.log.since(cursor))
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        // No poisoning (parking_lot): every section leaves the maps consistent.
        self.inner.lock()
    }
}

impl Inner {
    fn evict(&mut self) {
        while self.finished.len() > MAX_FINISHED {
            if let Some(old) = self.finished.pop_front() {
                self.records.remove(&old);
            }
        }
        let mut total: usize = self.finished.iter().filter_map(|id| self.records.get(id)).map(|r| r.log.bytes()).sum();
        for id in &self.finished {
            if total <= FINISHED_LOG_BUDGET {
                break;
            }
            if let Some(r) = self.records.get_mut(id) {
                total -= r.log.bytes();
                r.log.clear();
            }
        }
    }
}

/// A command id: 16 hex digits, unpredictable (std's randomly seeded hasher)
/// and unique within the agent (the sequence number is hashed in).
fn new_id(seq: u64) -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(seq);
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifecycle_and_status_shape() {
        let reg = Registry::default();
        let id = reg.create(None, "echo hi".into(), Some(42));
        assert_eq!(reg.lookup(&id), Lookup::Running(42));
        let s = serde_json::to_value(reg.status(&id).unwrap()).unwrap();
        assert_eq!(s["running"], true);
        assert!(s["exit_code"].is_null() && s["finished_at"].is_null());
        reg.append(&id, "hi");
        reg.finish(&id, 3, Some("exit status 3".into()));
        let s = reg.status(&id).unwrap();
        assert_eq!((s.running, s.exit_code), (false, Some(3)));
        assert_eq!(reg.logs(&id, Some(0)), Some(("hi\n".to_string(), 1)));
        assert_eq!(reg.lookup("nope"), Lookup::Unknown);
    }

    #[test]
    fn finished_commands_are_bounded() {
        let reg = Registry::default();
        let first = reg.create(None, "a".into(), None);
        reg.finish(&first, 0, None);
        for _ in 0..MAX_FINISHED {
            let id = reg.create(None, "b".into(), None);
            reg.finish(&id, 0, None);
        }
        assert!(reg.status(&first).is_none());
        assert_eq!(reg.lock().records.len(), MAX_FINISHED);
    }
}
