//! The sync trait over async-nats: each call is spawned on a small tokio
//! runtime owned by the queue and waited for on a std channel, so it works
//! from any thread: plain, `spawn_blocking`, or (blocking it) an async worker
//! of another runtime. Never `block_on`: that panics inside a runtime. The
//! same pattern as ember-snapshot's `S3Store`.
use ember_queue::QueueError;
use std::future::Future;

pub(crate) struct Bridge {
    /// `Some` until drop, which shuts it down in the background: dropping a
    /// runtime the ordinary way panics inside another runtime's context.
    rt: Option<tokio::runtime::Runtime>,
}

impl Bridge {
    pub(crate) fn new(name: &str) -> Result<Bridge, QueueError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ember-nats")
            .enable_all()
            .build()
            .map_err(|e| QueueError::Unavailable {
                op: "open",
                id: name.to_string(),
                reason: format!("starting its runtime: {e}"),
            })?;
        Ok(Bridge { rt: Some(rt) })
    }

    /// Runs `fut` on the bridge's runtime and waits for its result.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        op: &'static str,
        id: &str,
        fut: impl Future<Output = Result<T, QueueError>> + Send + 'static,
    ) -> Result<T, QueueError> {
        let gone = || QueueError::Unavailable { op, id: id.to_string(), reason: "the queue's runtime stopped".into() };
        let rt = self.rt.as_ref().ok_or_else(gone)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().map_err(|_| gone())?
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}
