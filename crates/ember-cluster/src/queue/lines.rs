//! One live attempt per workspace, across the cluster: bucket
//! `<name>_task_workspaces` keeps, per workspace, its unfinished tasks in
//! submission order (the key created at revision 0 by the first, then
//! changed by compare-and-set). Only the first of the line may be leased;
//! it keeps its place through retries and expiries and leaves at its end,
//! so the workspace's next task starts only after it, in submission order
//! (across tiers too). Also retention, listing and stats: the whole-queue
//! reads.
use super::kv::{encode, key_of, Cas};
use super::ops::Inner;
use ember_queue::{Pruned, QueueError, QueueStats, TaskFilter};
use ember_types::task::TaskRecord;

impl Inner {
    async fn line(&self, ws: &str) -> Result<(Vec<String>, Option<u64>), QueueError> {
        let Some((bytes, rev)) = self.lines.get(&key_of(ws)).await? else { return Ok((Vec::new(), None)) };
        let line = serde_json::from_slice(&bytes).map_err(|e| QueueError::Unavailable {
            op: "decode workspace line",
            id: ws.to_string(),
            reason: e.to_string(),
        })?;
        Ok((line, Some(rev)))
    }

    /// Puts `id` at the end of `ws`'s line (once).
    pub(crate) async fn join_line(&self, ws: &str, id: &str) -> Result<(), QueueError> {
        loop {
            let (mut line, rev) = self.line(ws).await?;
            if line.iter().any(|t| t == id) {
                return Ok(());
            }
            line.push(id.to_string());
            if let Cas::Done(_) = self.lines.cas(&key_of(ws), encode(&line), rev).await? {
                return Ok(());
            }
        }
    }

    /// Whether `id` is first in `ws`'s line. It joins the line if its submit
    /// died before it did; a first task that ended without leaving (its
    /// node died between record and line) is dropped from it here.
    pub(crate) async fn first_in_line(&self, ws: &str, id: &str) -> Result<bool, QueueError> {
        loop {
            let (mut line, rev) = self.line(ws).await?;
            if !line.iter().any(|t| t == id) {
                self.join_line(ws, id).await?;
                continue;
            }
            if line[0] == id {
                return Ok(true);
            }
            let live = self.records.load(&line[0]).await?.is_some_and(|(st, _)| !st.record.state.is_terminal());
            if live {
                return Ok(false);
            }
            line.remove(0);
            self.lines.cas(&key_of(ws), encode(&line), rev).await?;
        }
    }

    /// Takes `id` out of `ws`'s line (once).
    pub(crate) async fn leave_line(&self, ws: &str, id: &str) -> Result<(), QueueError> {
        loop {
            let (mut line, rev) = self.line(ws).await?;
            if !line.iter().any(|t| t == id) {
                return Ok(());
            }
            line.retain(|t| t != id);
            if let Cas::Done(_) = self.lines.cas(&key_of(ws), encode(&line), rev).await? {
                return Ok(());
            }
        }
    }

    async fn all(&self) -> Result<Vec<TaskRecord>, QueueError> {
        let mut out = Vec::new();
        for (_, bytes) in self.records.0.values().await? {
            if let Ok(st) = serde_json::from_slice::<super::kv::Stored>(&bytes) {
                out.push(st.record);
            }
        }
        out.sort_by(|a, b| (a.submitted_at_ms, &a.id).cmp(&(b.submitted_at_ms, &b.id)));
        Ok(out)
    }

    pub(crate) async fn list(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>, QueueError> {
        Ok(self.all().await?.into_iter().filter(|r| filter.matches(r)).collect())
    }

    /// The embedded backend's retention rule over the records: finished
    /// tasks older than the age, then the oldest beyond the count. The key
    /// index goes first, so a key never names a missing task for long.
    pub(crate) async fn prune(&self) -> Result<Vec<Pruned>, QueueError> {
        let ret = &self.queue.retention;
        let now = (self.clock)();
        let mut finished: Vec<(i64, TaskRecord)> = self
            .all()
            .await?
            .into_iter()
            .filter(|r| r.state.is_terminal())
            .map(|r| (r.transitions.last().map_or(r.submitted_at_ms, |t| t.at_ms), r))
            .collect();
        finished.sort_by(|a, b| (a.0, &a.1.id).cmp(&(b.0, &b.1.id)));
        let mut out = Vec::new();
        let mut left = finished.len();
        for (at, r) in finished {
            let old = ret.max_age_ms.is_some_and(|age| at <= now - age);
            let many = ret.max_finished.is_some_and(|max| left > max);
            if !old && !many {
                break;
            }
            if let Some(k) = r.spec.idempotency_scope() {
                self.keys.delete(&key_of(&k), None).await?;
            }
            self.records.0.delete(&key_of(&r.id), None).await?;
            left -= 1;
            out.push(Pruned { task: r.id.clone(), attempts: r.attempt() });
        }
        Ok(out)
    }

    pub(crate) async fn stats(&self) -> QueueStats {
        let mut s = QueueStats::default();
        for (rank, c) in self.consumers.iter().enumerate() {
            if let Ok(info) = c.get_info().await {
                s.queued[rank] = info.num_pending;
                s.active[rank] = info.num_ack_pending as u64;
            }
        }
        s
    }
}
