//! One monitor task per live sandbox: it waits for the init to exit, the OOM
//! killer to fire, the TTL to run out, or a stop request, then tears the sandbox
//! down and records the terminal state with its reason. Checkpoint and restore
//! go through it too, so the Sentry's exit after a checkpoint is not taken for
//! the sandbox's end and the restored init's pidfd replaces the old one.
use crate::record::now_ms;
use crate::{Control, Engine, EngineError, Entry};
use ember_runtime::ExitKind;
use ember_runtime::Launched;
use ember_types::{SandboxId, SandboxState, TerminationReason};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot};

pub(crate) fn spawn(engine: Arc<Engine>, entry: Arc<Entry>, launched: Launched, rx: mpsc::Receiver<Control>) {
    spawn_with(engine, entry, Some(launched), rx)
}

/// A monitor for a checkpointed sandbox found after a restart: no process
/// until a `Control::Restore`; its TTL and removal work as for a live one.
pub(crate) fn spawn_checkpointed(engine: Arc<Engine>, entry: Arc<Entry>, rx: mpsc::Receiver<Control>) {
    spawn_with(engine, entry, None, rx)
}

fn spawn_with(engine: Arc<Engine>, entry: Arc<Entry>, launched: Option<Launched>, rx: mpsc::Receiver<Control>) {
    tokio::spawn(async move {
        let id = entry.snapshot().id;
        if let Err(e) = run(engine, entry, launched, rx).await {
            tracing::error!(sandbox = %id, error = %e, "sandbox monitor failed");
        }
    });
}

/// The running init's descriptors; none while the sandbox is checkpointed.
struct Live {
    pidfd: AsyncFd<OwnedFd>,
    oom: Option<AsyncFd<OwnedFd>>,
}

impl Live {
    fn new(launched: Launched) -> std::io::Result<Live> {
        Ok(Live { pidfd: async_fd(launched.pidfd)?, oom: launched.oom.map(async_fd).transpose()? })
    }
}

async fn run(
    engine: Arc<Engine>,
    entry: Arc<Entry>,
    launched: Option<Launched>,
    mut rx: mpsc::Receiver<Control>,
) -> std::io::Result<()> {
    let mut live = launched.map(Live::new).transpose()?;
    let mut reply: Option<oneshot::Sender<()>> = None;
    let reason = loop {
        let deadline = entry.snapshot().expires_at_ms.map(|ms| {
            let left = (ms - now_ms()).max(0) as u64;
            tokio::time::Instant::now() + Duration::from_millis(left)
        });
        tokio::select! {
            r = exited(live.as_ref()) => {
                r?;
                let pidfd = live.as_ref().map(|l| l.pidfd.get_ref());
                break exit_reason(&engine, &entry, pidfd).await;
            }
            _ = oom_fired(live.as_ref().and_then(|l| l.oom.as_ref())) => {
                if wait_for_kill(&engine, &entry).await {
                    break TerminationReason::OOMKilled;
                }
            }
            _ = sleep_opt(deadline) => {
                if entry.snapshot().expires_at_ms.is_some_and(|ms| ms <= now_ms()) {
                    break TerminationReason::Expired;
                }
            }
            _ = entry.wake.notified() => {}
            c = rx.recv() => match c {
                Some(Control::Stop { reason, done }) => { reply = Some(done); break reason; }
                Some(Control::Checkpoint { done }) => {
                    let r = crate::checkpoint::checkpoint(&engine, &entry, live.is_some()).await;
                    if r.is_ok() {
                        // The Sentry has exited: its end is not the sandbox's.
                        live = None;
                    }
                    let _ = done.send(r);
                }
                Some(Control::Restore { done }) => {
                    let r = match crate::checkpoint::restore(&engine, &entry, live.is_none()).await {
                        Ok(l) => Live::new(l).map(|l| live = Some(l)).map_err(|e| EngineError::Internal(e.to_string())),
                        Err(e) => Err(e),
                    };
                    let _ = done.send(r);
                }
                None => break TerminationReason::Killed,
            }
        }
    };
    teardown(&engine, &entry, live.map(|l| l.pidfd.into_inner()), reason).await;
    if let Some(done) = reply {
        let _ = done.send(());
    }
    Ok(())
}

/// Resolves when the init exits; never while there is none (checkpointed).
async fn exited(live: Option<&Live>) -> std::io::Result<()> {
    match live {
        Some(l) => {
            let mut guard = l.pidfd.readable().await?;
            guard.clear_ready();
            Ok(())
        }
        None => std::future::pending().await,
    }
}

/// `AsyncFd::new` is deprecated in favour of the unsafe `register`, whose
/// contract (the fd is owned and stays valid) an `OwnedFd` already guarantees;
/// this crate forbids `unsafe`, so it keeps the safe constructor.
#[allow(deprecated, reason = "OwnedFd gives the I/O safety register() asks for")]
fn async_fd(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    AsyncFd::new(fd)
}

async fn oom_fired(oom: Option<&AsyncFd<OwnedFd>>) {
    match oom {
        Some(fd) => match fd.readable().await {
            Ok(mut g) => {
                ember_runtime::drain_fd(fd.get_ref());
                g.clear_ready();
            }
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// cgroup v1 signals an OOM when the kernel starts handling it, before the
/// victim is chosen and killed; the kill counter moves shortly after. Poll it
/// for up to a second. An OOM that ends without a kill (memory freed in time)
/// leaves the sandbox running.
async fn wait_for_kill(engine: &Arc<Engine>, entry: &Entry) -> bool {
    for _ in 0..50 {
        if engine.oom_kills(entry).await > 0 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

async fn sleep_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Why the init exited on its own.
async fn exit_reason(engine: &Arc<Engine>, entry: &Entry, pidfd: Option<&OwnedFd>) -> TerminationReason {
    if engine.oom_kills(entry).await > 0 {
        return TerminationReason::OOMKilled;
    }
    match pidfd.and_then(ember_runtime::try_wait) {
        Some(ExitKind::Code(c)) => TerminationReason::Exited(c),
        Some(ExitKind::Signal(_)) => TerminationReason::Killed,
        // Not our child (OCI classes): the runtime knows what the agent reported.
        _ => {
            let rec = entry.snapshot();
            let (rt, id) = (engine.rt(&rec.spec.runtime_class), rec.id);
            match tokio::task::spawn_blocking(move || rt.exit_code(&id)).await {
                Ok(Some(c)) => TerminationReason::Exited(c),
                _ => TerminationReason::Killed,
            }
        }
    }
}

/// Destroys a sandbox and reaps its init (our child, for the native class)
/// so it does not linger as a zombie. Blocking.
pub(crate) fn destroy_and_reap(
    rt: &dyn ember_runtime::Runtime,
    id: &SandboxId,
    pidfd: Option<OwnedFd>,
) -> Result<(), ember_runtime::RuntimeError> {
    let r = rt.destroy(id, pidfd.as_ref());
    for _ in 0..1000 {
        if pidfd.as_ref().is_none_or(ember_runtime::wait_done) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    r
}

/// Stopping → destroy → terminal state, persisted. The sandbox's record stays
/// (visible as Terminated/Failed) until removed or the retention passes.
async fn teardown(engine: &Arc<Engine>, entry: &Arc<Entry>, pidfd: Option<OwnedFd>, reason: TerminationReason) {
    let (id, class) = entry.update(|r| {
        r.transition(SandboxState::Stopping, None);
        (r.id.clone(), r.spec.runtime_class.clone())
    });
    // Only for a daemon crash mid-teardown: the terminal record below is the durable one.
    if let Err(e) = engine.store.save_volatile(id.as_str(), &entry.snapshot()) {
        tracing::error!(sandbox = %id, error = %e, "persisting sandbox record failed");
    }
    let rt = engine.rt(&class);
    let rid = id.clone();
    let res = tokio::task::spawn_blocking(move || destroy_and_reap(rt.as_ref(), &rid, pidfd)).await;
    let reason = match res {
        Ok(Ok(())) => reason,
        Ok(Err(e)) => TerminationReason::RuntimeError(format!("teardown: {e}")),
        Err(e) => TerminationReason::RuntimeError(format!("teardown task: {e}")),
    };
    tracing::info!(sandbox = %id, reason = %reason, "sandbox ended");
    engine.metrics.terminated.get_or_create(&crate::metrics::ReasonLabels { reason: reason.code() }).inc();
    entry.update(|r| r.transition(reason.terminal_state(), Some(reason)));
    let rec = entry.snapshot();
    engine.release_leases(rec.id.as_str(), &rec.workspaces);
    engine.release_network(&rec).await;
    if rec.pooled {
        // An idle pool member died: no caller knows it, so nothing to keep.
        if let Some(pool) = rec.pool.as_deref().and_then(|n| engine.pool(n).ok()) {
            pool.idle.lock().unwrap_or_else(|p| p.into_inner()).retain(|i| *i != rec.id);
            pool.wake.notify_one();
        }
        engine.sandboxes.lock().unwrap_or_else(|p| p.into_inner()).remove(&rec.id);
        let _ = engine.store.remove(rec.id.as_str());
        return;
    }
    engine.persist(entry);
}

impl Engine {
    pub(crate) async fn oom_kills(&self, entry: &Entry) -> u64 {
        let rec = entry.snapshot();
        let (rt, id) = (self.rt(&rec.spec.runtime_class), rec.id);
        tokio::task::spawn_blocking(move || rt.oom_kills(&id).unwrap_or(0)).await.unwrap_or(0)
    }
}
