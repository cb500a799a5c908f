//! A cluster pool's share per node: pure, no IO (the I/O around it is
//! `pools.rs`).
//!
//! The pool's total is spread evenly over the live nodes that run
//! sandboxes, each capped by what it can hold: its idle members of the pool
//! plus as many more as its free memory (`MemAvailable`) fits at the
//! members' memory limit. What one node cannot hold goes to the others, so
//! the cluster keeps the total while it has room; when a node dies, the
//! survivors' shares are planned again from the same total. Units that do
//! not divide evenly go to the first nodes by name, so every node, planning
//! from the same heartbeats, gives each the same share.
use std::collections::BTreeMap;

/// What the plan knows of one live node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeLoad {
    pub name: String,
    pub free_memory_bytes: u64,
    /// Its idle members of this pool.
    pub idle: u32,
}

/// How many members node `n` can hold: its idle ones plus what its free
/// memory fits (`member_memory_bytes` 0: no cap).
fn capacity(n: &NodeLoad, member_memory_bytes: u64) -> u32 {
    match member_memory_bytes {
        0 => u32::MAX,
        m => n.idle.saturating_add(u32::try_from(n.free_memory_bytes / m).unwrap_or(u32::MAX)),
    }
}

/// Each node's share of `total` (see the module docs). The shares sum to
/// `total`, or to the nodes' whole capacity if that is less; no share
/// exceeds its node's capacity; shares of nodes below their capacity differ
/// by one at most. The same loads in any order give the same shares.
pub fn shares(total: u32, member_memory_bytes: u64, nodes: &[NodeLoad]) -> BTreeMap<String, u32> {
    let mut nodes: Vec<&NodeLoad> = nodes.iter().collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes.dedup_by(|a, b| a.name == b.name);
    let caps: Vec<u32> = nodes.iter().map(|n| capacity(n, member_memory_bytes)).collect();
    let mut share = vec![0u32; nodes.len()];
    let mut left = total;
    loop {
        let open: Vec<usize> = (0..nodes.len()).filter(|&i| share[i] < caps[i]).collect();
        if open.is_empty() || left == 0 {
            break;
        }
        let fair = left / open.len() as u32;
        if fair == 0 {
            // Fewer units than open nodes: the first by name. Not the most
            // idle first: while nodes trim to a smaller share, their views
            // of each other's idle counts lag, and the unit flipped between
            // them (each took it, or neither).
            for &i in open.iter().take(left as usize) {
                share[i] += 1;
            }
            break;
        }
        for &i in &open {
            let give = fair.min(caps[i] - share[i]);
            share[i] += give;
            left -= give;
        }
    }
    nodes.iter().zip(share).map(|(n, s)| (n.name.clone(), s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    fn load(name: &str, free_mib: u64, idle: u32) -> NodeLoad {
        NodeLoad { name: name.into(), free_memory_bytes: free_mib * MIB, idle }
    }

    fn plan(total: u32, nodes: &[NodeLoad]) -> Vec<u32> {
        shares(total, 512 * MIB, nodes).into_values().collect()
    }

    #[test]
    fn table() {
        let roomy = |n| load(n, 64 << 10, 0);
        // Even, remainder by name when nobody has idle members.
        assert_eq!(plan(4, &[roomy("a"), roomy("b")]), [2, 2]);
        assert_eq!(plan(5, &[roomy("b"), roomy("a")]), [3, 2]);
        // The remainder by name, whatever idles where (stable while nodes trim).
        assert_eq!(plan(5, &[roomy("a"), load("b", 64 << 10, 3)]), [3, 2]);
        // A node that dies: the survivors keep the total.
        assert_eq!(plan(4, &[roomy("a"), roomy("b"), roomy("c")]), [2, 1, 1]);
        assert_eq!(plan(4, &[roomy("a"), roomy("c")]), [2, 2]);
        // A node short of memory holds what it can; the rest go elsewhere.
        assert_eq!(plan(6, &[load("a", 1024, 0), roomy("b")]), [2, 4]);
        assert_eq!(plan(6, &[load("a", 100, 1), roomy("b")]), [1, 5]);
        // The whole cluster short: every node full, the total not reached.
        assert_eq!(plan(10, &[load("a", 1024, 0), load("b", 512, 1)]), [2, 2]);
        // No node: no share; nothing wanted: zeros.
        assert!(plan(3, &[]).is_empty());
        assert_eq!(plan(0, &[roomy("a")]), [0]);
        // No memory limit: no cap.
        assert_eq!(shares(7, 0, &[load("a", 0, 0), load("b", 0, 0)]).into_values().collect::<Vec<_>>(), [4, 3]);
    }

    fn loads() -> impl Strategy<Value = Vec<NodeLoad>> {
        prop::collection::vec((0u64..8192, 0u32..20), 0..8).prop_map(|v| {
            v.into_iter().enumerate().map(|(i, (free, idle))| load(&format!("n{i}"), free, idle)).collect()
        })
    }

    proptest! {
        #[test]
        fn shares_keep_the_total_within_capacity(total in 0u32..200, nodes in loads(), dead in 0usize..8) {
            let mem = 512 * MIB;
            let caps: Vec<u32> = nodes.iter().map(|n| capacity(n, mem)).collect();
            let got = shares(total, mem, &nodes);
            let sum: u64 = got.values().map(|&s| u64::from(s)).sum();
            let room: u64 = caps.iter().map(|&c| u64::from(c)).sum();
            prop_assert_eq!(sum, u64::from(total).min(room));
            let below: Vec<u32> = nodes.iter().zip(&caps).filter(|(n, c)| got[&n.name] < **c).map(|(n, _)| got[&n.name]).collect();
            for (n, c) in nodes.iter().zip(&caps) {
                prop_assert!(got[&n.name] <= *c);
                // Nobody below its capacity has more than one less than anyone.
                if got[&n.name] < *c {
                    prop_assert!(got.values().all(|&s| s <= got[&n.name] + 1), "{:?}", got);
                }
            }
            prop_assert!(below.iter().max().zip(below.iter().min()).is_none_or(|(a, b)| a - b <= 1));
            // Any order of the same loads: the same plan.
            let mut rev = nodes.clone();
            rev.reverse();
            prop_assert_eq!(&shares(total, mem, &rev), &got);
            // One node gone: the survivors hold the total if they have room.
            if dead < nodes.len() {
                let mut alive = nodes.clone();
                alive.remove(dead);
                let room: u64 = alive.iter().map(|n| u64::from(capacity(n, mem))).sum();
                let sum: u64 = shares(total, mem, &alive).values().map(|&s| u64::from(s)).sum();
                prop_assert_eq!(sum, u64::from(total).min(room));
            }
        }
    }
}
