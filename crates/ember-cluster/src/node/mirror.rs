//! A bucket kept in memory by one long-lived watch: the rebind sweep and
//! the pool convergence read it every heartbeat.
//!
//! They listed the bucket's keys and read each key, every 500 ms, on every
//! node. Each listing is an ephemeral JetStream consumer (created, then
//! deleted: two calls to the meta leader), and each read a request to the
//! stream's leader: with 10 nodes, 60 consumers a second and one read per
//! rebind sandbox per node per beat (300 sessions: 6,000 reads a second),
//! all of it repeated while nothing changed. A watch costs one consumer per
//! bucket per node and one message per change.
//!
//! The copy lags the bucket by the watch's delivery; a writer that acts on
//! it writes by compare-and-set on the revision it read, so a stale copy
//! makes a write fail, never a wrong one. A [`Listener`] hears every change
//! the watch delivers (the tenants' copy of each node, `tenants.rs`).
use async_nats::jetstream::kv;
use bytes::Bytes;
use futures_util::StreamExt;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a broken watch waits before it is opened again.
const REOPEN_AFTER: Duration = Duration::from_millis(500);
/// How long one watch is followed before it is opened again from the
/// bucket's content. A watch can stop delivering without an error (a node's
/// copy of the rebind bucket kept naming it for sandboxes rebound elsewhere
/// minutes before, on the 300-session drill): a copy lags by this at most.
const RESYNC_EVERY: Duration = Duration::from_secs(30);

/// The bucket's live keys, their values and revisions.
pub(super) struct Mirror {
    bucket: String,
    state: Mutex<State>,
    listener: Option<Arc<dyn Listener>>,
    /// Counts the changes applied: a call held for a rebind (`hold.rs`)
    /// wakes on each and looks at its own key.
    changes: tokio::sync::watch::Sender<u64>,
}

/// Told of each change of the bucket, in the watch's order.
pub(super) trait Listener: Send + Sync {
    /// `key` holds `value` (`None`: deleted) as of `revision` (`None`: gone
    /// from the bucket while the watch was closed, its marker purged).
    fn changed(&self, key: &str, value: Option<&[u8]>, revision: Option<u64>);
}

#[derive(Default)]
struct State {
    entries: HashMap<String, (Bytes, u64)>,
    /// The watch delivered the bucket's whole content at least once.
    synced: bool,
}

impl Mirror {
    /// Starts the watch of `store`; the copy is readable once it has caught
    /// up with the bucket.
    pub(super) fn spawn(store: kv::Store) -> Arc<Mirror> {
        Mirror::spawn_with(store, None)
    }

    /// [`Mirror::spawn`], telling `listener` of every change.
    pub(super) fn spawn_with(store: kv::Store, listener: Option<Arc<dyn Listener>>) -> Arc<Mirror> {
        let m = Arc::new(Mirror::new(store.name.clone(), listener));
        tokio::spawn(m.clone().follow(store));
        m
    }

    fn new(bucket: String, listener: Option<Arc<dyn Listener>>) -> Mirror {
        Mirror { bucket, state: Mutex::default(), listener, changes: Default::default() }
    }

    /// Told of every change the copy applies (a count).
    pub(super) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether the watch has delivered the whole bucket once.
    pub(super) fn synced(&self) -> bool {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).synced
    }

    /// Every live key with its value and revision; `None` until the watch
    /// has delivered the whole bucket once.
    pub(super) fn entries(&self) -> Option<Vec<(String, Bytes, u64)>> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.synced.then(|| st.entries.iter().map(|(k, (v, r))| (k.clone(), v.clone(), *r)).collect())
    }

    /// Key `key`'s value as the copy has it (`None` if absent or not
    /// caught up yet).
    pub(super) fn get(&self, key: &str) -> Option<Bytes> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.entries.get(key).map(|(v, _)| v.clone())
    }

    fn apply(&self, key: String, entry: Option<(Bytes, u64)>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match entry {
            Some(e) => drop(st.entries.insert(key, e)),
            None => drop(st.entries.remove(&key)),
        }
        drop(st);
        self.changes.send_modify(|n| *n += 1);
    }

    /// The watch delivered the bucket's content: keys it did not deliver
    /// (`delivered`, when the watch re-opened: gone meanwhile, their delete
    /// markers purged) are dropped.
    fn caught_up(&self, delivered: Option<&HashSet<String>>) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(keys) = delivered {
            let gone: Vec<String> = st.entries.keys().filter(|k| !keys.contains(*k)).cloned().collect();
            for k in gone {
                st.entries.remove(&k);
                if let Some(l) = &self.listener {
                    l.changed(&k, None, None);
                }
            }
        }
        st.synced = true;
        drop(st);
        self.changes.send_modify(|n| *n += 1);
    }

    /// Follows the bucket for the process's life, opening the watch again
    /// when it ends (a lost connection, an election).
    async fn follow(self: Arc<Self>, store: kv::Store) {
        loop {
            match tokio::time::timeout(RESYNC_EVERY, self.watch(&store)).await {
                Err(_) => continue,
                Ok(Err(e)) => tracing::warn!(bucket = %self.bucket, error = %e, "watching a cluster bucket"),
                Ok(Ok(())) => {}
            }
            tokio::time::sleep(REOPEN_AFTER).await;
        }
    }

    async fn watch(&self, store: &kv::Store) -> Result<(), String> {
        // An empty bucket delivers nothing to say the watch caught up.
        let mut stream = store.stream.clone();
        let empty = stream.info().await.map_err(|e| e.to_string())?.state.messages == 0;
        let mut w = store.watch_with_history(">").await.map_err(|e| e.to_string())?;
        let mut delivered = Some(HashSet::new());
        if empty {
            self.caught_up(delivered.take().as_ref());
        }
        while let Some(entry) = w.next().await {
            let entry = entry.map_err(|e| e.to_string())?;
            if let Some(keys) = delivered.as_mut() {
                keys.insert(entry.key.clone());
            }
            let caught_up = entry.delta == 0;
            let value = (entry.operation == kv::Operation::Put).then_some((entry.value, entry.revision));
            if let Some(l) = &self.listener {
                l.changed(&entry.key, value.as_ref().map(|(v, _)| &v[..]), Some(entry.revision));
            }
            self.apply(entry.key, value);
            if caught_up && delivered.is_some() {
                self.caught_up(delivered.take().as_ref());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_read_only_once_caught_up_and_drops_deleted_keys() {
        let m = Mirror::new("b".into(), None);
        m.apply("x".into(), Some((Bytes::from_static(b"1"), 1)));
        assert!(m.entries().is_none(), "history still coming");
        m.apply("y".into(), Some((Bytes::from_static(b"2"), 2)));
        m.caught_up(None);
        assert_eq!(m.entries().map(|e| e.len()), Some(2));
        m.apply("x".into(), None);
        let left: Vec<String> = m.entries().unwrap_or_default().into_iter().map(|e| e.0).collect();
        assert_eq!(left, ["y"]);
    }

    #[test]
    fn a_watch_opened_again_drops_the_keys_it_did_not_deliver() {
        let m = Mirror::new("b".into(), None);
        m.apply("x".into(), Some((Bytes::from_static(b"1"), 1)));
        m.apply("y".into(), Some((Bytes::from_static(b"2"), 2)));
        m.caught_up(None);
        // Opened again: only y is in the bucket now (x's marker purged).
        m.apply("y".into(), Some((Bytes::from_static(b"3"), 3)));
        m.caught_up(Some(&HashSet::from(["y".to_string()])));
        let left: Vec<(String, u64)> = m.entries().unwrap_or_default().into_iter().map(|e| (e.0, e.2)).collect();
        assert_eq!(left, [("y".to_string(), 3)]);
    }
}
