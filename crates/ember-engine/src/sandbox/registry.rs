//! The sandboxes this node knows, by id: published by `publish`, dropped by
//! their monitor once their record is. Read by anyone (a lookup, a list, the
//! workspace leases' liveness check); written only by this module's owners.
use super::Entry;
use crate::workspaces::Holders;
use crate::EngineError;
use ember_types::SandboxId;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Default)]
pub(crate) struct Registry {
    /// A std Mutex: lookups, inserts and removals only, never held across an await.
    map: Mutex<HashMap<SandboxId, Arc<Entry>>>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<SandboxId, Arc<Entry>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Any sandbox, idle pool members and removals under way included.
    pub fn entry(&self, id: &str) -> Result<Arc<Entry>, EngineError> {
        let id = SandboxId::try_from(id.to_string()).map_err(|_| EngineError::NotFound(id.to_string()))?;
        self.lock().get(&id).cloned().ok_or_else(|| EngineError::NotFound(id.to_string()))
    }

    /// Whether sandbox `id` is known and holds resources (has not ended).
    pub fn is_alive(&self, id: &str) -> bool {
        self.entry(id).is_ok_and(|e| !e.snapshot().state.is_terminal())
    }

    pub fn all(&self) -> Vec<Arc<Entry>> {
        self.lock().values().cloned().collect()
    }

    pub(super) fn insert(&self, id: SandboxId, entry: Arc<Entry>) {
        self.lock().insert(id, entry);
    }

    pub(crate) fn remove(&self, id: &SandboxId) {
        self.lock().remove(id);
    }
}

impl Holders for Registry {
    fn is_alive(&self, id: &str) -> bool {
        Registry::is_alive(self, id)
    }
}
