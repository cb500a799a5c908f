//! An attempt's log file: written with a size cap and a truncation marker,
//! read from an offset in bounded pieces (so `logs -f` follows the file
//! instead of re-reading it from the start on every poll).
use crate::EngineError;
use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

/// The default cap on one attempt's log (`--task-log-limit`).
pub const DEFAULT_LOG_LIMIT: u64 = 16 << 20;
/// The most one read of a log returns; a follower asks again from where it is.
pub const LOG_READ_CHUNK: u64 = 1 << 20;

/// Appended once, when an attempt's output reaches the cap.
pub(crate) fn truncation_marker(limit: u64) -> String {
    format!("\n[ember: log truncated at {limit} bytes; further output dropped]\n")
}

/// An attempt's log being written: output past `limit` is dropped, with one
/// marker saying so. The file is made at the first output: an attempt
/// that prints nothing makes none (a read finds it empty either way), and
/// a task per sandbox at hundreds a second pays no inode for each silent
/// one (docs/performance.md, "Record files kept for reuse"). A path is one
/// attempt's, so no earlier file is there to replace.
pub(crate) struct TaskLog {
    file: Option<tokio::fs::File>,
    path: PathBuf,
    written: u64,
    limit: u64,
    truncated: bool,
}

impl TaskLog {
    pub(crate) fn new(path: PathBuf, limit: u64) -> Self {
        TaskLog { file: None, path, written: 0, limit, truncated: false }
    }

    /// Appends what fits under the cap, and the marker once it is reached.
    /// Flushed each time: tokio's File writes in the background and a
    /// follower reads the file.
    pub(crate) async fn append(&mut self, chunk: &[u8]) {
        if self.truncated || chunk.is_empty() {
            return;
        }
        let file = match &mut self.file {
            Some(f) => f,
            None => match tokio::fs::File::create(&self.path).await {
                Ok(f) => self.file.insert(f),
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "task log cannot be written");
                    // Once: the attempt's further output is dropped too.
                    self.truncated = true;
                    return;
                }
            },
        };
        let room = self.limit.saturating_sub(self.written) as usize;
        let (fits, over) = chunk.split_at(chunk.len().min(room));
        let mut res = file.write_all(fits).await;
        self.written += fits.len() as u64;
        if !over.is_empty() {
            self.truncated = true;
            res = res.and(file.write_all(truncation_marker(self.limit).as_bytes()).await);
        }
        if let Err(e) = res.and(file.flush().await) {
            tracing::warn!(path = %self.path.display(), error = %e, "task log write failed");
        }
    }
}

/// At most [`LOG_READ_CHUNK`] bytes of the log at `path` from `offset`; empty
/// at or past its end, or if it was never written.
pub(crate) async fn read_from(path: &Path, offset: u64) -> Result<Vec<u8>, EngineError> {
    let store = |source| EngineError::Store { path: path.to_path_buf(), source };
    let mut f = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(store(e)),
    };
    f.seek(SeekFrom::Start(offset)).await.map_err(store)?;
    let mut data = Vec::new();
    f.take(LOG_READ_CHUNK).read_to_end(&mut data).await.map_err(store)?;
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_past_the_cap_is_dropped_with_one_marker_and_reads_follow_by_offset() {
        let dir = std::env::temp_dir().join(format!("ember-tasklog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.1.log");
        let mut log = TaskLog::new(path.clone(), 10);
        log.append(b"").await;
        assert!(!path.exists(), "a log made before any output");
        log.append(b"12345").await;
        log.append(b"6789abcdef").await;
        log.append(b"more").await;
        let want = format!("123456789a{}", truncation_marker(10));
        assert_eq!(read_from(&path, 0).await.unwrap(), want.as_bytes());
        assert_eq!(read_from(&path, 5).await.unwrap(), &want.as_bytes()[5..]);
        assert!(read_from(&path, want.len() as u64 + 7).await.unwrap().is_empty());
        assert!(read_from(&dir.join("none.log"), 0).await.unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
