//! One monitor task per live sandbox: it waits for the init to exit, the OOM
//! killer to fire, the TTL to run out, or a stop request, then tears the sandbox
//! down and records the terminal state with its reason.
use crate::record::now_ms;
use crate::{Control, Engine, Entry};
use ember_runtime::ExitKind;
use ember_runtime::Launched;
use ember_types::{SandboxState, TerminationReason};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot};

pub(crate) fn spawn(engine: Arc<Engine>, entry: Arc<Entry>, launched: Launched, rx: mpsc::Receiver<Control>) {
    tokio::spawn(async move {
        let id = entry.snapshot().id;
        if let Err(e) = run(engine, entry, launched, rx).await {
            tracing::error!(sandbox = %id, error = %e, "sandbox monitor failed");
        }
    });
}

async fn run(
    engine: Arc<Engine>,
    entry: Arc<Entry>,
    launched: Launched,
    mut rx: mpsc::Receiver<Control>,
) -> std::io::Result<()> {
    let pidfd = async_fd(launched.pidfd)?;
    let oom = launched.oom.map(async_fd).transpose()?;
    let mut reply: Option<oneshot::Sender<()>> = None;
    let reason = loop {
        let deadline = entry.snapshot().expires_at_ms.map(|ms| {
            let left = (ms - now_ms()).max(0) as u64;
            tokio::time::Instant::now() + Duration::from_millis(left)
        });
        tokio::select! {
            r = pidfd.readable() => {
                let mut guard = r?;
                guard.clear_ready();
                break exit_reason(&engine, &entry, pidfd.get_ref()).await;
            }
            _ = oom_fired(oom.as_ref()) => {
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
                None => break TerminationReason::Killed,
            }
        }
    };
    teardown(&engine, &entry, pidfd.into_inner(), reason).await;
    if let Some(done) = reply {
        let _ = done.send(());
    }
    Ok(())
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
async fn exit_reason(engine: &Arc<Engine>, entry: &Entry, pidfd: &OwnedFd) -> TerminationReason {
    if engine.oom_kills(entry).await > 0 {
        return TerminationReason::OOMKilled;
    }
    match ember_runtime::try_wait(pidfd) {
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

/// Stopping → destroy → terminal state, persisted. The sandbox's record stays
/// (visible as Terminated/Failed) until removed or the retention passes.
async fn teardown(engine: &Arc<Engine>, entry: &Arc<Entry>, pidfd: OwnedFd, reason: TerminationReason) {
    let (id, class) = entry.update(|r| {
        r.transition(SandboxState::Stopping, None);
        (r.id.clone(), r.spec.runtime_class.clone())
    });
    engine.persist(entry);
    let rt = engine.rt(&class);
    let rid = id.clone();
    let res = tokio::task::spawn_blocking(move || {
        let r = rt.destroy(&rid, Some(&pidfd));
        // Reap the init (our child) so it does not linger as a zombie.
        for _ in 0..1000 {
            if ember_runtime::wait_done(&pidfd) {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        r
    })
    .await;
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
