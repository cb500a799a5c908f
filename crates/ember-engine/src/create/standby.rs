//! Creates under a fixed id (a cluster's rebind) and the standbys launched
//! ahead for them (`pool/standby.rs`), one launch per id at a time: a
//! standby still starting when its rebind comes is waited for and claimed,
//! and a standby asked for while its id's create runs is refused. Two
//! launches under one id would share its cgroups, its directories and its
//! record.
use super::{CreateSandbox, Provisioner};
use crate::EngineError;
use std::collections::HashSet;
use std::sync::Mutex;
use tokio::sync::watch;

/// The ids a launch is under way for.
pub(crate) struct FixedIds {
    busy: Mutex<HashSet<String>>,
    /// Bumped as each one ends.
    ended: watch::Sender<u64>,
}

/// One launch's hold on its id, given back when dropped.
pub(crate) struct Held<'a> {
    ids: &'a FixedIds,
    id: String,
}

impl FixedIds {
    pub fn new() -> FixedIds {
        FixedIds { busy: Mutex::default(), ended: watch::Sender::new(0) }
    }

    fn busy(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.busy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Holds `id` once no other launch does.
    pub async fn hold(&self, id: &str) -> Held<'_> {
        let mut ended = self.ended.subscribe();
        loop {
            if let Some(h) = self.try_hold(id) {
                return h;
            }
            // Subscribed before the look: an end after it is seen here.
            let _ = ended.changed().await;
        }
    }

    /// Holds `id` if no other launch does.
    pub fn try_hold(&self, id: &str) -> Option<Held<'_>> {
        self.busy().insert(id.to_string()).then(|| Held { ids: self, id: id.to_string() })
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.ids.busy().remove(&self.id);
        self.ids.ended.send_modify(|n| *n += 1);
    }
}

impl Provisioner {
    /// Launches a standby for the rebind sandbox `req.id` (node-local): the
    /// sandbox as `req` would start it, under its id, idle until a create of
    /// that id claims it. Refused while a launch under the id is under way,
    /// when a sandbox of that id is here, and for a restore of a snapshot.
    pub async fn launch_standby(&self, req: CreateSandbox) -> Result<(), EngineError> {
        let id = req.id.clone().ok_or_else(|| EngineError::invalid("id", "a standby is launched under its id"))?;
        if req.snapshot_id.is_some() {
            return Err(EngineError::invalid("snapshotId", "a restore of a snapshot has no standby"));
        }
        let Some(_held) = self.fixed.try_hold(id.as_str()) else {
            return Err(EngineError::invalid("id", format!("a launch of sandbox {id} is under way here")));
        };
        if self.sandboxes.entry(id.as_str()).is_ok() {
            return Err(EngineError::invalid("id", format!("sandbox {id} exists on this node")));
        }
        self.catalog.prepare_image(&req).await?;
        let spec = self.catalog.resolve(&req)?;
        self.pools.launch_standby(id, spec, req.image_uri).await
    }

    /// The ids of this node's idle standbys.
    pub fn standbys(&self) -> Vec<String> {
        self.pools.standbys()
    }

    /// Removes idle standby `id`.
    pub async fn remove_standby(&self, id: &str) -> Result<(), EngineError> {
        self.pools.remove_standby(id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_second_launch_under_one_id_waits_for_the_first() {
        let ids = Arc::new(FixedIds::new());
        let first = ids.try_hold("s1").expect("free");
        assert!(ids.try_hold("s1").is_none(), "held");
        assert!(ids.try_hold("s2").is_some(), "another id is free");
        let waiter = {
            let ids = ids.clone();
            tokio::spawn(async move {
                let _h = ids.hold("s1").await;
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "waits while the first holds it");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiter).await.expect("let go").expect("joined");
        assert!(ids.try_hold("s1").is_some(), "free again once the second let go");
    }
}
