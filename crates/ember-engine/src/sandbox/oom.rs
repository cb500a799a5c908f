//! The OOM watch of the live sandboxes. A class reports its sandboxes' OOM
//! events to descriptors up to 64 of them share (`ember_runtime::oom`); here one task
//! per descriptor waits for it, reads the kill counters of the sandboxes
//! reported to it, and wakes the monitors of those that counted a kill. A
//! monitor then ends its sandbox as `OOMKilled`, as it did with a
//! descriptor of its own.
use ember_runtime::Runtime;
use ember_types::SandboxId;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

/// When the counters are read after a descriptor fires, ms: cgroup v1
/// signals when the kernel starts handling an OOM, before it picks and
/// kills the victim, so a kill may take a moment to show (the monitor
/// polled its own counter for a second before).
const READ_AT_MS: [u64; 7] = [0, 20, 50, 100, 200, 500, 1000];

/// Every shared descriptor watched, by its address.
#[derive(Default)]
pub(crate) struct OomHub {
    sources: Mutex<HashMap<usize, Arc<Source>>>,
}

/// One descriptor's sandboxes. It stays watched when the last leaves: the
/// runtime keeps the descriptor for its next sandbox, and a task aborted
/// then could still hold the descriptor's registration with the reactor
/// when that sandbox came (`AsyncFd::new` failing with `EEXIST`, its
/// monitor blind to the init's exit: seen once in the cgroup v2 guest, a
/// TTL of 1 s running out during the next create).
struct Source {
    members: Mutex<HashMap<SandboxId, Member>>,
}

struct Member {
    rt: Arc<dyn Runtime>,
    fired: Arc<Notify>,
}

/// A sandbox's place in the watch, left when dropped.
pub(crate) struct OomWatch {
    hub: Arc<OomHub>,
    key: usize,
    id: SandboxId,
    fired: Arc<Notify>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl OomHub {
    /// Watches `source` for sandbox `id` of runtime `rt` (inside the tokio
    /// runtime: the first sandbox of a descriptor starts its task).
    pub fn watch(
        self: &Arc<Self>,
        source: Arc<OwnedFd>,
        id: SandboxId,
        rt: Arc<dyn Runtime>,
    ) -> std::io::Result<OomWatch> {
        let key = Arc::as_ptr(&source) as usize;
        let mut sources = lock(&self.sources);
        let src = match sources.get(&key) {
            Some(s) => s.clone(),
            None => {
                let fd = async_fd(source)?;
                let s = Arc::new_cyclic(|me: &Weak<Source>| {
                    tokio::spawn(watch_source(fd, me.clone()));
                    Source { members: Mutex::default() }
                });
                sources.insert(key, s.clone());
                s
            }
        };
        let fired = Arc::new(Notify::new());
        lock(&src.members).insert(id.clone(), Member { rt, fired: fired.clone() });
        Ok(OomWatch { hub: self.clone(), key, id, fired })
    }
}

impl OomWatch {
    /// Resolves once the sandbox has counted an OOM kill.
    pub async fn fired(&self) {
        self.fired.notified().await
    }
}

impl Drop for OomWatch {
    fn drop(&mut self) {
        if let Some(src) = lock(&self.hub.sources).get(&self.key) {
            lock(&src.members).remove(&self.id);
        }
    }
}

/// `AsyncFd::new` is deprecated in favour of the unsafe `register`, whose
/// contract (the fd stays valid) the `Arc` it owns keeps; this crate
/// forbids `unsafe`.
#[allow(deprecated, reason = "the Arc<OwnedFd> it owns keeps the fd valid")]
fn async_fd(fd: Arc<OwnedFd>) -> std::io::Result<AsyncFd<Arc<OwnedFd>>> {
    AsyncFd::new(fd)
}

async fn watch_source(fd: AsyncFd<Arc<OwnedFd>>, src: Weak<Source>) {
    loop {
        match fd.readable().await {
            Ok(mut ready) => {
                ember_runtime::drain_fd(fd.get_ref());
                ready.clear_ready();
            }
            Err(e) => return tracing::error!(error = %e, "OOM watch: the shared descriptor failed"),
        }
        let Some(src) = src.upgrade() else { return };
        let members: Vec<_> =
            lock(&src.members).iter().map(|(id, m)| (id.clone(), m.rt.clone(), m.fired.clone())).collect();
        drop(src);
        // Fires that come meanwhile wait for the next round: the descriptor
        // stays readable.
        let _ = tokio::task::spawn_blocking(move || read_counters(members)).await;
    }
}

/// Wakes each sandbox whose kill counter moved off 0 within a second.
fn read_counters(mut left: Vec<(SandboxId, Arc<dyn Runtime>, Arc<Notify>)>) {
    let start = Instant::now();
    for at in READ_AT_MS {
        std::thread::sleep(Duration::from_millis(at).saturating_sub(start.elapsed()));
        left.retain(|(id, rt, fired)| {
            let killed = rt.oom_kills(id).unwrap_or(0) > 0;
            if killed {
                fired.notify_one();
            }
            !killed
        });
        if left.is_empty() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_runtime::RuntimeError;
    use ember_types::{BoundaryReport, SandboxSpec};

    /// The hub only reads kill counters, and only when a descriptor fires.
    struct NoRuntime;

    impl Runtime for NoRuntime {
        fn class(&self) -> &'static str {
            "none"
        }
        fn launch(&self, _: &SandboxId, _: &SandboxSpec) -> Result<ember_runtime::Launched, RuntimeError> {
            unreachable!()
        }
        fn adopt(&self, _: &SandboxId, _: i32, _: u64) -> Result<ember_runtime::Launched, RuntimeError> {
            unreachable!()
        }
        fn destroy(&self, _: &SandboxId, _: Option<&OwnedFd>) -> Result<(), RuntimeError> {
            unreachable!()
        }
        fn freeze(&self, _: &SandboxId, _: bool) -> Result<(), RuntimeError> {
            unreachable!()
        }
        fn oom_kills(&self, _: &SandboxId) -> Result<u64, RuntimeError> {
            Ok(0)
        }
        fn inject_mount(
            &self,
            _: &SandboxId,
            _: i32,
            _: &std::path::Path,
            _: &str,
            _: bool,
        ) -> Result<(), RuntimeError> {
            unreachable!()
        }
        fn host_ids(&self, uid: u32, gid: u32) -> (u32, u32) {
            (uid, gid)
        }
        fn memory_usage(&self, _: &SandboxId) -> Result<u64, RuntimeError> {
            unreachable!()
        }
        fn stats(&self, _: &SandboxId) -> Result<ember_types::SandboxStats, RuntimeError> {
            unreachable!()
        }
        fn boundary(&self, _: &SandboxId, _: i32) -> Result<BoundaryReport, RuntimeError> {
            unreachable!()
        }
        fn leftovers(&self) -> Result<Vec<String>, RuntimeError> {
            unreachable!()
        }
        fn reap_leftover(&self, _: &str) -> Result<(), RuntimeError> {
            unreachable!()
        }
    }

    /// A descriptor whose last sandbox left, taken by the next at once
    /// (before the scheduler runs again), is watched for it.
    #[tokio::test]
    async fn a_descriptor_its_last_sandbox_left_is_watched_again_at_once() {
        let hub = Arc::new(OomHub::default());
        let fd = Arc::new(ember_sys::fd::eventfd().expect("eventfd"));
        let rt: Arc<dyn Runtime> = Arc::new(NoRuntime);
        let first = hub.watch(fd.clone(), SandboxId::from_random([1; 16]), rt.clone()).expect("first watch");
        drop(first);
        let second = hub.watch(fd.clone(), SandboxId::from_random([2; 16]), rt);
        assert!(second.is_ok(), "the next sandbox's watch: {:?}", second.err());
    }
}
