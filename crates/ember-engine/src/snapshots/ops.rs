//! Progress of workspace snapshots, restores and forks, for polling while the
//! request that started one is still running (the CLI's progress bars). Kept
//! in memory only: an operation is worth watching while it runs, and a
//! finished one stays visible for a few minutes, for a client that lost its
//! connection to learn the outcome.
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use ember_snapshot::{Phase, Progress};

use crate::EngineError;

/// How long a finished operation stays listed.
const KEEP_FINISHED_MS: i64 = 10 * 60 * 1000;
/// Finished operations kept at most (the oldest go first).
const KEEP_MAX: usize = 200;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Snapshot,
    Restore,
    Fork,
}

impl OpKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Snapshot => "snapshot",
            OpKind::Restore => "restore",
            OpKind::Fork => "fork",
        }
    }
}

/// One operation as last reported.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotOp {
    pub id: String,
    pub kind: OpKind,
    pub target: String,
    /// Of the current step (one workspace of a fork); see `bytes_done`.
    pub progress: Progress,
    /// Bytes of the workspaces of a fork already finished.
    pub bytes_before: u64,
    pub items_done: u32,
    pub items_total: u32,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
    pub error: Option<String>,
    pub result: Vec<String>,
}

impl SnapshotOp {
    /// `failed` when it ended in an error, else the snapshot phase.
    pub fn phase(&self) -> &'static str {
        if self.error.is_some() {
            return "failed";
        }
        match self.progress.phase {
            Phase::Scanning => "scanning",
            Phase::Transferring => "transferring",
            Phase::Syncing => "syncing",
            Phase::Committing => "committing",
            Phase::Copying => "copying",
            Phase::Done => "done",
        }
    }

    pub fn bytes_done(&self) -> u64 {
        self.bytes_before + self.progress.bytes_done
    }
}

#[derive(Default)]
pub(crate) struct SnapshotOps {
    ops: Mutex<BTreeMap<String, SnapshotOp>>,
}

impl SnapshotOps {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, SnapshotOp>> {
        // Plain records: a panic mid-update leaves nothing inconsistent.
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers an operation under the caller's id (or a new one) and returns the id.
    pub fn begin(&self, id: Option<String>, kind: OpKind, target: &str, items: u32) -> Result<String, EngineError> {
        let now = crate::record::now_ms();
        let id = match id {
            Some(id) => {
                ember_snapshot::validate_id(&id).map_err(|e| EngineError::invalid("operationId", e.to_string()))?;
                id
            }
            None => format!(
                "{}-{}",
                kind.as_str(),
                crate::create::random16()[..8].iter().map(|b| format!("{b:02x}")).collect::<String>()
            ),
        };
        let mut ops = self.lock();
        ops.retain(|_, o| o.finished_ms.is_none_or(|f| now - f < KEEP_FINISHED_MS));
        while ops.len() >= KEEP_MAX {
            let oldest = ops.iter().filter(|(_, o)| o.finished_ms.is_some()).min_by_key(|(_, o)| o.finished_ms);
            let Some(key) = oldest.map(|(k, _)| k.clone()) else { break };
            ops.remove(&key);
        }
        if ops.get(&id).is_some_and(|o| o.finished_ms.is_none()) {
            return Err(EngineError::invalid("operationId", format!("operation {id} is already running")));
        }
        let op = SnapshotOp {
            id: id.clone(),
            kind,
            target: target.to_string(),
            progress: Progress::default(),
            bytes_before: 0,
            items_done: 0,
            items_total: items,
            started_ms: now,
            finished_ms: None,
            error: None,
            result: Vec::new(),
        };
        ops.insert(id.clone(), op);
        Ok(id)
    }

    pub fn update(&self, id: &str, f: impl FnOnce(&mut SnapshotOp)) {
        if let Some(op) = self.lock().get_mut(id) {
            f(op);
        }
    }

    pub fn finish<T>(&self, id: &str, res: &Result<T, EngineError>, result: impl FnOnce(&T) -> Vec<String>) {
        self.update(id, |op| {
            op.finished_ms = Some(crate::record::now_ms());
            match res {
                Ok(v) => {
                    op.result = result(v);
                    op.progress.phase = Phase::Done;
                }
                Err(e) => op.error = Some(e.to_string()),
            }
        });
    }

    pub fn get(&self, id: &str) -> Option<SnapshotOp> {
        self.lock().get(id).cloned()
    }

    pub fn list(&self) -> Vec<SnapshotOp> {
        let mut all: Vec<_> = self.lock().values().cloned().collect();
        all.sort_by_key(|o| o.started_ms);
        all
    }
}
