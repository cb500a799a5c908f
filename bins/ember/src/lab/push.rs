//! Lab 5, before: a push allocator. One scheduler thread owns the picture of
//! the fleet under one lock: which workers are idle, which task each busy one
//! holds and when it last sent a heartbeat. It pushes each pending task at an
//! idle worker's channel; a worker silent for longer than the timeout is
//! declared dead and its task re-dispatched (the preemption handling a push
//! design needs). Heartbeats are one-way, as a push worker sends them: the
//! worker learns nothing from them, so one that only stalled comes back,
//! finishes, and commits a task somebody else has also run.
use super::pushpull::{Run, Side};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Fleet {
    pending: VecDeque<usize>,
    idle: VecDeque<u64>,
    workers: HashMap<u64, Sender<usize>>,
    /// Task → (its worker, that worker's last heartbeat).
    assigned: HashMap<usize, (u64, Instant)>,
    next_worker: u64,
}

/// The allocator: the fleet behind one lock (parking_lot: short sections,
/// nothing blocks inside but a channel send that never waits), and what
/// using it cost.
#[derive(Default)]
struct Alloc {
    fleet: Mutex<Fleet>,
    calls: AtomicU64,
    spent_ns: AtomicU64,
    redispatched: AtomicU64,
    busy: AtomicUsize,
}

impl Alloc {
    /// Runs `f` under the lock, counting the call and the time it took
    /// (waiting for the lock included).
    fn with<T>(&self, f: impl FnOnce(&mut Fleet) -> T) -> T {
        let t = Instant::now();
        let out = f(&mut self.fleet.lock());
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.spent_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }

    /// A new worker, idle, with its channel.
    fn register(&self) -> (u64, Receiver<usize>) {
        let (tx, rx) = channel();
        self.with(|f| {
            let id = f.next_worker;
            f.next_worker += 1;
            f.workers.insert(id, tx);
            f.idle.push_back(id);
            (id, rx)
        })
    }

    /// The scheduler's pass: declare the silent dead and requeue their
    /// tasks, then push pending tasks at idle workers.
    fn schedule(&self, r: &Run) {
        self.with(|f| {
            let now = Instant::now();
            let dead: Vec<(usize, u64)> = (f.assigned.iter())
                .filter(|(_, (_, beat))| now.duration_since(*beat) > r.w.timeout)
                .map(|(t, (w, _))| (*t, *w))
                .collect();
            for (task, w) in dead {
                f.assigned.remove(&task);
                f.workers.remove(&w);
                f.idle.retain(|x| *x != w);
                f.pending.push_front(task);
                self.redispatched.fetch_add(1, Ordering::Relaxed);
            }
            while let (Some(&task), Some(w)) = (f.pending.front(), f.idle.pop_front()) {
                if f.workers.get(&w).is_some_and(|tx| tx.send(task).is_ok()) {
                    f.pending.pop_front();
                    f.assigned.insert(task, (w, now));
                    r.started(task);
                }
            }
        });
    }
}

pub fn run(r: Arc<Run>) -> anyhow::Result<Side> {
    let a = Alloc::default();
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..r.w.tasks.len() {
                r.wait_submit(i);
                r.submitted(i);
                a.with(|f| f.pending.push_back(i));
            }
        });
        for _ in 0..r.w.workers {
            s.spawn(|| worker(&r, &a));
        }
        while !r.stop.load(Ordering::SeqCst) {
            a.schedule(&r);
            let quiet = r.all_done() && a.busy.load(Ordering::SeqCst) == 0;
            if quiet || r.over_limit() {
                r.stop.store(true, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    let spent = Duration::from_nanos(a.spent_ns.load(Ordering::Relaxed));
    Ok(Side::from_run(&r, a.redispatched.load(Ordering::Relaxed), 0, a.calls.load(Ordering::Relaxed), spent))
}

/// One worker slot: takes what is pushed at it, heartbeats while working,
/// commits, reports. A crash ends this worker; a fresh one registers after
/// the restart delay.
fn worker(r: &Run, a: &Alloc) {
    let (mut id, mut rx) = a.register();
    while !r.stop.load(Ordering::SeqCst) {
        let task = match rx.recv_timeout(Duration::from_millis(5)) {
            Ok(t) => t,
            Err(RecvTimeoutError::Timeout) => continue,
            // Declared dead while idle: come back as a new worker.
            Err(RecvTimeoutError::Disconnected) => {
                (id, rx) = a.register();
                continue;
            }
        };
        a.busy.fetch_add(1, Ordering::SeqCst);
        let beat = || {
            a.with(|f| match f.assigned.get_mut(&task) {
                Some((w, t)) if *w == id => *t = Instant::now(),
                _ => {}
            });
            true
        };
        match r.work(task, beat) {
            Err(()) => {
                a.busy.fetch_sub(1, Ordering::SeqCst);
                std::thread::sleep(r.w.restart);
                (id, rx) = a.register();
                continue;
            }
            Ok(_) => r.commit(task),
        }
        let back = a.with(|f| {
            if f.assigned.get(&task).is_some_and(|(w, _)| *w == id) {
                f.assigned.remove(&task);
            }
            let alive = f.workers.contains_key(&id);
            if alive {
                f.idle.push_back(id);
            }
            alive
        });
        if !back {
            (id, rx) = a.register();
        }
        a.busy.fetch_sub(1, Ordering::SeqCst);
    }
}
