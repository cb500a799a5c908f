//! Rebind standbys, the cluster's side (the engine's is `ember_engine`'s
//! `pool/standby.rs`). Each heartbeat a node works out which rebind
//! sandboxes of the other nodes it would re-create were their node to die:
//! those it is the first or second survivor for ([`COPIES`]) in the order
//! `takeover.rs` prefers them, by rendezvous hashing over the live nodes
//! that run sandboxes with the sandbox's own node left out (an order the
//! death of other nodes does not change among those left). For each it
//! keeps a standby, the sandbox's launch done ahead, so that its rebind is a
//! warm claim: on the 300-session drill a cold start was 399 ms of a
//! rebind's 540 (p50), and a survivor ran about 13 rebinds four at a time;
//! and a node that keeps one takes the orphan at once (`takeover.rs`). At
//! most `--rebind-standbys` per node (idle, a native standby holds about a
//! megabyte and no CPU); started [`STARTS_AT_ONCE`] at a time behind the
//! claims, none while the cluster recovers (a rebind under way or a dead
//! node's sandbox not yet claimed), and removed once not wanted.
use super::plane::ClusterPlane;
#[cfg(test)]
use super::takeover::preferred;
use super::takeover::rank;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How many standbys a node keeps at most, by default
/// (`ember serve --rebind-standbys`).
pub const REBIND_STANDBYS: usize = 128;

/// How many survivors keep a standby of each sandbox: its first and second
/// preferred. With the first alone, the sandboxes whose first survivor died
/// with their node (about a fifth when 3 nodes of 10 die) and those another
/// node took after the takeover's grace started cold, and on the
/// 300-session drill those were the slowest sessions back (32 of 90 rebinds
/// cold; the 5 slowest sessions all among them). The second keeps one where
/// the first is gone, and a node that keeps one takes its orphan at once.
pub const COPIES: usize = 2;

/// How many standbys a node starts at once: one at a time, a node's 60 took
/// longer than the drill's warm-up (about a second each, behind the claims
/// at the least CPU weight on a host 99 % busy).
const STARTS_AT_ONCE: usize = 2;

/// A node's standbys: its cap, whether its upkeep is at work, how many it
/// holds (`ember_cluster_rebind_standbys`).
pub(super) struct Standbys {
    cap: usize,
    working: AtomicBool,
    pub(super) held: AtomicU64,
    /// Launches that failed, and when: not tried again for [`RETRY_AFTER`].
    failed: Mutex<HashMap<String, Instant>>,
}

/// How long a standby whose launch failed is left before it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

impl Standbys {
    pub(super) fn new(cap: usize) -> Standbys {
        Standbys { cap, working: AtomicBool::new(false), held: AtomicU64::new(0), failed: Mutex::default() }
    }

    fn failed_lately(&self) -> Vec<String> {
        let mut failed = super::fence::lock(&self.failed);
        failed.retain(|_, at| at.elapsed() < RETRY_AFTER);
        failed.keys().cloned().collect()
    }
}

/// A rebind entry as the plan reads it.
pub struct Wanted<'a> {
    pub id: &'a str,
    /// The node that holds it.
    pub node: &'a str,
    /// A restore of a sandbox snapshot has no standby.
    pub from_snapshot: bool,
}

/// What the upkeep changes: standbys to start, and to remove.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub start: Vec<String>,
    pub remove: Vec<String>,
}

/// The plan of node `me`, given the rebind `entries`, the live nodes that
/// run sandboxes (`runners`), the standbys it has, the ids it must leave
/// alone (`busy`: a sandbox of that id here, a launch that failed lately)
/// and its `cap`. Kept: the entries of other nodes this node is among the
/// first [`COPIES`] survivors for, those of a dead node included (the rebind
/// will claim them), first copies before second ones, the first `cap`;
/// started only for a live node's.
pub fn plan(
    entries: &[Wanted<'_>],
    me: &str,
    runners: &[String],
    have: &HashSet<String>,
    busy: &HashSet<String>,
    cap: usize,
) -> Plan {
    // Where this node stands for each: among the first COPIES survivors.
    let standing = |e: &Wanted<'_>| {
        let others: Vec<String> = runners.iter().filter(|n| n.as_str() != e.node).cloned().collect();
        rank(e.id, me, &others).filter(|r| *r < COPIES)
    };
    let mut kept: Vec<(usize, &Wanted<'_>)> = entries
        .iter()
        .filter(|e| e.node != me && !e.from_snapshot)
        .filter_map(|e| standing(e).map(|r| (r, e)))
        .collect();
    // First copies first, then by id: the cap cuts the second copies.
    kept.sort_by_key(|(r, e)| (*r, e.id));
    kept.truncate(cap);
    let keep: HashSet<&str> = kept.iter().map(|(_, e)| e.id).collect();
    let live = |e: &&Wanted<'_>| runners.iter().any(|n| n == e.node);
    let new = |e: &&Wanted<'_>| !have.contains(e.id) && !busy.contains(e.id);
    let start = kept.iter().map(|(_, e)| *e).filter(live).filter(new).map(|e| e.id.to_string()).collect();
    let mut remove: Vec<String> =
        have.iter().filter(|id| !keep.contains(id.as_str()) && !busy.contains(*id)).cloned().collect();
    remove.sort();
    Plan { start, remove }
}

impl ClusterPlane {
    /// Each heartbeat: the standbys brought toward the plan, by one task at
    /// a time (removals, then a few starts), none while the cluster recovers.
    pub(super) async fn standby_upkeep(self: &Arc<Self>) {
        let Some(work) = self.standby_work().await else { return };
        self.standbys.working.store(true, Ordering::Relaxed);
        let me = self.clone();
        tokio::spawn(async move {
            for id in work.remove {
                match me.local().remove_standby(&id).await {
                    Ok(()) => tracing::info!(sandbox = %id, "rebind standby removed: no longer this node's"),
                    Err(e) => tracing::warn!(sandbox = %id, error = %e, "rebind standby: remove"),
                }
            }
            futures_util::future::join_all(work.start.into_iter().map(|req| me.start_standby(req))).await;
            me.standbys.working.store(false, Ordering::Relaxed);
        });
    }

    /// What the upkeep does now: the standbys to remove and the launches to
    /// start (`None`: nothing, or not now).
    async fn standby_work(&self) -> Option<Work> {
        let sb = &self.standbys;
        // Read after the last task's end: one read during it missed the
        // standby it was starting, and started it again.
        let working = sb.working.load(Ordering::Relaxed);
        let have: HashSet<String> = self.local().standbys().await.into_iter().collect();
        sb.held.store(have.len() as u64, Ordering::Relaxed);
        if self.api_only() || working || !super::fence::lock(&self.fence.inflight).is_empty() {
            return None;
        }
        let entries = self.rebind_entries().ok()?;
        let runners: Vec<String> = self.nodes.live().into_iter().filter(|n| !n.api_only).map(|n| n.name).collect();
        // While the cluster recovers (a rebind under way anywhere, or a dead
        // node's sandbox not claimed yet), the cores are the rebinds'.
        if entries.iter().any(|(_, e, _)| e.pending || !runners.contains(&e.node)) {
            return None;
        }
        // A sandbox of that id here (a stale copy), or a launch that failed
        // lately: left alone.
        let here = self.local().list(&ember_engine::ListFilter::default()).await.ok()?;
        let mut busy: HashSet<String> = here.into_iter().map(|r| r.id.to_string()).collect();
        busy.extend(sb.failed_lately());
        let wanted: Vec<Wanted<'_>> = entries
            .iter()
            .map(|(id, e, _)| Wanted { id, node: &e.node, from_snapshot: e.req.snapshot_id.is_some() })
            .collect();
        let mut plan = plan(&wanted, self.name(), &runners, &have, &busy, sb.cap);
        let start: Vec<ember_engine::CreateSandbox> = (plan.start.drain(..).take(STARTS_AT_ONCE))
            .filter_map(|id| {
                let (_, e, _) = entries.iter().find(|(i, _, _)| *i == id)?;
                let id = ember_types::SandboxId::try_from(id).ok()?;
                Some(ember_engine::CreateSandbox { id: Some(id), ..e.req.clone() })
            })
            .collect();
        (!plan.remove.is_empty() || !start.is_empty()).then_some(Work { remove: plan.remove, start })
    }
}

/// One upkeep's task: standbys removed, then launches started.
struct Work {
    remove: Vec<String>,
    start: Vec<ember_engine::CreateSandbox>,
}

impl ClusterPlane {
    async fn start_standby(&self, req: ember_engine::CreateSandbox) {
        let id = req.id.clone().map(|i| i.to_string()).unwrap_or_default();
        match self.local().launch_standby(req).await {
            Ok(()) => tracing::info!(sandbox = %id, "rebind standby started"),
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "rebind standby: launch; not tried again for a while");
                super::fence::lock(&self.standbys.failed).insert(id, Instant::now());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    fn entries(ids: &[String], node: &str) -> Vec<(String, String)> {
        ids.iter().map(|i| (i.clone(), node.to_string())).collect()
    }

    fn wanted(e: &[(String, String)]) -> Vec<Wanted<'_>> {
        e.iter().map(|(id, node)| Wanted { id, node, from_snapshot: false }).collect()
    }

    #[test]
    fn each_sandbox_has_standbys_on_the_survivors_the_takeover_prefers() {
        let runners = nodes(&["a", "b", "c", "d", "e"]);
        let ids: Vec<String> = (0..40).map(|i| format!("s{i}")).collect();
        let e = entries(&ids, "a");
        let none = HashSet::new();
        let mut holders: std::collections::HashMap<String, Vec<&str>> = Default::default();
        for me in ["a", "b", "c", "d", "e"] {
            for id in plan(&wanted(&e), me, &runners, &none, &none, 64).start {
                holders.entry(id).or_default().push(me);
            }
        }
        assert_eq!(holders.len(), 40, "every sandbox of a has some: {holders:?}");
        assert!(holders.values().all(|h| h.len() == COPIES && !h.contains(&"a")), "{holders:?}");
        // a dies with any one other node: the takeover's preferred survivor
        // among those left keeps a standby of each of a's sandboxes.
        for dead in ["b", "c", "d", "e"] {
            let left: Vec<String> = runners.iter().filter(|n| *n != "a" && *n != dead).cloned().collect();
            for (id, h) in &holders {
                let first = preferred(id, &left).expect("a survivor");
                assert!(h.contains(&first), "{id}: {first} of {left:?} keeps none, {h:?} do");
            }
        }
    }

    #[test]
    fn a_dead_nodes_standbys_are_kept_for_the_rebind_but_none_started() {
        let ids: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
        let e = entries(&ids, "a");
        let runners = nodes(&["b", "c"]);
        let none = HashSet::new();
        let mine: HashSet<String> = ids.iter().filter(|id| preferred(id, &runners) == Some("b")).cloned().collect();
        assert!(!mine.is_empty());
        let p = plan(&wanted(&e), "b", &runners, &mine, &none, 64);
        assert_eq!(p, Plan::default(), "a's are kept as they are, and no more started");
        let p = plan(&wanted(&e), "b", &nodes(&["a", "b", "c"]), &HashSet::new(), &none, 64);
        assert_eq!(p.start.len(), ids.len(), "with a alive they are started, b first or second for each");
        let firsts = p.start.iter().take_while(|id| preferred(id, &runners) == Some("b")).count();
        assert_eq!(firsts, mine.len(), "first copies first: {:?}", p.start);
    }

    #[test]
    fn the_cap_keeps_the_first_by_id_and_the_rest_is_removed() {
        let ids: Vec<String> = (0..30).map(|i| format!("s{i:02}")).collect();
        let e = entries(&ids, "a");
        let runners = nodes(&["a", "b"]);
        let have: HashSet<String> = ids.iter().cloned().collect();
        let p = plan(&wanted(&e), "b", &runners, &have, &HashSet::new(), 10);
        assert!(p.start.is_empty());
        assert_eq!(p.remove, ids[10..].to_vec());
    }

    #[test]
    fn own_sandboxes_restores_and_running_rebinds_are_left_alone() {
        let ids: Vec<String> = (0..6).map(|i| format!("s{i}")).collect();
        let mut e = entries(&ids[..2], "b");
        e.extend(entries(&ids[2..], "a"));
        let mut w = wanted(&e);
        w[2].from_snapshot = true;
        let runners = nodes(&["a", "b"]);
        // b holds s0 (its own now: a rebind claimed it) and s1, a stale one.
        let have: HashSet<String> = ["s1".to_string(), "s9".to_string()].into();
        let busy: HashSet<String> = ["s3".to_string(), "s9".to_string()].into();
        let p = plan(&w, "b", &runners, &have, &busy, 64);
        assert_eq!(p.start, vec!["s4".to_string(), "s5".to_string()], "not own, not a restore, not busy");
        assert_eq!(p.remove, vec!["s1".to_string()], "s9 is busy: a rebind may be claiming it");
    }
}
