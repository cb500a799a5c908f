//! Which survivor re-creates a dead node's sandbox.
//!
//! Every survivor's sweep sees the dead node's entries at once, and the
//! first compare-and-set at an entry's revision wins it. Left to that race,
//! the first node to sweep took them all: on the 300-session drill one node
//! re-created 30 sessions of each of two nodes, two at a time, while six
//! others restored none, and its last session came back after 45 s. Each
//! orphan now has one preferred survivor, by rendezvous hashing of its id
//! over the live nodes that run sandboxes (the same on every node that sees
//! the same live set, and moving only the orphans of a node that leaves it);
//! the others leave it to that node for [`TAKEOVER_GRACE`], then any takes
//! it (the preferred one may be slow or dying too, or see another live set).
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long an orphan is left to its preferred survivor.
pub const TAKEOVER_GRACE: Duration = Duration::from_secs(3);

/// The survivor of `nodes` preferred for orphan `id`: the highest hash of
/// `id` and the node's name (stable across builds, unlike std's hasher, so
/// every node computes the same).
pub fn preferred<'a>(id: &str, nodes: &'a [String]) -> Option<&'a str> {
    nodes.iter().max_by_key(|n| (weight(id, n), n.as_str())).map(|n| n.as_str())
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

/// When this node first saw each orphan it was not preferred for.
#[derive(Default)]
pub struct Orphans {
    seen: HashMap<String, Instant>,
}

impl Orphans {
    /// Whether `me` takes orphan `id` now: it is preferred, or the orphan
    /// has waited [`TAKEOVER_GRACE`] since this node first saw it.
    pub fn take(&mut self, id: &str, me: &str, live: &[String], now: Instant) -> bool {
        if preferred(id, live) == Some(me) {
            return true;
        }
        let first = *self.seen.entry(id.to_string()).or_insert(now);
        now.duration_since(first) >= TAKEOVER_GRACE
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
        let (mut o, t0) = (Orphans::default(), Instant::now());
        assert!(o.take(&id, "h1", &live, t0), "the preferred node takes it at once");
        assert!(!o.take(&id, "h2", &live, t0), "another waits");
        assert!(!o.take(&id, "h2", &live, t0 + TAKEOVER_GRACE / 2));
        assert!(o.take(&id, "h2", &live, t0 + TAKEOVER_GRACE), "then takes it");
        o.keep_only(&Default::default());
        assert!(!o.take(&id, "h2", &live, t0 + TAKEOVER_GRACE * 2), "a new wait once forgotten");
    }
}
