//! The embedded queue's durable log: `<dir>/tasks.journal`, one line per task
//! state change, `<fnv64 of the JSON, 16 hex> <TaskRecord JSON>\n`. The last
//! line for an id wins; a line `{"pruned":"<id>"}` (retention) drops the id.
//!
//! Why a log and not a file per record: a task changes state four or five
//! times, and one `write(2)` on an `O_APPEND` file costs a few microseconds
//! where a temp file + rename costs a create, a rename and a directory update.
//! A torn last line (the daemon died mid-write) fails its checksum and is
//! dropped; a bad line elsewhere is skipped and counted. On open, and when the
//! log has grown well past its live content, it is rewritten to a temp file
//! and renamed into place (compaction).
//!
//! Durability: every append is fsynced (`fdatasync`) before the queue call
//! that made it returns (group commit, `sync.rs`: the write happens under the
//! queue's lock, the sync after it, shared by every caller waiting at that
//! moment), and a compaction fsyncs the new log and then its directory before
//! the rename counts; so a task the API acknowledged, or a lease and its
//! fencing generation, never rolls back after a power loss.
use crate::sync::GroupSync;
use crate::QueueError;
use ember_types::task::TaskRecord;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) struct Journal {
    path: PathBuf,
    file: Arc<File>,
    /// Makes the appends durable, outside the queue's lock.
    sync: Arc<GroupSync>,
    /// Bytes in the log now, and right after the last compaction.
    bytes: u64,
    compacted: u64,
}

fn fnv64(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100000001b3))
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> QueueError {
    let path = path.to_path_buf();
    move |source| QueueError::Journal { path, source }
}

/// What retention appends for a dropped task, instead of rewriting the log.
#[derive(serde::Serialize, serde::Deserialize)]
struct Pruned {
    pruned: String,
}

enum Line {
    Record(Box<TaskRecord>),
    Pruned(String),
}

fn checksummed(body: &[u8]) -> Vec<u8> {
    let mut out = format!("{:016x} ", fnv64(body)).into_bytes();
    out.extend_from_slice(body);
    out.push(b'\n');
    out
}

fn line(r: &TaskRecord) -> Vec<u8> {
    // A TaskRecord is plain data: serialising it cannot fail.
    checksummed(&serde_json::to_vec(r).unwrap_or_default())
}

fn parse(l: &[u8]) -> Option<Line> {
    let (sum, body) = (l.get(..16)?, l.get(17..)?);
    let sum = u64::from_str_radix(std::str::from_utf8(sum).ok()?, 16).ok()?;
    if sum != fnv64(body) {
        return None;
    }
    if let Ok(r) = serde_json::from_slice::<TaskRecord>(body) {
        return Some(Line::Record(Box::new(r)));
    }
    serde_json::from_slice::<Pruned>(body).ok().map(|p| Line::Pruned(p.pruned))
}

impl Journal {
    /// Reads the log (if any), compacts it and opens it for appending.
    /// Returns the records and how many damaged lines were skipped.
    pub fn open(dir: &Path) -> Result<(Journal, HashMap<String, TaskRecord>, usize), QueueError> {
        // Task specs carry env (secrets, often): the dir 0711, the journal 0600.
        std::fs::DirBuilder::new().recursive(true).mode(0o711).create(dir).map_err(io_err(dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).map_err(io_err(dir))?;
        let path = dir.join("tasks.journal");
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_err(&path)(e)),
        };
        let mut recs = HashMap::new();
        let mut damaged = 0;
        for l in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            match parse(l) {
                Some(Line::Record(r)) => {
                    recs.insert(r.id.clone(), *r);
                }
                Some(Line::Pruned(id)) => {
                    recs.remove(&id);
                }
                None => damaged += 1,
            }
        }
        let file = OpenOptions::new().create(true).append(true).mode(0o600).open(&path).map_err(io_err(&path))?;
        let file = Arc::new(file);
        let sync = Arc::new(GroupSync::new(file.clone()));
        let mut j = Journal { path, file, sync, bytes: 0, compacted: 0 };
        j.rewrite(recs.values())?;
        Ok((j, recs, damaged))
    }

    pub fn append(&mut self, r: &TaskRecord) -> Result<(), QueueError> {
        self.append_bytes(&line(r))
    }

    /// One write; the caller makes it durable with [`Journal::group`]'s
    /// `wait` once it has let go of the queue's lock.
    fn append_bytes(&mut self, l: &[u8]) -> Result<(), QueueError> {
        (&*self.file).write_all(l).map_err(io_err(&self.path))?;
        self.sync.wrote();
        self.bytes += l.len() as u64;
        Ok(())
    }

    /// The group commit of this log's appends.
    pub fn group(&self) -> Arc<GroupSync> {
        self.sync.clone()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one `pruned` line per id, in one write: a restart then drops
    /// them, and the next compaction forgets them for good. Cheaper under the
    /// queue lock than rewriting every live record.
    pub fn append_pruned<'a>(&mut self, ids: impl Iterator<Item = &'a str>) -> Result<(), QueueError> {
        let mut out = Vec::new();
        for id in ids {
            // A String field: serialising it cannot fail.
            out.extend_from_slice(&checksummed(&serde_json::to_vec(&Pruned { pruned: id.into() }).unwrap_or_default()));
        }
        self.append_bytes(&out)
    }

    /// Whether the log holds mostly superseded lines.
    pub fn wants_compaction(&self) -> bool {
        self.bytes > 4 * self.compacted + (8 << 20)
    }

    /// Replaces the log with one line per record (temp file + rename).
    pub fn rewrite<'a>(&mut self, recs: impl Iterator<Item = &'a TaskRecord>) -> Result<(), QueueError> {
        let tmp = self.path.with_extension("journal.tmp");
        let mut out = Vec::new();
        for r in recs {
            out.extend_from_slice(&line(r));
        }
        let write = || -> std::io::Result<()> {
            let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            // A temp file a crash left behind keeps its old mode through `open`.
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            f.write_all(&out)?;
            f.sync_all()
        };
        write().map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, &self.path).map_err(io_err(&self.path))?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))?;
        self.file = Arc::new(OpenOptions::new().append(true).open(&self.path).map_err(io_err(&self.path))?);
        self.sync.replaced(self.file.clone());
        self.bytes = out.len() as u64;
        self.compacted = self.bytes;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checksum_catches_a_torn_or_altered_line() {
        assert!(parse(b"0000000000000000 {}").is_none());
        assert!(parse(b"short").is_none());
        let body = br#"{"x":1}"#;
        let good = format!("{:016x} {}", fnv64(body), std::str::from_utf8(body).unwrap());
        // Right checksum, but not a TaskRecord.
        assert!(parse(good.as_bytes()).is_none());
    }
}
