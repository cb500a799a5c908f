//! The slot pool: ready slots made ahead of claims by a refill thread, handed
//! to sandboxes with their policy applied, scrubbed (chain and pins removed)
//! and reused when the sandbox ends.
//!
//! Restart convergence: the engine [`Network::adopt`]s the slot of every
//! sandbox it re-adopts, then [`Network::converge`] reclaims the rest: a whole
//! slot with no owner is scrubbed and made ready (or destroyed past the ready
//! target), a broken one is destroyed, a chain with no owner is deleted.
use crate::{nft, slot, NetError, Network, SlotUse};
use ember_types::EgressPolicy;
use serde_json::json;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::{Duration, Instant};

/// What a sandbox joins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub slot: u32,
    /// The slot's network namespace file.
    pub netns: PathBuf,
    pub address: Ipv4Addr,
    pub gateway: Ipv4Addr,
    /// The only DNS server the sandbox can reach.
    pub resolver: Ipv4Addr,
}

/// Slot pool figures, for `ember bench network` and `/v1/network`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NetStats {
    pub ready: usize,
    pub in_use: usize,
    pub creating: usize,
    pub target: usize,
    pub capacity: u32,
    pub created_total: u64,
    /// Mean time to make one slot, µs.
    pub create_micros_avg: u64,
}

impl NetStats {
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "ready": self.ready, "inUse": self.in_use, "creating": self.creating, "target": self.target,
            "capacity": self.capacity, "createdTotal": self.created_total, "createMicrosAvg": self.create_micros_avg,
        })
    }
}

impl Network {
    fn attachment(&self, n: u32) -> Attachment {
        let r = &self.cfg.range;
        Attachment {
            slot: n,
            netns: slot::netns_path(&self.cfg.tag, n),
            address: r.guest(n),
            gateway: r.host(n),
            resolver: r.resolver(),
        }
    }

    fn apply_policy(&self, n: u32, policy: &EgressPolicy, flush_pins: bool) -> Result<(), NetError> {
        let c = &self.cfg;
        if flush_pins {
            self.state.lock().pins.retain(|(s, _, _)| *s != n);
        }
        Ok(nft::apply(&nft::slot_script(&c.tag, n, &c.range, c.nflog_group, policy, flush_pins))?)
    }

    /// The lowest slot number not in any use, reserved as `creating`.
    fn reserve(&self) -> Option<u32> {
        let mut st = self.state.lock();
        let n = (0..self.cfg.range.capacity()).find(|n| {
            !st.ready.contains(n)
                && !st.used.contains_key(n)
                && !st.creating.contains(n)
                && !slot::netns_path(&self.cfg.tag, *n).exists()
        })?;
        st.creating.insert(n);
        Some(n)
    }

    /// Makes a slot and, under the same lock that ends its reservation, hands
    /// it to `owner` or makes it ready: no moment where another thread could
    /// reserve the same number.
    fn make_slot(&self, owner: Option<SlotUse>) -> Result<u32, NetError> {
        let n = self.reserve().ok_or_else(|| NetError::Exhausted(self.cfg.range.cidr()))?;
        let t0 = Instant::now();
        let res = slot::create(&self.cfg.tag, &self.cfg.range, n);
        {
            let mut st = self.state.lock();
            st.creating.remove(&n);
            if res.is_ok() {
                match owner {
                    Some(o) => {
                        st.used.insert(n, o);
                    }
                    None => st.ready.push_back(n),
                }
            }
        }
        res?;
        self.created_total.fetch_add(1, Ordering::Relaxed);
        self.create_micros_total.fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// Hands a slot to `sandbox` with `policy` applied: a ready one, or one
    /// made now when none is ready (the slow path; the refill thread is woken).
    pub fn acquire(&self, sandbox: &str, policy: &EgressPolicy) -> Result<Attachment, NetError> {
        let ready = self.state.lock().ready.pop_front();
        self.refill.notify_one();
        let owner = SlotUse { sandbox: sandbox.to_string(), policy: policy.clone() };
        let n = match ready {
            Some(n) => {
                self.state.lock().used.insert(n, owner);
                n
            }
            None => {
                tracing::warn!("no network slot ready; making one on the create path");
                self.make_slot(Some(owner))?
            }
        };
        if let Err(e) = self.apply_policy(n, policy, true) {
            self.release(n, sandbox);
            return Err(e);
        }
        Ok(self.attachment(n))
    }

    /// Re-registers the slot of a sandbox an earlier daemon started, and
    /// re-applies its policy (pins kept).
    pub fn adopt(&self, n: u32, sandbox: &str, policy: &EgressPolicy) -> Result<Attachment, NetError> {
        if !slot::intact(&self.cfg.tag, n) {
            return Err(NetError::NoSlot(n));
        }
        let owner = SlotUse { sandbox: sandbox.to_string(), policy: policy.clone() };
        self.state.lock().used.insert(n, owner);
        self.apply_policy(n, policy, false)?;
        Ok(self.attachment(n))
    }

    /// Replaces the policy of a slot in use (one nftables transaction); the
    /// pins go with the old policy, so names are pinned afresh as resolved.
    pub fn update(&self, n: u32, policy: &EgressPolicy) -> Result<(), NetError> {
        {
            let mut st = self.state.lock();
            let u = st.used.get_mut(&n).ok_or(NetError::NoSlot(n))?;
            u.policy = policy.clone();
        }
        self.apply_policy(n, policy, true)
    }

    /// Whether every one of `pins` is pinned for slot `n` already.
    pub(crate) fn all_pinned(&self, n: u32, pins: &[(Ipv4Addr, Option<u16>)]) -> bool {
        let st = self.state.lock();
        pins.iter().all(|(a, p)| st.pins.contains(&(n, *a, *p)))
    }

    /// Pins resolver answers for slot `n` for about `ttl` seconds.
    pub(crate) fn pin(&self, n: u32, pins: &[(Ipv4Addr, Option<u16>)], ttl: u32) -> Result<(), NetError> {
        let timeout = u64::from(ttl).clamp(30, 86_400) + 60;
        let marked: Vec<_> = {
            let st = self.state.lock();
            pins.iter().map(|(a, p)| (*a, *p, st.pins.contains(&(n, *a, *p)))).collect()
        };
        let tag = &self.cfg.tag;
        let res = nft::apply(&nft::pin_script(tag, n, &marked, timeout)).or_else(|_| {
            // A remembered pin may have expired in the kernel: add them afresh.
            let fresh: Vec<_> = marked.iter().map(|(a, p, _)| (*a, *p, false)).collect();
            nft::apply(&nft::pin_script(tag, n, &fresh, timeout))
        });
        if res.is_ok() {
            let mut st = self.state.lock();
            st.pins.extend(pins.iter().map(|(a, p)| (n, *a, *p)));
        }
        Ok(res?)
    }

    /// Takes slot `n` back from `sandbox`: its chain, sets and pins are
    /// deleted and its events forgotten; a whole slot is made ready again,
    /// past the ready target it is destroyed. A release by anyone but the
    /// slot's owner does nothing (so a second release cannot hand it out twice).
    pub fn release(&self, n: u32, sandbox: &str) {
        {
            let mut st = self.state.lock();
            if st.used.get(&n).is_none_or(|u| u.sandbox != sandbox) {
                return;
            }
            st.pins.retain(|(s, _, _)| *s != n);
            st.used.remove(&n);
            // Reserved while it is scrubbed: nobody may pick the number.
            st.creating.insert(n);
        }
        self.log.forget(sandbox);
        let _ = nft::apply(&nft::slot_cleanup_script(&self.cfg.tag, n));
        let whole = slot::intact(&self.cfg.tag, n);
        let mut st = self.state.lock();
        if whole && st.ready.len() < self.cfg.ready_slots.max(1) * 2 {
            st.creating.remove(&n);
            st.ready.push_back(n);
        } else {
            drop(st);
            slot::destroy(&self.cfg.tag, n);
            self.state.lock().creating.remove(&n);
        }
        self.refill.notify_one();
    }

    /// Reclaims every slot and chain no sandbox owns (after adopting).
    pub fn converge(&self) {
        let used: Vec<u32> = self.state.lock().used.keys().copied().collect();
        let tag = &self.cfg.tag;
        for n in nft::slot_chains(tag).unwrap_or_default().into_iter().filter(|n| !used.contains(n)) {
            let _ = nft::apply(&nft::slot_cleanup_script(tag, n));
        }
        for n in slot::existing(tag).into_iter().filter(|n| !used.contains(n)) {
            let mut st = self.state.lock();
            let fits = n < self.cfg.range.capacity() && st.ready.len() < self.cfg.ready_slots;
            if fits && slot::intact(tag, n) && !st.ready.contains(&n) {
                st.ready.push_back(n);
            } else if !st.ready.contains(&n) {
                drop(st);
                tracing::info!(slot = n, "removing a leftover network slot");
                slot::destroy(tag, n);
            }
        }
    }

    pub fn stats(&self) -> NetStats {
        let st = self.state.lock();
        let created = self.created_total.load(Ordering::Relaxed);
        NetStats {
            ready: st.ready.len(),
            in_use: st.used.len(),
            creating: st.creating.len(),
            target: self.cfg.ready_slots,
            capacity: self.cfg.range.capacity(),
            created_total: created,
            create_micros_avg: self.create_micros_total.load(Ordering::Relaxed).checked_div(created).unwrap_or(0),
        }
    }
}

/// Keeps `ready_slots` slots ready, one at a time, until the network is dropped.
pub(crate) fn refill_loop(net: Weak<Network>) {
    let mut failures = 0u32;
    loop {
        let Some(n) = net.upgrade() else { return };
        let want = {
            let mut st = n.state.lock();
            if st.ready.len() + st.creating.len() >= n.cfg.ready_slots {
                n.refill.wait_for(&mut st, Duration::from_millis(500));
            }
            st.ready.len() + st.creating.len() < n.cfg.ready_slots
        };
        if !want {
            continue;
        }
        match n.make_slot(None) {
            Ok(_) => failures = 0,
            Err(e) => {
                failures += 1;
                tracing::warn!(error = %e, "making a network slot failed");
                drop(n);
                std::thread::sleep(Duration::from_millis(100 << failures.min(6)));
            }
        }
    }
}
