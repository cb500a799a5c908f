//! The task upkeep's queue calls leave the async runtime free: a cluster's
//! prune that waited on the network (through a stream leader's election)
//! held a main-runtime worker of a drill node for over 10 s.
use super::{worker, TaskConfig, TaskService};
use ember_queue::{EmbeddedQueue, Expired, Lease, Outcome, Pruned, QueueError, QueueStats, TaskFilter, TaskQueue};
use ember_types::task::{TaskRecord, TaskSpec};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// The embedded queue, whose prune waits until the test lets it go.
struct HeldPrune {
    inner: EmbeddedQueue,
    /// Told when a prune starts.
    entered: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    release: Mutex<mpsc::Receiver<()>>,
}

impl TaskQueue for HeldPrune {
    fn submit(&self, id: &str, spec: TaskSpec) -> Result<(TaskRecord, bool), QueueError> {
        self.inner.submit(id, spec)
    }
    fn lease(&self, worker: &str) -> Result<Option<(Lease, TaskRecord)>, QueueError> {
        self.inner.lease(worker)
    }
    fn heartbeat(&self, lease: &Lease) -> Result<(), QueueError> {
        self.inner.heartbeat(lease)
    }
    fn started(&self, lease: &Lease, sandbox: &str, epoch: Option<u64>) -> Result<TaskRecord, QueueError> {
        self.inner.started(lease, sandbox, epoch)
    }
    fn placed(&self, lease: &Lease, sandbox: &str) -> Result<(), QueueError> {
        self.inner.placed(lease, sandbox)
    }
    fn finish(&self, lease: &Lease, outcome: Outcome) -> Result<TaskRecord, QueueError> {
        self.inner.finish(lease, outcome)
    }
    fn expire(&self) -> Result<Vec<Expired>, QueueError> {
        self.inner.expire()
    }
    fn cancel(&self, id: &str) -> Result<TaskRecord, QueueError> {
        self.inner.cancel(id)
    }
    fn prune(&self) -> Result<Vec<Pruned>, QueueError> {
        if let Some(tx) = self.entered.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = tx.send(());
        }
        let _ = self.release.lock().unwrap_or_else(|p| p.into_inner()).recv();
        self.inner.prune()
    }
    fn get(&self, id: &str) -> Result<TaskRecord, QueueError> {
        self.inner.get(id)
    }
    fn list(&self, filter: &TaskFilter) -> Result<Vec<TaskRecord>, QueueError> {
        self.inner.list(filter)
    }
    fn stats(&self) -> QueueStats {
        self.inner.stats()
    }
}

/// On a runtime of one thread, the test waits for the upkeep's prune to
/// start and then lets it go. It can only if the prune left that thread;
/// if not, a watchdog thread lets it go after a while, and the test fails
/// on that. (With the upkeep as a task of the runtime, as it was, the
/// watchdog had to.)
#[tokio::test(flavor = "current_thread")]
async fn a_prune_waiting_on_its_queue_leaves_the_runtime_free() {
    let dir = std::env::temp_dir().join(format!("ember-upkeep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = TaskConfig::default();
    // A prune every 100 ms.
    cfg.queue.retention.max_age_ms = Some(200);
    let inner = EmbeddedQueue::open(&dir.join("queue"), cfg.queue.clone(), ember_queue::system_clock()).unwrap();
    let (tx, rx) = mpsc::channel();
    let (entered_tx, entered) = tokio::sync::oneshot::channel();
    let queue = HeldPrune { inner, entered: Mutex::new(Some(entered_tx)), release: Mutex::new(rx) };
    let svc = Arc::new(TaskService {
        cfg,
        queue: Arc::new(queue),
        logs: dir.join("logs"),
        wake: Default::default(),
        poller: Default::default(),
        metrics: super::metrics::TaskMetrics::new(),
        reapers: Arc::new(tokio::sync::Semaphore::new(1)),
    });
    let by_watchdog = Arc::new(AtomicBool::new(false));
    let (wtx, flag) = (tx.clone(), by_watchdog.clone());
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(20));
        flag.store(true, Ordering::SeqCst);
        let _ = wtx.send(());
    });
    let stop = Arc::new(AtomicBool::new(false));
    let alive = {
        let stop = stop.clone();
        move || !stop.load(Ordering::SeqCst)
    };
    worker::spawn_upkeep(alive, svc).expect("upkeep started");
    entered.await.expect("the prune started");
    let _ = tx.send(());
    stop.store(true, Ordering::SeqCst);
    assert!(
        !by_watchdog.load(Ordering::SeqCst),
        "the prune held the runtime's only thread until the watchdog let it go"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
