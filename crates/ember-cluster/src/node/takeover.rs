//! Which survivor re-creates a dead node's sandbox, and when.
//!
//! Every survivor's sweep sees the dead node's entries at once, and the
//! first compare-and-set at an entry's revision wins it. Left to that race,
//! the first node to sweep took them all: on the 300-session drill one node
//! re-created 30 sessions of each of two nodes, two at a time, while six
//! others restored none, and its last session came back after 45 s. Each
//! orphan now has one preferred survivor, by rendezvous hashing of its id
//! over the live nodes that run sandboxes (the same on every node that sees
//! the same live set, and moving only the orphans of a node that leaves it).
//!
//! Claims are pulled, as tasks are: a node claims an orphan only when it
//! has a rebind slot free ([`plan`]), its preferred orphans first. Claimed
//! at once, a survivor's preferred orphans queued behind its own slots
//! while others had finished theirs (drill L: 10 to 17 restores per
//! survivor, the last session back after 34.5 s, past the client's retry
//! budget). An orphan its preferred node has not claimed after
//! [`TAKEOVER_GRACE`] (that node busy, slow or dying too, or seeing another
//! live set) goes to whichever node has a slot free.
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long an orphan is left to its preferred survivor: two sweeps, so a
/// preferred node with a slot free has claimed it by then.
pub const TAKEOVER_GRACE: Duration = Duration::from_secs(1);

/// The survivor of `nodes` preferred for orphan `id`: the highest hash of
/// `id` and the node's name (stable across builds, unlike std's hasher, so
/// every node computes the same).
pub fn preferred<'a>(id: &str, nodes: &'a [String]) -> Option<&'a str> {
    nodes.iter().max_by_key(|n| (weight(id, n), n.as_str())).map(|n| n.as_str())
}

/// Where node `me` stands among `nodes` for orphan `id` (0: preferred, 1:
/// preferred once that one is gone too, ...); `None` if it is not among them.
pub fn rank(id: &str, me: &str, nodes: &[String]) -> Option<usize> {
    let mine = (weight(id, me), me);
    nodes.iter().any(|n| n == me).then(|| nodes.iter().filter(|n| (weight(id, n), n.as_str()) > mine).count())
}

/// FNV-1a of `id`, a zero and `node`, then murmur3's finalizer: FNV alone
/// mixes its last bytes into the low bits only, and names that differ there
/// (`h1`..`h9`) lost to a longer one (`h10` took 47 of 90 orphans).
fn weight(id: &str, node: &str) -> u64 {
    let bytes = id.bytes().chain([0]).chain(node.bytes());
    let mut h = bytes.fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// When this node first saw each orphan.
#[derive(Default)]
pub struct Orphans {
    seen: HashMap<String, Instant>,
}

impl Orphans {
    /// Which of the orphans `ids` node `me` claims now, with `free` rebind
    /// slots: those it is preferred for or keeps a standby of (`ready`:
    /// its rebind is a warm claim here, `standby.rs`), then those that have
    /// waited [`TAKEOVER_GRACE`] since this node first saw them, longest
    /// first; no more than `free`.
    pub fn plan(
        &mut self,
        ids: &[String],
        me: &str,
        live: &[String],
        ready: &HashSet<String>,
        now: Instant,
        free: usize,
    ) -> Vec<String> {
        let mut eligible: Vec<(bool, Instant, &String)> = ids
            .iter()
            .filter_map(|id| {
                let first = *self.seen.entry(id.clone()).or_insert(now);
                let mine = preferred(id, live) == Some(me) || ready.contains(id);
                (mine || now.duration_since(first) >= TAKEOVER_GRACE).then_some((!mine, first, id))
            })
            .collect();
        eligible.sort();
        eligible.into_iter().take(free).map(|(_, _, id)| id.clone()).collect()
    }

    /// Forgets the orphans no longer waiting (taken, or gone).
    pub fn keep_only(&mut self, waiting: &std::collections::HashSet<String>) {
        self.seen.retain(|id, _| waiting.contains(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("h{i}")).collect()
    }

    #[test]
    fn orphans_spread_over_the_survivors() {
        let live = names(7);
        let mut per: HashMap<&str, usize> = HashMap::new();
        for i in 0..90 {
            *per.entry(preferred(&format!("sandbox-{i}"), &live).expect("a node")).or_default() += 1;
        }
        assert_eq!(per.len(), 7, "every survivor gets some: {per:?}");
        assert!(per.values().all(|n| *n <= 25), "none takes most: {per:?}");
        assert_eq!(preferred("x", &[]), None);
    }

    /// The drill's survivors (h1..h6, h10) and 90 sandbox ids of uuid
    /// shape: a hash weak in its last bytes gave h10 45 of them.
    #[test]
    fn names_that_differ_in_one_byte_share_alike() {
        let live: Vec<String> = ["h1", "h2", "h3", "h4", "h5", "h6", "h10"].iter().map(|s| s.to_string()).collect();
        let mut per: HashMap<&str, usize> = HashMap::new();
        for i in 0u64..90 {
            let x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let id = format!("{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}", x >> 32, x & 0xffff, i, i * 7, x >> 8);
            *per.entry(preferred(&id, &live).expect("a node")).or_default() += 1;
        }
        assert!(live.iter().all(|n| (5..=25).contains(per.get(n.as_str()).unwrap_or(&0))), "{per:?}");
    }

    #[test]
    fn a_node_leaving_moves_only_its_own_orphans() {
        let all = names(7);
        let fewer: Vec<String> = all.iter().filter(|n| *n != "h3").cloned().collect();
        for i in 0..200 {
            let id = format!("sandbox-{i}");
            let before = preferred(&id, &all).expect("a node");
            if before != "h3" {
                assert_eq!(preferred(&id, &fewer), Some(before), "{id} moved although h3 was not its node");
            }
        }
    }

    #[test]
    fn an_orphan_not_taken_by_its_preferred_node_is_taken_after_the_grace() {
        let live = names(3);
        let id = (0..).map(|i| format!("s{i}")).find(|id| preferred(id, &live) == Some("h1")).expect("some id");
        let ids = [id.clone()];
        let (mut o, t0, none) = (Orphans::default(), Instant::now(), HashSet::new());
        assert_eq!(o.plan(&ids, "h1", &live, &none, t0, 2), ids, "the preferred node takes it at once");
        assert!(o.plan(&ids, "h2", &live, &none, t0, 2).is_empty(), "another waits");
        assert!(o.plan(&ids, "h2", &live, &none, t0 + TAKEOVER_GRACE / 2, 2).is_empty());
        assert_eq!(o.plan(&ids, "h2", &live, &none, t0 + TAKEOVER_GRACE, 2), ids, "then takes it");
        o.keep_only(&Default::default());
        assert!(o.plan(&ids, "h2", &live, &none, t0 + TAKEOVER_GRACE * 2, 2).is_empty(), "a new wait once forgotten");
    }

    /// A node that keeps a standby of an orphan (`standby.rs`) takes it at
    /// once, as its preferred node does, and before those it waited for.
    #[test]
    fn a_node_with_a_standby_of_an_orphan_takes_it_at_once() {
        let live = names(3);
        let ids: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
        let theirs = ids.iter().find(|id| preferred(id, &live) == Some("h1")).expect("some id").clone();
        let ready: HashSet<String> = [theirs.clone()].into();
        let (mut o, t0) = (Orphans::default(), Instant::now());
        let one = std::slice::from_ref(&theirs);
        assert_eq!(o.plan(one, "h2", &live, &ready, t0, 2), one, "at once");
        let later = o.plan(&ids, "h2", &live, &ready, t0 + TAKEOVER_GRACE, 1);
        let own = ids.iter().find(|id| preferred(id, &live) == Some("h2"));
        assert!(later == [theirs.clone()] || Some(&later[0]) == own, "its own or its standby's first: {later:?}");
    }

    #[test]
    fn rank_counts_the_nodes_preferred_before() {
        let live = names(5);
        for i in 0..50 {
            let id = format!("s{i}");
            let first = preferred(&id, &live).expect("a node");
            assert_eq!(rank(&id, first, &live), Some(0));
            let rest: Vec<String> = live.iter().filter(|n| *n != first).cloned().collect();
            let second = preferred(&id, &rest).expect("a node");
            assert_eq!(rank(&id, second, &live), Some(1), "{id}");
            let mut ranks: Vec<usize> = live.iter().filter_map(|n| rank(&id, n, &live)).collect();
            ranks.sort();
            assert_eq!(ranks, [0, 1, 2, 3, 4]);
        }
        assert_eq!(rank("s", "h9", &live), None);
    }

    /// A node claims no more than its free slots, its own orphans first:
    /// what it cannot start now stays unclaimed for a node with a slot.
    #[test]
    fn a_node_claims_only_what_its_free_slots_can_start_its_own_first() {
        let live = names(3);
        let ids: Vec<String> = (0..30).map(|i| format!("s{i}")).collect();
        let own: Vec<&String> = ids.iter().filter(|id| preferred(id, &live) == Some("h1")).collect();
        assert!(own.len() > 2, "{own:?}");
        let (mut o, t0, none) = (Orphans::default(), Instant::now(), HashSet::new());
        let now = o.plan(&ids, "h1", &live, &none, t0, 2);
        assert_eq!(now.len(), 2, "two slots, two claims");
        assert!(now.iter().all(|id| own.contains(&id)), "its own first: {now:?}");
        assert!(o.plan(&ids, "h1", &live, &none, t0, 0).is_empty(), "no slot, no claim");
        // After the grace the rest are anyone's, its own still first.
        let later = o.plan(&ids, "h1", &live, &none, t0 + TAKEOVER_GRACE, ids.len());
        assert_eq!(later.len(), ids.len());
        assert!(later[..own.len()].iter().all(|id| own.contains(&id)), "{later:?}");
        // Another node with slots takes h1's orphans once they waited.
        let (mut o2, t1) = (Orphans::default(), Instant::now());
        assert!(o2.plan(&own.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "h2", &live, &none, t1, 4).is_empty());
        let stolen =
            o2.plan(&own.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "h2", &live, &none, t1 + TAKEOVER_GRACE, 4);
        assert_eq!(stolen.len(), 4.min(own.len()));
    }
}
