//! Workspace snapshots: consistent (the writer is frozen), fenced (a commit is
//! accepted only while the lease epoch it started under is current),
//! content-addressed and incremental in the configured object store.
use crate::workspaces::WorkspaceStatus;
use crate::{Engine, EngineError};
use ember_snapshot::{ObjectStore, RestoreOptions, SnapshotOptions, SnapshotSummary};
use std::sync::Arc;

/// Where snapshots are written.
#[derive(Clone, Debug)]
pub enum SnapshotStoreConfig {
    Local(std::path::PathBuf),
    S3(ember_snapshot::S3Config),
}

pub(crate) fn open_store(cfg: &SnapshotStoreConfig) -> Result<Arc<dyn ObjectStore>, EngineError> {
    let err = |e: ember_snapshot::StoreError| EngineError::Snapshot(ember_snapshot::SnapshotError::from(e));
    Ok(match cfg {
        SnapshotStoreConfig::Local(dir) => Arc::new(ember_snapshot::LocalStore::open(dir.clone()).map_err(err)?),
        SnapshotStoreConfig::S3(c) => Arc::new(ember_snapshot::S3Store::open(c.clone()).map_err(err)?),
    })
}

fn now_ms() -> i64 {
    crate::record::now_ms()
}

impl Engine {
    async fn snap<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Engine, &dyn ObjectStore) -> Result<T, EngineError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || f(&me, me.snapshot_store.as_ref()))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
    }

    /// Snapshots a workspace. `fence`: commit only while this holder still has
    /// the lease at this epoch (a writer's own checkpoint). Without it the
    /// snapshot is refused if the lease changes hands while it runs.
    pub async fn snapshot_workspace(
        self: &Arc<Self>,
        name: &str,
        fence: Option<(String, u64)>,
    ) -> Result<SnapshotSummary, EngineError> {
        let meta = self.workspaces.meta(name)?;
        let start = meta.leases.lease.clone();
        if let Some((holder, epoch)) = &fence {
            meta.leases.check(name, holder, *epoch)?;
        }
        // Consistency: the live writer, if any, is frozen while the tree is read.
        let writer = start
            .as_ref()
            .map(|l| l.holder.clone())
            .filter(|h| self.entry(h).is_ok_and(|e| e.snapshot().state == ember_types::SandboxState::Running));
        if let Some(w) = &writer {
            self.pause(w).await?;
            if let Ok(e) = self.entry(w) {
                e.update(|r| r.snapshot_freeze = true);
                self.persist(&e);
            }
        }
        let n = name.to_string();
        let res = self
            .snap(move |e, store| {
                let mnt = e.workspaces.ensure_mounted(&n)?;
                let id = format!("{n}-{}", now_ms());
                let guard = || {
                    let now = e.workspaces.meta(&n).ok().and_then(|m| m.leases.lease);
                    match &fence {
                        Some((h, ep)) => now.is_some_and(|l| &l.holder == h && l.epoch == *ep),
                        None => now == start,
                    }
                };
                let mut opts = SnapshotOptions::new(id).label("workspace", n.clone());
                opts.labels.insert("sizeBytes".into(), meta.size_bytes.to_string());
                if let Some(l) = &start {
                    opts.labels.insert("epoch".into(), l.epoch.to_string());
                }
                opts.commit_guard = &guard;
                Ok(ember_snapshot::snapshot(&mnt, store, opts).map(|i| i.summary)?)
            })
            .await;
        if let Some(w) = &writer {
            let _ = self.resume(w).await;
            if let Ok(e) = self.entry(w) {
                e.update(|r| r.snapshot_freeze = false);
                self.persist(&e);
            }
        }
        res
    }

    pub async fn list_snapshots(
        self: &Arc<Self>,
        workspace: Option<String>,
    ) -> Result<Vec<SnapshotSummary>, EngineError> {
        self.snap(move |_, store| {
            let all = ember_snapshot::list(store)?;
            Ok(all
                .into_iter()
                .filter(|s| workspace.as_ref().is_none_or(|w| s.labels.get("workspace") == Some(w)))
                // A sandbox snapshot's rootfs layer is not a workspace snapshot
                // (it is listed, and removed, through /v1/snapshots).
                .filter(|s| !s.labels.contains_key(ember_snapshot::LAYER_LABEL))
                .collect())
        })
        .await
    }

    pub async fn inspect_snapshot(self: &Arc<Self>, id: &str) -> Result<SnapshotSummary, EngineError> {
        let id = id.to_string();
        self.snap(move |_, store| Ok(ember_snapshot::inspect(store, &id)?)).await
    }

    pub async fn delete_snapshot(self: &Arc<Self>, id: &str) -> Result<(), EngineError> {
        let id = id.to_string();
        self.snap(move |_, store| Ok(ember_snapshot::delete(store, &id)?)).await
    }

    pub async fn gc_snapshots(self: &Arc<Self>) -> Result<ember_snapshot::GcReport, EngineError> {
        self.snap(|_, store| Ok(ember_snapshot::gc(store, ember_snapshot::GcOptions::default())?)).await
    }

    /// A new workspace holding the snapshot's tree, every chunk verified.
    pub async fn restore_workspace(
        self: &Arc<Self>,
        id: &str,
        name: &str,
        size: Option<u64>,
    ) -> Result<WorkspaceStatus, EngineError> {
        let summary = self.inspect_snapshot(id).await?;
        let size = size
            .or_else(|| summary.labels.get("sizeBytes").and_then(|s| s.parse().ok()))
            .unwrap_or(1 << 30)
            .max(summary.stats.logical_bytes + (16 << 20));
        let (id, n) = (id.to_string(), name.to_string());
        self.snap(move |e, store| {
            e.workspaces.create(&n, size)?;
            let res = (|| {
                let mnt = e.workspaces.ensure_mounted(&n)?;
                let tmp = mnt.join(".ember-restore");
                ember_snapshot::restore(store, &id, &tmp, RestoreOptions::default())?;
                for entry in
                    std::fs::read_dir(&tmp).map_err(|err| EngineError::Internal(format!("{}: {err}", tmp.display())))?
                {
                    let entry = entry.map_err(|err| EngineError::Internal(err.to_string()))?;
                    std::fs::rename(entry.path(), mnt.join(entry.file_name()))
                        .map_err(|err| EngineError::Internal(format!("moving {}: {err}", entry.path().display())))?;
                }
                std::fs::remove_dir(&tmp).map_err(|err| EngineError::Internal(err.to_string()))?;
                Ok(())
            })();
            if res.is_err() {
                let _ = e.workspaces.remove(&n, |_| false);
            }
            res
        })
        .await?;
        self.workspace(name).await
    }

    /// `count` new workspaces `<prefix>-<i>` from one snapshot.
    pub async fn fork_snapshot(
        self: &Arc<Self>,
        id: &str,
        count: u32,
        prefix: &str,
    ) -> Result<Vec<WorkspaceStatus>, EngineError> {
        if count == 0 || count > 1000 {
            return Err(EngineError::invalid("count", "1..=1000"));
        }
        let mut out = Vec::new();
        for i in 1..=count {
            out.push(self.restore_workspace(id, &format!("{prefix}-{i}"), None).await?);
        }
        Ok(out)
    }
}
