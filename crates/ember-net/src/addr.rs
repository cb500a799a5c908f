//! The node's sandbox address range, cut into one /30 per network slot.
//!
//! Slot `n` owns `base + 4n .. base + 4n + 3`: the host end of its veth is
//! `+1`, the sandbox's `eth0` is `+2`. The range's second-to-last address is
//! the resolver's (on the host's `lo`); the last /30 is never a slot.
use std::net::Ipv4Addr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrPlan {
    base: u32,
    prefix: u8,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("network range {0:?}: expected an IPv4 CIDR from /16 to /28, e.g. 10.203.0.0/16")]
pub struct RangeError(pub String);

impl AddrPlan {
    pub fn parse(s: &str) -> Result<AddrPlan, RangeError> {
        let err = || RangeError(s.to_string());
        let (a, p) = s.split_once('/').ok_or_else(err)?;
        let addr: Ipv4Addr = a.parse().map_err(|_| err())?;
        let prefix: u8 = p.parse().ok().filter(|p| (16..=28).contains(p)).ok_or_else(err)?;
        let mask = u32::MAX << (32 - prefix);
        Ok(AddrPlan { base: u32::from(addr) & mask, prefix })
    }

    fn size(&self) -> u32 {
        1 << (32 - self.prefix)
    }

    /// How many slots the range holds.
    pub fn capacity(&self) -> u32 {
        self.size() / 4 - 1
    }

    pub fn host(&self, slot: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.base + 4 * slot + 1)
    }

    pub fn guest(&self, slot: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.base + 4 * slot + 2)
    }

    /// Where the node's resolver listens (bound on the host's `lo`).
    pub fn resolver(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.base + self.size() - 2)
    }

    /// The slot a sandbox address belongs to.
    pub fn slot_of(&self, a: Ipv4Addr) -> Option<u32> {
        let off = u32::from(a).checked_sub(self.base)?;
        (off < self.size() && off % 4 == 2 && off / 4 < self.capacity()).then_some(off / 4)
    }

    pub fn contains(&self, a: Ipv4Addr) -> bool {
        u32::from(a).wrapping_sub(self.base) < self.size()
    }

    pub fn cidr(&self) -> String {
        format!("{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

/// Addresses a domain rule never pins and open egress never reaches unless a
/// CIDR rule names them: RFC 1918, CGNAT, loopback, link-local (cloud metadata
/// at 169.254.169.254), "this network", IETF protocol assignments, benchmarking,
/// multicast and reserved.
pub const SPECIAL_RANGES: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 0, 0, 0), 24),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(198, 18, 0, 0), 15),
    (Ipv4Addr::new(224, 0, 0, 0), 4),
    (Ipv4Addr::new(240, 0, 0, 0), 4),
];

pub fn in_ranges(a: Ipv4Addr, ranges: &[(Ipv4Addr, u8)]) -> bool {
    ranges.iter().any(|(net, p)| {
        let mask = if *p == 0 { 0 } else { u32::MAX << (32 - p) };
        u32::from(a) & mask == u32::from(*net) & mask
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_resolver() {
        let p = AddrPlan::parse("10.203.7.9/24").unwrap();
        assert_eq!(p.cidr(), "10.203.7.0/24");
        assert_eq!(p.capacity(), 63);
        assert_eq!(p.host(0), Ipv4Addr::new(10, 203, 7, 1));
        assert_eq!(p.guest(3), Ipv4Addr::new(10, 203, 7, 14));
        assert_eq!(p.resolver(), Ipv4Addr::new(10, 203, 7, 254));
        assert_eq!(p.slot_of(p.guest(62)), Some(62));
        assert_eq!(p.slot_of(p.host(5)), None);
        assert_eq!(p.slot_of(p.resolver()), None);
        assert_eq!(p.slot_of(Ipv4Addr::new(10, 203, 8, 2)), None);
        assert!(AddrPlan::parse("10.0.0.0/8").is_err());
        assert!(AddrPlan::parse("10.0.0.0/29").is_err());
    }

    #[test]
    fn special_ranges() {
        assert!(in_ranges(Ipv4Addr::new(169, 254, 169, 254), SPECIAL_RANGES));
        assert!(in_ranges(Ipv4Addr::new(192, 168, 1, 1), SPECIAL_RANGES));
        assert!(!in_ranges(Ipv4Addr::new(203, 0, 113, 10), SPECIAL_RANGES));
        assert!(!in_ranges(Ipv4Addr::new(1, 1, 1, 1), SPECIAL_RANGES));
    }
}
