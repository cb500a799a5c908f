//! The audit log: one JSON line per audited call (`AuditRecord`), appended to
//! `<data>/audit/audit.jsonl`. A line is written before the call's answer
//! leaves; the file is fsynced in batches (at most [`SYNC_EVERY`] after the
//! write, by a thread of its own) rather than once per call. At
//! [`MAX_BYTES`] the file is renamed to `audit.jsonl.1` (the one before is
//! dropped) and a new one started. The caller decides what goes in a record:
//! the API writes an exec's command line, never its output, never env values.
use super::TenantError;
use crate::EngineError;
use ember_types::tenant::AuditRecord;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub const MAX_BYTES: u64 = 16 << 20;
const SYNC_EVERY: Duration = Duration::from_millis(200);
/// The most records one query returns (the newest).
pub const MAX_QUERY: usize = 10_000;

struct Inner {
    file: File,
    len: u64,
    dirty: bool,
}

pub struct Audit {
    dir: PathBuf,
    max_bytes: u64,
    inner: Arc<Mutex<Inner>>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> TenantError {
    let path = path.to_path_buf();
    move |source| TenantError::Store(EngineError::Store { path, source })
}

fn open_log(path: &Path) -> Result<File, TenantError> {
    OpenOptions::new().create(true).append(true).mode(0o600).open(path).map_err(io_err(path))
}

impl Audit {
    pub fn open(dir: &Path) -> Result<Audit, TenantError> {
        Self::open_with(dir, MAX_BYTES)
    }

    /// [`open`](Self::open) rotating at `max_bytes`.
    pub fn open_with(dir: &Path, max_bytes: u64) -> Result<Audit, TenantError> {
        crate::store::private_dir(dir)?;
        let path = dir.join("audit.jsonl");
        let file = open_log(&path)?;
        let len = file.metadata().map_err(io_err(&path))?.len();
        let inner = Arc::new(Mutex::new(Inner { file, len, dirty: false }));
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name("ember-audit-sync".into())
            .spawn(move || sync_loop(weak))
            .map_err(io_err(dir))?;
        Ok(Audit { dir: dir.to_path_buf(), max_bytes, inner })
    }

    fn path(&self) -> PathBuf {
        self.dir.join("audit.jsonl")
    }

    /// Appends `r` as one line; rotates first when the file is full.
    pub fn append(&self, r: &AuditRecord) -> Result<(), TenantError> {
        let mut line = serde_json::to_vec(r).map_err(|e| EngineError::Internal(e.to_string()))?;
        line.push(b'\n');
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.len > 0 && g.len + line.len() as u64 > self.max_bytes {
            let _ = g.file.sync_data();
            let path = self.path();
            std::fs::rename(&path, self.dir.join("audit.jsonl.1")).map_err(io_err(&path))?;
            g.file = open_log(&path)?;
            g.len = 0;
        }
        g.file.write_all(&line).map_err(io_err(&self.path()))?;
        g.len += line.len() as u64;
        g.dirty = true;
        Ok(())
    }

    /// The newest records (at most [`MAX_QUERY`]) of `tenant` (all without
    /// one) at or after `since_ms`, oldest first. Reads the rotated file and
    /// the current one, both bounded by the rotation size.
    pub fn query(&self, tenant: Option<&str>, since_ms: i64) -> Result<Vec<AuditRecord>, TenantError> {
        let mut out = std::collections::VecDeque::new();
        for p in [self.dir.join("audit.jsonl.1"), self.path()] {
            let f = match File::open(&p) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(&p)(e)),
            };
            // One bound for the file, one for a line: a file grown past the
            // rotation size by hand is read only that far.
            for line in BufReader::new(f.take(self.max_bytes.max(MAX_BYTES) * 2)).split(b'\n') {
                let line = line.map_err(io_err(&p))?;
                let Ok(r) = serde_json::from_slice::<AuditRecord>(&line) else { continue };
                if r.ts_ms >= since_ms && tenant.is_none_or(|t| t == r.tenant) {
                    if out.len() == MAX_QUERY {
                        out.pop_front();
                    }
                    out.push_back(r);
                }
            }
        }
        Ok(out.into())
    }
}

/// fsyncs the log when lines were written since the last pass; ends with the log.
fn sync_loop(inner: Weak<Mutex<Inner>>) {
    loop {
        std::thread::sleep(SYNC_EVERY);
        let Some(inner) = inner.upgrade() else { return };
        let file = {
            let mut g = inner.lock().unwrap_or_else(|p| p.into_inner());
            if !g.dirty {
                continue;
            }
            g.dirty = false;
            g.file.try_clone()
        };
        // Outside the lock: an fsync may take a while, appends go on.
        if let Ok(f) = file {
            let _ = f.sync_data();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: i64, tenant: &str) -> AuditRecord {
        AuditRecord {
            ts_ms: i,
            tenant: tenant.into(),
            key: "k".into(),
            source: "127.0.0.1:1".into(),
            request_id: format!("r{i}"),
            method: "POST".into(),
            path: "/v1/sandboxes".into(),
            action: "sandbox.create".into(),
            argv: None,
            status: 202,
            outcome: "ok".into(),
        }
    }

    #[test]
    fn a_full_log_rotates_and_a_query_reads_both_files_filtered() {
        let d = std::env::temp_dir().join(format!("ember-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let a = Audit::open_with(&d, 1000).expect("open");
        for i in 0..20 {
            a.append(&rec(i, if i % 2 == 0 { "a" } else { "b" })).expect("append");
        }
        assert!(d.join("audit.jsonl.1").exists(), "no rotation at 1000 bytes");
        assert!(std::fs::metadata(d.join("audit.jsonl")).expect("log").len() <= 1000);
        let got = a.query(Some("a"), 10).expect("query");
        assert!(got.iter().all(|r| r.tenant == "a" && r.ts_ms >= 10), "{got:?}");
        assert_eq!(got.last().map(|r| r.ts_ms), Some(18));
        let _ = std::fs::remove_dir_all(&d);
    }
}
