//! The value of one tenant's key in the quota ledger (`quota.rs`): its
//! sandboxes, the holds of creates in flight (and of objects just made), and
//! its creates-per-second bucket, each entry naming its node.
use ember_engine::tenants::{Demand, Kind, TenantError};
use ember_types::tenant::Usage;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// How long the hold of a create that made an object other than a sandbox
/// counts on (unless the count of objects already has the object): the
/// object reaches every node's count through watches (the owner entry, the
/// pools), which lag the write by milliseconds; dropping the hold at once
/// would leave a moment where a create through another node sees neither.
pub const SETTLED_FOR_MS: i64 = 5_000;

/// One tenant's use across the cluster: the value of its key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantUse {
    /// Sandbox id → where it runs and what it holds.
    #[serde(default)]
    pub sandboxes: BTreeMap<String, Share>,
    /// Hold id (`<node>-<boot ms>-<seq>`) → a create admitted, not settled,
    /// or settled with an object other than a sandbox ([`Share::made`]).
    #[serde(default)]
    pub held: BTreeMap<String, Share>,
    /// The tenant's creates-per-second bucket, one for the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
}

/// One sandbox's (or one create's) part of a tenant's use.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Share {
    pub node: String,
    pub memory_bytes: u64,
    pub cpu_millis: u64,
    /// Sandboxes a hold asks for: 1 for a sandbox's create (the default:
    /// every hold was one before other objects were held), 0 for another's.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub sandboxes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pool_size: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub workspace_bytes: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tasks: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub snapshot_bytes: u64,
    /// The object a settled hold's create made (its owner key) and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made: Option<Made>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Made {
    pub object: String,
    pub at_ms: i64,
}

/// A token bucket of `rate` tokens refilled at `rate` a second, on the
/// nodes' wall clocks (the one value every node reads).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rate {
    pub tokens: f64,
    pub at_ms: i64,
}

fn one() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Share {
    /// The hold of `demand` on `node`.
    pub fn of(node: &str, d: &Demand) -> Share {
        Share {
            node: node.to_string(),
            memory_bytes: d.memory_bytes,
            cpu_millis: d.cpu_millis,
            sandboxes: d.sandboxes,
            pool_size: d.pool_size,
            workspace_bytes: d.workspace_bytes,
            tasks: d.tasks,
            snapshot_bytes: d.snapshot_bytes,
            made: None,
        }
    }

    /// What the hold asks for.
    fn demand(&self) -> Demand {
        Demand {
            sandboxes: self.sandboxes,
            memory_bytes: self.memory_bytes,
            cpu_millis: self.cpu_millis,
            pool_size: self.pool_size,
            workspace_bytes: self.workspace_bytes,
            tasks: self.tasks,
            snapshot_bytes: self.snapshot_bytes,
            rate_limited: false,
        }
    }

    /// A settled hold past [`SETTLED_FOR_MS`] at `now_ms`.
    fn expired(&self, now_ms: i64) -> bool {
        self.made.as_ref().is_some_and(|m| now_ms.saturating_sub(m.at_ms) >= SETTLED_FOR_MS)
    }
}

impl TenantUse {
    /// The use of the entries whose node `live` takes for live; the holds
    /// too when `held` is given (an admission counts them; `usage` shows
    /// sandboxes), a settled hold only until it expires and while the
    /// counted objects `held` lack its object.
    pub fn count(&self, live: &dyn Fn(&str) -> bool, held: Option<&HashSet<String>>, now_ms: i64) -> Usage {
        let mut u = Usage::default();
        for s in self.sandboxes.values().filter(|s| live(&s.node)) {
            u.running_sandboxes += 1;
            u.memory_bytes += s.memory_bytes;
            u.cpu_millis += s.cpu_millis;
        }
        let Some(counted) = held else { return u };
        let pending = |s: &&Share| match &s.made {
            Some(m) => !s.expired(now_ms) && !counted.contains(&m.object),
            None => true,
        };
        for s in self.held.values().filter(|s| live(&s.node)).filter(pending) {
            s.demand().add_to(&mut u);
        }
        u
    }

    /// Hold `ticket` settled: a sandbox it made is counted in its place
    /// (`placed`), another object's hold marked made at `now_ms`, a failed
    /// create's hold dropped. Whether anything changed.
    pub fn settle(&mut self, ticket: &str, made: Option<(Kind, &str)>, placed: Option<&Share>, now_ms: i64) -> bool {
        match (made, placed) {
            (Some((Kind::Sandbox, id)), Some(s)) => {
                let dropped = self.held.remove(ticket).is_some();
                self.sandboxes.insert(id.to_string(), s.clone()).as_ref() != Some(s) || dropped
            }
            (Some((kind, id)), _) => match self.held.get_mut(ticket) {
                Some(h) => {
                    h.made = Some(Made { object: kind.key(id), at_ms: now_ms });
                    true
                }
                None => false,
            },
            (None, _) => self.held.remove(ticket).is_some(),
        }
    }

    /// Takes one token of the tenant's bucket of `rate` a second at
    /// `now_ms`, or refuses as `createsPerSecond` exceeded.
    pub fn take_token(&mut self, tenant: &str, rate: u32, now_ms: i64) -> Result<(), TenantError> {
        let r = f64::from(rate);
        let b = self.rate.get_or_insert(Rate { tokens: r, at_ms: now_ms });
        // A clock that went back refills nothing.
        let elapsed = now_ms.saturating_sub(b.at_ms).max(0) as f64 / 1000.0;
        b.tokens = (b.tokens + elapsed * r).min(r);
        b.at_ms = b.at_ms.max(now_ms);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        let limit = u64::from(rate);
        Err(TenantError::QuotaExceeded {
            tenant: tenant.into(),
            quota: "createsPerSecond",
            limit,
            used: limit,
            asked: 1,
        })
    }

    /// Node `me`'s entries brought in line with what it runs: its sandboxes
    /// not in `running` dropped, its holds neither `pending` nor settled
    /// within [`SETTLED_FOR_MS`] dropped (any node's expired settled holds
    /// too), the tenant's sandboxes `owned` here that lack an entry put.
    /// Whether anything changed.
    pub fn reconcile(
        &mut self,
        me: &str,
        running: &BTreeSet<String>,
        owned: &BTreeMap<String, Share>,
        pending: &BTreeSet<String>,
        now_ms: i64,
    ) -> bool {
        let before = (self.sandboxes.len(), self.held.len());
        self.sandboxes.retain(|id, s| s.node != me || running.contains(id));
        self.held.retain(|id, s| match s.made {
            Some(_) => !s.expired(now_ms),
            None => s.node != me || pending.contains(id),
        });
        let mut changed = before != (self.sandboxes.len(), self.held.len());
        for (id, s) in owned {
            if !self.sandboxes.contains_key(id) {
                self.sandboxes.insert(id.clone(), s.clone());
                changed = true;
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(node: &str) -> Share {
        Share { node: node.into(), memory_bytes: 1 << 29, cpu_millis: 1000, sandboxes: 1, ..Default::default() }
    }

    #[test]
    fn a_dead_nodes_entries_are_not_counted_and_holds_only_when_asked() {
        let mut u = TenantUse::default();
        u.sandboxes.insert("s1".into(), share("a"));
        u.sandboxes.insert("s2".into(), share("b"));
        u.held.insert("a-1-0".into(), share("a"));
        let none = HashSet::new();
        let all = u.count(&|_| true, Some(&none), 0);
        assert_eq!((all.running_sandboxes, all.memory_bytes, all.cpu_millis), (3, 3 << 29, 3000));
        assert_eq!(u.count(&|_| true, None, 0).running_sandboxes, 2);
        let b_dead = u.count(&|n| n != "b", Some(&none), 0);
        assert_eq!((b_dead.running_sandboxes, b_dead.cpu_millis), (2, 2000));
    }

    #[test]
    fn a_hold_written_before_objects_were_held_is_a_sandboxs() {
        let old = r#"{"sandboxes":{},"held":{"a-1-0":{"node":"a","memoryBytes":5,"cpuMillis":7}}}"#;
        let u: TenantUse = serde_json::from_str(old).expect("the value of an earlier ember");
        let c = u.count(&|_| true, Some(&HashSet::new()), 0);
        assert_eq!((c.running_sandboxes, c.memory_bytes, c.cpu_millis), (1, 5, 7));
        let ws = Share::of("a", &Demand { workspace_bytes: 64, ..Default::default() });
        let json = serde_json::to_string(&ws).expect("json");
        let back: Share = serde_json::from_str(&json).expect("read back");
        assert_eq!(back, ws, "{json}");
        assert_eq!(back.sandboxes, 0, "{json}");
    }

    #[test]
    fn a_settled_hold_counts_until_its_object_is_counted_or_it_expires() {
        let mut u = TenantUse::default();
        let d = Demand { workspace_bytes: 64, ..Default::default() };
        u.held.insert("a-1-0".into(), Share::of("a", &d));
        assert!(u.settle("a-1-0", Some((Kind::Workspace, "w1")), None, 1_000));
        let none = HashSet::new();
        assert_eq!(u.count(&|_| true, Some(&none), 1_000).workspace_bytes, 64, "made, not yet counted");
        let has = HashSet::from([Kind::Workspace.key("w1")]);
        assert_eq!(u.count(&|_| true, Some(&has), 1_000).workspace_bytes, 0, "counted once, as the object");
        let later = 1_000 + SETTLED_FOR_MS;
        assert_eq!(u.count(&|_| true, Some(&none), later).workspace_bytes, 0, "expired");
        // Any node's sweep drops an expired settled hold; a younger one stays.
        u.held.insert("b-1-0".into(), Share::of("b", &d));
        assert!(u.settle("b-1-0", Some((Kind::Workspace, "w2")), None, later));
        assert!(u.reconcile("c", &BTreeSet::new(), &BTreeMap::new(), &BTreeSet::new(), later));
        assert_eq!(u.held.keys().collect::<Vec<_>>(), ["b-1-0"]);
        // A failed create's hold goes at once.
        u.held.insert("a-1-1".into(), Share::of("a", &d));
        assert!(u.settle("a-1-1", None, None, later) && !u.held.contains_key("a-1-1"));
    }

    #[test]
    fn one_bucket_for_the_cluster_refills_at_its_rate() {
        let mut u = TenantUse::default();
        assert!(u.take_token("t", 2, 0).is_ok() && u.take_token("t", 2, 0).is_ok());
        let e = u.take_token("t", 2, 0).expect_err("a third in the same instant").to_string();
        assert!(e.contains("createsPerSecond") && e.contains("limit 2"), "{e}");
        assert!(u.take_token("t", 2, 500).is_ok(), "half a second refills one token at 2/s");
        assert!(u.take_token("t", 2, 500).is_err());
        assert!(u.take_token("t", 2, 400).is_err(), "a clock gone back refills nothing");
        assert!(u.take_token("t", 2, 60_500).is_ok() && u.take_token("t", 2, 60_500).is_ok());
        assert!(u.take_token("t", 2, 60_500).is_err(), "a minute's idle banked more than the rate");
    }

    #[test]
    fn a_sweep_touches_its_own_nodes_entries_alone() {
        let mut u = TenantUse::default();
        u.sandboxes.insert("ended".into(), share("a"));
        u.sandboxes.insert("runs".into(), share("a"));
        u.sandboxes.insert("elsewhere".into(), share("b"));
        u.held.insert("a-1-0".into(), share("a"));
        u.held.insert("a-1-1".into(), share("a"));
        u.held.insert("b-1-0".into(), share("b"));
        let running: BTreeSet<String> = ["runs".to_string(), "lost".to_string()].into();
        let owned: BTreeMap<String, Share> = [("lost".to_string(), share("a"))].into();
        let pending: BTreeSet<String> = ["a-1-1".to_string()].into();
        assert!(u.reconcile("a", &running, &owned, &pending, 0));
        let ids: Vec<&str> = u.sandboxes.keys().map(String::as_str).collect();
        assert_eq!(ids, ["elsewhere", "lost", "runs"]);
        let held: Vec<&str> = u.held.keys().map(String::as_str).collect();
        assert_eq!(held, ["a-1-1", "b-1-0"]);
        assert!(!u.reconcile("a", &running, &owned, &pending, 0), "a second pass changed something");
    }
}
