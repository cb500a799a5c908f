//! Lab 5, after: the same workers pull from ember's queue
//! (`ember_queue::EmbeddedQueue`, the node's task queue, its journal fsynced
//! in the run's folder). Nobody tracks who is idle: a worker with a free
//! slot asks for the next task, in tier order. The lease it gets is renewed
//! by heartbeats; one not renewed for `lease_ms` expires and the task goes
//! back to the queue; every later call of the stale attempt is refused
//! (`QueueError::Fenced`), so a worker that only stalled learns that its
//! grant is gone and commits nothing.
use super::pushpull::{Run, Side};
use anyhow::Context;
use ember_queue::{system_clock, EmbeddedQueue, Outcome, QueueConfig, TaskQueue};
use ember_types::task::{TaskSpec, Tier};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The queue, and what using it cost (every call, its journal writes included).
struct Timed {
    q: EmbeddedQueue,
    calls: AtomicU64,
    spent_ns: AtomicU64,
    expired: AtomicU64,
    fenced: AtomicU64,
    busy: AtomicUsize,
}

impl Timed {
    fn call<T>(&self, f: impl FnOnce(&EmbeddedQueue) -> T) -> T {
        let t = Instant::now();
        let out = f(&self.q);
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.spent_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }
}

fn spec(r: &Run, interactive: bool) -> TaskSpec {
    TaskSpec {
        command: vec!["lab-5".into()],
        template: "host".into(),
        workspace: None,
        tier: if interactive { Tier::Interactive } else { Tier::Batch },
        key: None,
        timeout_secs: 60,
        max_attempts: 20,
        lease_ms: r.w.timeout.as_millis() as u64,
        heartbeat_ms: r.w.beat.as_millis() as u64,
        env: BTreeMap::new(),
        tenant: None,
        reuse_sandbox: false,
    }
}

pub fn run(r: Arc<Run>, journal: &Path) -> anyhow::Result<Side> {
    std::fs::create_dir_all(journal).with_context(|| format!("creating {}", journal.display()))?;
    // No aging within a run of seconds: the tiers are strict here.
    let cfg = QueueConfig { aging_ms: 3_600_000, ..Default::default() };
    let q = EmbeddedQueue::open(journal, cfg, system_clock()).context("opening the lab's task queue")?;
    let t = Timed {
        q,
        calls: AtomicU64::new(0),
        spent_ns: AtomicU64::new(0),
        expired: AtomicU64::new(0),
        fenced: AtomicU64::new(0),
        busy: AtomicUsize::new(0),
    };
    let submit = std::thread::scope(|s| {
        let submitter = s.spawn(|| {
            for (i, task) in r.w.tasks.iter().enumerate() {
                r.wait_submit(i);
                r.submitted(i);
                t.call(|q| q.submit(&task.id, spec(&r, task.interactive)))
                    .with_context(|| format!("submitting {}", task.id))?;
            }
            Ok::<_, anyhow::Error>(())
        });
        s.spawn(|| {
            while !r.stop.load(Ordering::SeqCst) {
                let n = t.call(|q| q.expire()).map_or(0, |e| e.len());
                t.expired.fetch_add(n as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        for n in 0..r.w.workers {
            let (r, t) = (&r, &t);
            s.spawn(move || worker(r, t, n));
        }
        while !r.stop.load(Ordering::SeqCst) {
            let quiet = r.all_done() && t.busy.load(Ordering::SeqCst) == 0;
            if quiet || r.over_limit() {
                r.stop.store(true, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        submitter.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the submitter panicked")))
    });
    submit?;
    let spent = Duration::from_nanos(t.spent_ns.load(Ordering::Relaxed));
    let (expired, fenced) = (t.expired.load(Ordering::Relaxed), t.fenced.load(Ordering::Relaxed));
    Ok(Side::from_run(&r, expired, fenced, t.calls.load(Ordering::Relaxed), spent))
}

/// One worker slot: lease, work with heartbeats, report; the effect is
/// committed only once the queue accepted the report from the current lease.
fn worker(r: &Run, t: &Timed, slot: usize) {
    let mut incarnation = 0;
    while !r.stop.load(Ordering::SeqCst) {
        let name = format!("w{slot}.{incarnation}");
        let Ok(Some((lease, rec))) = t.call(|q| q.lease(&name)) else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        let Some(i) = r.w.tasks.iter().position(|d| d.id == rec.id) else { continue };
        t.busy.fetch_add(1, Ordering::SeqCst);
        r.started(i);
        match r.work(i, || t.call(|q| q.heartbeat(&lease)).is_ok()) {
            Err(()) => {
                // Crashed: the lease is left to expire; a fresh worker takes the slot.
                t.busy.fetch_sub(1, Ordering::SeqCst);
                std::thread::sleep(r.w.restart);
                incarnation += 1;
                continue;
            }
            Ok(true) if t.call(|q| q.finish(&lease, Outcome::Succeeded)).is_ok() => r.commit(i),
            Ok(_) => {
                t.fenced.fetch_add(1, Ordering::Relaxed);
            }
        }
        t.busy.fetch_sub(1, Ordering::SeqCst);
    }
}
