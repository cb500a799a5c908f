//! Lab 5, push to pull: one workload, one fault plan, two ways to hand out
//! work. Before (`push.rs`): a central allocator that tracks which worker is
//! idle, pushes each task at one, watches heartbeats under its lock and
//! re-dispatches the task of a worker it declares dead. After (`pull.rs`):
//! the same workers pull from ember's own queue (`ember_queue::EmbeddedQueue`,
//! its journal on disk) with leases, heartbeats and fenced reports.
//!
//! Faults, the same on both sides, on a task's first run only: a worker
//! crashes halfway (its thread ends; a fresh worker replaces it), or stalls
//! for several timeouts (a GC pause, a frozen VM) and then carries on.
//! Every finished run commits one effect into a result store; a task's
//! effects are counted at the end: 1 is right, 0 is lost work, 2+ is double
//! scheduling. The lab also counts, per interactive task, the batch tasks
//! that started after it arrived and before it started (overtakes).
use super::report::{LabReport, Table};
use super::{pull, push, svg, Scale};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    None,
    Crash,
    Pause,
}

pub struct TaskDef {
    pub id: String,
    pub interactive: bool,
    /// Offset from the run's start at which it is submitted.
    pub submit_at: Duration,
    pub fault: Fault,
}

/// The workload and the timing of the protocol, the same for both sides.
pub struct Workload {
    pub tasks: Vec<TaskDef>,
    pub workers: usize,
    /// A task's work, done in heartbeat-long slices.
    pub work: Duration,
    pub beat: Duration,
    /// Silence after which a worker (push) or a lease (pull) is given up.
    pub timeout: Duration,
    pub pause: Duration,
    pub restart: Duration,
    /// The run stops here even if tasks are left (they count as lost).
    pub limit: Duration,
}

impl Workload {
    fn of(scale: Scale) -> Workload {
        let (batch, interactive, workers) = match scale {
            Scale::Small => (160, 20, 6),
            Scale::Full => (1600, 200, 16),
        };
        let mut tasks = Vec::new();
        for i in 0..batch + interactive {
            let is_i = i >= batch;
            // Batch work is the backlog at the start; interactive work
            // arrives every 10 ms while it is being worked off.
            let submit_at = if is_i { Duration::from_millis(10 * (i - batch + 1) as u64) } else { Duration::ZERO };
            let fault = match i % 10 {
                3 => Fault::Crash,
                7 => Fault::Pause,
                _ => Fault::None,
            };
            tasks.push(TaskDef { id: format!("t{i:05}"), interactive: is_i, submit_at, fault });
        }
        Workload {
            tasks,
            workers,
            work: Duration::from_millis(20),
            beat: Duration::from_millis(10),
            timeout: Duration::from_millis(100),
            pause: Duration::from_millis(500),
            restart: Duration::from_millis(50),
            limit: Duration::from_secs(120),
        }
    }
}

/// What both sides share while running: the result store, the fault plan's
/// state, the start order, and the stop flag.
pub struct Run {
    pub w: Workload,
    pub start: Instant,
    /// Effects committed per task. A std-style mutex (parking_lot): the
    /// section is one increment, nothing blocks inside.
    pub effects: Mutex<Vec<u32>>,
    fault_spent: Vec<AtomicBool>,
    /// Start order: every dispatch or lease takes the next number.
    seq: AtomicU64,
    /// (sequence number at submission, at first start) per task.
    pub order: Mutex<Vec<(Option<u64>, Option<u64>)>>,
    /// When each task was submitted, and how long it then waited to start.
    submitted_at: Mutex<Vec<Option<Instant>>>,
    pub waits: Mutex<Vec<Option<Duration>>>,
    pub stop: AtomicBool,
    pub crashes: AtomicU64,
    pub pauses: AtomicU64,
}

impl Run {
    pub fn new(w: Workload) -> Arc<Run> {
        let n = w.tasks.len();
        Arc::new(Run {
            w,
            start: Instant::now(),
            effects: Mutex::new(vec![0; n]),
            fault_spent: (0..n).map(|_| AtomicBool::new(false)).collect(),
            seq: AtomicU64::new(0),
            order: Mutex::new(vec![(None, None); n]),
            submitted_at: Mutex::new(vec![None; n]),
            waits: Mutex::new(vec![None; n]),
            stop: AtomicBool::new(false),
            crashes: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
        })
    }

    /// The task's fault, once: later runs of it are clean.
    pub fn take_fault(&self, i: usize) -> Fault {
        let f = self.w.tasks[i].fault;
        if f == Fault::None || self.fault_spent[i].swap(true, Ordering::SeqCst) {
            return Fault::None;
        }
        match f {
            Fault::Crash => self.crashes.fetch_add(1, Ordering::Relaxed),
            _ => self.pauses.fetch_add(1, Ordering::Relaxed),
        };
        f
    }

    pub fn submitted(&self, i: usize) {
        self.submitted_at.lock()[i] = Some(Instant::now());
        self.order.lock()[i].0 = Some(self.seq.load(Ordering::SeqCst));
    }

    /// A dispatch (push) or a lease (pull) of task `i`.
    pub fn started(&self, i: usize) {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        let mut o = self.order.lock();
        if o[i].1.is_none() {
            o[i].1 = Some(n);
            self.waits.lock()[i] = self.submitted_at.lock()[i].map(|t| t.elapsed());
        }
    }

    pub fn commit(&self, i: usize) {
        self.effects.lock()[i] += 1;
    }

    /// Sleeps until the task's submission time.
    pub fn wait_submit(&self, i: usize) {
        let at = self.start + self.w.tasks[i].submit_at;
        std::thread::sleep(at.saturating_duration_since(Instant::now()));
    }

    pub fn all_done(&self) -> bool {
        self.effects.lock().iter().all(|e| *e > 0)
    }

    pub fn over_limit(&self) -> bool {
        self.start.elapsed() > self.w.limit
    }

    /// Does the task's work in heartbeat slices; `beat` is called after each
    /// and may end the run (false: the grant is gone). Applies the task's
    /// fault halfway: `Err(())` is a crash.
    pub fn work(&self, i: usize, mut beat: impl FnMut() -> bool) -> Result<bool, ()> {
        let slices = (self.w.work.as_millis() / self.w.beat.as_millis().max(1)).max(1);
        let fault = self.take_fault(i);
        for s in 0..slices {
            if s == slices / 2 {
                match fault {
                    Fault::Crash => return Err(()),
                    Fault::Pause => std::thread::sleep(self.w.pause),
                    Fault::None => {}
                }
            }
            std::thread::sleep(self.w.beat);
            if !beat() {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// What one side came to.
#[derive(Debug, Default, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Side {
    pub tasks: usize,
    pub exactly_once: usize,
    /// Tasks committed more than once, and the extra effects.
    pub duplicated: usize,
    pub extra_effects: u32,
    pub lost: usize,
    pub crashes: u64,
    pub pauses: u64,
    /// Re-dispatches (push) or expired leases (pull).
    pub given_up: u64,
    /// Runs that found their grant gone and committed nothing (pull).
    pub fenced: u64,
    /// Calls to the coordinator (the allocator's lock, the queue) and the
    /// time threads spent waiting to get into it.
    pub coordination_calls: u64,
    pub coordination_wait_ms: f64,
    pub elapsed_ms: f64,
    pub interactive_wait_p50_ms: f64,
    pub batch_wait_p50_ms: f64,
    /// Batch tasks started after an interactive task arrived and before it started, mean.
    pub overtakes_mean: f64,
}

impl Side {
    pub fn from_run(r: &Run, given_up: u64, fenced: u64, calls: u64, wait: Duration) -> Side {
        let effects = r.effects.lock().clone();
        let waits = r.waits.lock().clone();
        let ms = |interactive: bool| {
            let mut v: Vec<f64> = (r.w.tasks.iter().zip(&waits))
                .filter(|(t, _)| t.interactive == interactive)
                .filter_map(|(_, w)| w.map(|w| w.as_secs_f64() * 1000.0))
                .collect();
            v.sort_by(f64::total_cmp);
            crate::bench::stats::percentile(&v, 50.0).unwrap_or(0.0)
        };
        Side {
            tasks: effects.len(),
            exactly_once: effects.iter().filter(|e| **e == 1).count(),
            duplicated: effects.iter().filter(|e| **e > 1).count(),
            extra_effects: effects.iter().map(|e| e.saturating_sub(1)).sum(),
            lost: effects.iter().filter(|e| **e == 0).count(),
            crashes: r.crashes.load(Ordering::Relaxed),
            pauses: r.pauses.load(Ordering::Relaxed),
            given_up,
            fenced,
            coordination_calls: calls,
            coordination_wait_ms: wait.as_secs_f64() * 1000.0,
            elapsed_ms: r.start.elapsed().as_secs_f64() * 1000.0,
            interactive_wait_p50_ms: ms(true),
            batch_wait_p50_ms: ms(false),
            overtakes_mean: overtakes(r),
        }
    }
}

fn overtakes(r: &Run) -> f64 {
    let order = r.order.lock().clone();
    let batch: Vec<u64> =
        r.w.tasks.iter().zip(&order).filter(|(t, _)| !t.interactive).filter_map(|(_, o)| o.1).collect();
    let per: Vec<usize> = (r.w.tasks.iter().zip(&order))
        .filter(|(t, _)| t.interactive)
        .filter_map(|(_, o)| Some((o.0?, o.1?)))
        .map(|(sub, st)| batch.iter().filter(|b| **b >= sub && **b < st).count())
        .collect();
    per.iter().sum::<usize>() as f64 / per.len().max(1) as f64
}

pub async fn run(scale: Scale, dir: &Path) -> anyhow::Result<LabReport> {
    eprintln!("  before: a push allocator");
    let pushed = tokio::task::spawn_blocking(move || push::run(Run::new(Workload::of(scale)))).await??;
    eprintln!("  after: ember's pull queue");
    let journal = dir.join("queue");
    let pulled = tokio::task::spawn_blocking(move || pull::run(Run::new(Workload::of(scale)), &journal)).await??;
    let _ = std::fs::remove_dir_all(dir.join("queue"));
    build(&pushed, &pulled, scale, dir)
}

/// A table row: its label and how to read it off one side.
type Row = (&'static str, fn(&Side) -> String);

fn build(push: &Side, pull: &Side, scale: Scale, dir: &Path) -> anyhow::Result<LabReport> {
    let mut r = LabReport::new(super::lab(5), scale);
    let w = Workload::of(scale);
    r.tables.push(table(push, pull, &w));
    checks(&mut r, push, pull);
    let bars = vec![
        ("push: doubled".to_string(), push.duplicated as f64),
        ("push: lost".to_string(), push.lost as f64),
        ("pull: doubled".to_string(), pull.duplicated as f64),
        ("pull: lost".to_string(), pull.lost as f64),
    ];
    r.chart(dir, "wrong-runs.svg", svg::bars("Tasks run twice or lost", "tasks", &bars))?;
    let waits = vec![
        ("push interactive".to_string(), push.interactive_wait_p50_ms),
        ("pull interactive".to_string(), pull.interactive_wait_p50_ms),
        ("push batch".to_string(), push.batch_wait_p50_ms),
        ("pull batch".to_string(), pull.batch_wait_p50_ms),
    ];
    r.chart(dir, "waits.svg", svg::bars("Wait to start, p50", "ms", &waits))?;
    let mut faults = BTreeMap::new();
    for t in &w.tasks {
        *faults.entry(format!("{:?}", t.fault).to_lowercase()).or_insert(0usize) += 1;
    }
    r.data = serde_json::json!({ "push": push, "pull": pull, "faultPlan": faults, "workers": w.workers });
    Ok(r)
}

fn table(push: &Side, pull: &Side, w: &Workload) -> Table {
    let title = format!(
        "{} tasks, {} workers; first runs: {} crash, {} stall {} ms (timeout {} ms)",
        w.tasks.len(),
        w.workers,
        push.crashes,
        push.pauses,
        w.pause.as_millis(),
        w.timeout.as_millis()
    );
    let mut t = Table::new(&title, &["", "push allocator", "ember pull queue"]);
    let rows: [Row; 10] = [
        ("ran exactly once", |s| s.exactly_once.to_string()),
        ("double scheduled (tasks)", |s| s.duplicated.to_string()),
        ("extra effects", |s| s.extra_effects.to_string()),
        ("lost", |s| s.lost.to_string()),
        ("given up (re-dispatched / lease expired)", |s| s.given_up.to_string()),
        ("stale runs refused at report", |s| s.fenced.to_string()),
        ("coordination calls / ms spent in them", |s| {
            format!("{} / {:.1}", s.coordination_calls, s.coordination_wait_ms)
        }),
        ("interactive wait p50 ms", |s| format!("{:.1}", s.interactive_wait_p50_ms)),
        ("batch wait p50 ms", |s| format!("{:.1}", s.batch_wait_p50_ms)),
        ("batch tasks overtaking an interactive one (mean)", |s| format!("{:.1}", s.overtakes_mean)),
    ];
    for (name, f) in rows {
        t.row(vec![name.into(), f(push), f(pull)]);
    }
    t
}

fn checks(r: &mut LabReport, push: &Side, pull: &Side) {
    r.check(
        "the push allocator double-scheduled",
        push.duplicated > 0,
        format!("{} tasks ran twice or more after {} stalls", push.duplicated, push.pauses),
    );
    r.check(
        "the pull queue ran every task's effect exactly once",
        pull.exactly_once == pull.tasks,
        format!("{} of {}: {} doubled, {} lost", pull.exactly_once, pull.tasks, pull.duplicated, pull.lost),
    );
    r.check(
        "the pull queue's tiers held under load",
        pull.overtakes_mean < push.overtakes_mean,
        format!(
            "batch tasks overtaking an interactive one: {:.1} pulled, {:.1} pushed",
            pull.overtakes_mean, push.overtakes_mean
        ),
    );
    r.notes.push(format!(
        "The pull queue's calls include its journal: every change is fsynced before the call returns ({:.1} ms in {} calls here); the push allocator keeps its picture of the fleet in memory only, and loses it with its process.",
        pull.coordination_wait_ms, pull.coordination_calls
    ));
    r.notes.push("A push allocator that refused a stale worker's report would have to answer its heartbeats and fence its results: it would grant leases, which is what the pull queue does.".into());
}
