//! The end of the drill: every task whose submit answered must end
//! Succeeded with exactly one successful attempt (its effect), and every
//! record a session wrote must be in its workspace, intact.
use super::faults::Faults;
use super::session::{parse_records, Session, Shared};
use ember_client::Client;
use ember_types::task::{TaskRecord, TaskState};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the queue gets to finish the tasks after the sessions stop (a
/// killed worker's lease runs out first).
const TASKS_WITHIN: Duration = Duration::from_secs(300);

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskFigures {
    /// Submits that answered (the task is acknowledged).
    pub acknowledged: u64,
    pub succeeded: u64,
    /// Acknowledged, and ended other than Succeeded (failed, cancelled,
    /// dead-lettered).
    pub lost: u64,
    /// Acknowledged, and not ended (or not found) when the wait ran out.
    pub unfinished: u64,
    /// More than one successful attempt, or one key answered with two ids.
    pub duplicated: u64,
    pub retried: u64,
    pub lost_ids: Vec<String>,
    pub duplicated_ids: Vec<String>,
}

/// Successful attempts: exit 0 recorded, no failure reason.
fn effects(t: &TaskRecord) -> usize {
    t.attempts.iter().filter(|a| a.exit_code == Some(0) && a.reason.is_none()).count()
}

pub async fn tasks(clients: &[Client], faults: &Faults, sessions: &[Session]) -> TaskFigures {
    let live: Vec<&Client> = clients
        .iter()
        .enumerate()
        .filter(|(i, _)| faults.victims.iter().all(|v| v.host != format!("h{}", i + 1)))
        .map(|(_, c)| c)
        .collect();
    let mut f = TaskFigures::default();
    let mut by_key: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for s in sessions {
        for (k, id) in &s.r.tasks {
            by_key.entry(k.as_str()).or_default().insert(id.as_str());
        }
    }
    for (k, ids) in &by_key {
        if ids.len() > 1 {
            f.duplicated += 1;
            f.duplicated_ids.push(format!("key {k}: {ids:?}"));
        }
    }
    let mut pending: BTreeSet<&str> = by_key.values().flatten().copied().collect();
    f.acknowledged = pending.len() as u64;
    let (start, mut turn) = (Instant::now(), 0usize);
    let mut done: Vec<TaskRecord> = Vec::new();
    // One list per round (thousands of tasks: one get each would take a
    // round longer than the wait under load).
    while !pending.is_empty() && start.elapsed() < TASKS_WITHIN && !live.is_empty() {
        turn += 1;
        if let Ok(all) = live[turn % live.len()].list_tasks("").await {
            for t in all {
                if t.state.is_terminal() && pending.remove(t.id.as_str()) {
                    done.push(t);
                }
            }
        }
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    for t in &done {
        let n = effects(t);
        f.retried += u64::from(t.attempts.len() > 1);
        if t.state == TaskState::Succeeded && n >= 1 {
            f.succeeded += 1;
        } else {
            f.lost += 1;
            f.lost_ids.push(format!("{} ({})", t.id, t.state.as_str()));
        }
        if n > 1 {
            f.duplicated += 1;
            f.duplicated_ids.push(format!("{}: {n} successful attempts", t.id));
        }
    }
    f.unfinished = pending.len() as u64;
    for id in pending.iter().take(5) {
        let at = match live.first() {
            Some(c) => c.get_task(id).await.map_err(|e| e.to_string()),
            None => Err("no live node to ask".into()),
        };
        f.lost_ids.push(format!("{id} (not ended: {})", stuck(at)));
    }
    f
}

/// Where an unfinished task stands, for the report: a drill that leaves one
/// behind is diagnosed from this alone (the cluster is gone afterwards).
fn stuck(at: Result<TaskRecord, String>) -> String {
    let t = match at {
        Ok(t) => t,
        Err(e) => return format!("not readable: {e}"),
    };
    let last = t.transitions.last().map(|x| format!("{} at {} ms", x.state.as_str(), x.at_ms));
    let attempt = t.attempts.last().map(|a| format!("attempt {} by {}", a.attempt, a.worker));
    format!(
        "{}, submitted at {} ms, last transition {}, {}",
        t.state.as_str(),
        t.submitted_at_ms,
        last.as_deref().unwrap_or("none"),
        attempt.as_deref().unwrap_or("never leased"),
    )
}

/// Reads every session's records (all at once: a session whose node died
/// waits through the whole retry policy) and counts what is missing or bad;
/// for a session of a lost node, when its sandbox was made again.
pub async fn records(sessions: Vec<Session>, shared: &Arc<Shared>) -> Vec<Session> {
    let reads: Vec<_> = sessions
        .into_iter()
        .map(|mut s| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let data = s.read_records().await;
                check(&mut s, data.as_deref());
                if shared.faulted.lock().contains_key(&s.r.node) {
                    s.r.remade_ms = s.made_at(&shared).await;
                }
                s
            })
        })
        .collect();
    let mut out = Vec::new();
    for r in reads {
        if let Ok(s) = r.await {
            out.push(s);
        }
    }
    out.sort_by_key(|s| s.r.index);
    out
}

fn check(s: &mut Session, data: Option<&[u8]>) {
    let r = &mut s.r;
    let unwritten: BTreeSet<u64> = r.unwritten.iter().copied().collect();
    let (seen, bad) = match data {
        Some(d) => parse_records(r.index, d),
        None if r.sandbox.is_none() => return,
        None => (BTreeMap::new(), 0),
    };
    r.readable = data.is_some();
    r.corrupted = bad;
    let lost: Vec<u64> = (1..=r.written).filter(|q| !unwritten.contains(q) && !seen.contains_key(q)).collect();
    r.written_lost = lost.len() as u64;
    r.acked_lost = lost.iter().filter(|q| r.is_acked(**q)).count() as u64;
}
