//! A sandbox's network: its mode and its egress policy, and the wire forms of
//! the denied-flow log. Pure types and parsing; enforcement lives in `ember-net`.
//!
//! Targets are written `CIDR[:PORT]`, `IP[:PORT]`, `DOMAIN[:PORT]` or
//! `*.DOMAIN[:PORT]` (IPv4 only). A domain rule is enforced by pinning: the
//! node's resolver records the addresses it answered for an allowed name, and
//! only those are let through.
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::Ipv4Addr;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// A network namespace with only `lo`.
    #[default]
    None,
    /// Outbound through NAT on the node, filtered by the sandbox's [`EgressPolicy`].
    Egress,
}

impl NetworkMode {
    pub fn parse(s: &str) -> Option<NetworkMode> {
        match s {
            "none" => Some(NetworkMode::None),
            "egress" => Some(NetworkMode::Egress),
            _ => None,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EgressAction {
    #[default]
    Allow,
    Deny,
}

/// What an egress rule matches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum EgressTarget {
    /// An IPv4 network (a host is a /32).
    Cidr { addr: Ipv4Addr, prefix: u8, port: Option<u16> },
    /// An exact name, or `*.suffix` (any name below `suffix`, not `suffix` itself).
    Domain { name: String, wildcard: bool, port: Option<u16> },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("egress target {target:?}: {why}")]
pub struct TargetError {
    pub target: String,
    pub why: &'static str,
}

impl EgressTarget {
    pub fn parse(s: &str) -> Result<EgressTarget, TargetError> {
        let err = |why| TargetError { target: s.to_string(), why };
        let s = s.trim();
        let (host, port) = match s.rsplit_once(':') {
            Some((h, p)) => {
                let port: u16 = p.parse().map_err(|_| err("the port is not a number in 1..65535"))?;
                if port == 0 {
                    return Err(err("the port is not a number in 1..65535"));
                }
                (h, Some(port))
            }
            None => (s, None),
        };
        if host.is_empty() {
            return Err(err("empty"));
        }
        if host.contains(|c: char| c.is_ascii_digit())
            && host.chars().all(|c| c.is_ascii_digit() || c == '.' || c == '/')
        {
            let (a, p) = host.split_once('/').map_or((host, None), |(a, p)| (a, Some(p)));
            let addr: Ipv4Addr = a.parse().map_err(|_| err("not an IPv4 address"))?;
            let prefix = match p {
                Some(p) => p.parse::<u8>().ok().filter(|p| *p <= 32).ok_or_else(|| err("prefix length 0..32"))?,
                None => 32,
            };
            let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
            return Ok(EgressTarget::Cidr { addr: Ipv4Addr::from(u32::from(addr) & mask), prefix, port });
        }
        if host.contains(':') || host.contains('[') {
            return Err(err("IPv6 is not supported"));
        }
        let (wildcard, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host),
        };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                && !l.starts_with('-')
        };
        if name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(err("not a domain name (letters, digits, '-', dots; '*.' only as a prefix)"));
        }
        Ok(EgressTarget::Domain { name, wildcard, port })
    }

    pub fn port(&self) -> Option<u16> {
        match self {
            EgressTarget::Cidr { port, .. } | EgressTarget::Domain { port, .. } => *port,
        }
    }

    /// Whether a (lowercase, dot-free at the end) query name matches this rule.
    pub fn matches_name(&self, qname: &str) -> bool {
        match self {
            EgressTarget::Domain { name, wildcard: false, .. } => qname == name,
            EgressTarget::Domain { name, wildcard: true, .. } => {
                qname.len() > name.len() + 1 && qname.ends_with(name.as_str()) && {
                    let cut = qname.len() - name.len() - 1;
                    qname.as_bytes()[cut] == b'.'
                }
            }
            EgressTarget::Cidr { .. } => false,
        }
    }
}

impl fmt::Display for EgressTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EgressTarget::Cidr { addr, prefix: 32, .. } => write!(f, "{addr}")?,
            EgressTarget::Cidr { addr, prefix, .. } => write!(f, "{addr}/{prefix}")?,
            EgressTarget::Domain { name, wildcard: true, .. } => write!(f, "*.{name}")?,
            EgressTarget::Domain { name, .. } => f.write_str(name)?,
        }
        match self.port() {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

impl Serialize for EgressTarget {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EgressTarget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        EgressTarget::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// One rule: OpenSandbox's `{action, target}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EgressRule {
    pub action: EgressAction,
    pub target: EgressTarget,
}

/// A sandbox's egress policy. `defaultAction: allow` is open egress (the
/// always-denied ranges stay denied unless a rule allows them); `deny` is an
/// allow-list. The host, other sandboxes and IPv6 are denied whatever it says.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressPolicy {
    /// Absent on the wire means `deny` (an allow-list), as the safer reading.
    #[serde(default = "deny")]
    pub default_action: EgressAction,
    /// OpenSandbox's `networkPolicy.egress`.
    #[serde(default, rename = "egress", alias = "rules")]
    pub rules: Vec<EgressRule>,
}

fn deny() -> EgressAction {
    EgressAction::Deny
}

/// The most rules one policy may hold.
pub const MAX_RULES: usize = 256;

impl EgressPolicy {
    /// The allow-list that `--allow` flags build.
    pub fn allow_only(targets: Vec<EgressTarget>) -> EgressPolicy {
        EgressPolicy {
            default_action: EgressAction::Deny,
            rules: targets.into_iter().map(|target| EgressRule { action: EgressAction::Allow, target }).collect(),
        }
    }

    /// The first rule whose domain matches `qname`, if any.
    pub fn rule_for_name(&self, qname: &str) -> Option<&EgressRule> {
        self.rules.iter().find(|r| r.target.matches_name(qname))
    }

    /// Whether the resolver answers `qname` (and pins what it answers).
    pub fn name_allowed(&self, qname: &str) -> bool {
        match self.rule_for_name(qname) {
            Some(r) => r.action == EgressAction::Allow,
            None => self.default_action == EgressAction::Allow,
        }
    }
}

/// One blocked connection attempt or DNS query.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeniedFlow {
    /// RFC 3339, with milliseconds.
    pub time: String,
    /// "connect" (a packet dropped by the firewall) or "dns" (a name refused by the resolver).
    pub kind: String,
    /// An address, or the queried name.
    pub destination: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// "tcp", "udp", "icmp", ...
    pub protocol: String,
    /// Which rule dropped it: "host", "sandbox", "private", "dns", "default", "deny-rule", "ipv6", "name".
    pub rule: String,
}

/// `GET /v1/sandboxes/{id}/network`: the mode, the policy in force and how
/// it is enforced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInfo {
    pub network: NetworkMode,
    #[serde(flatten)]
    pub policy: EgressPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    pub enforcement_mode: String,
}

/// `GET /v1/sandboxes/{id}/network/events`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeniedFlowList {
    pub items: Vec<DeniedFlow>,
}

/// `GET /v1/network`: the node's slot pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkNodeInfo {
    pub enabled: bool,
    pub range: String,
    pub ready: u64,
    pub in_use: u64,
    pub creating: u64,
    pub target: u64,
    pub capacity: u64,
    pub created_total: u64,
    pub create_micros_avg: u64,
}

/// `true` for the default policy (open egress, no rules): left out of records.
pub fn is_open_egress(p: &EgressPolicy) -> bool {
    *p == EgressPolicy::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_print() {
        for s in ["10.0.0.0/8", "1.2.3.4:443", "example.com", "*.example.com:443", "0.0.0.0/0"] {
            assert_eq!(EgressTarget::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(EgressTarget::parse("10.1.2.3/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(EgressTarget::parse("Example.COM.").unwrap().to_string(), "example.com");
        for bad in ["", "1.2.3.4:0", "1.2.3.4/33", "a..b", "*.", "x:http", "::1", "foo*.com", "-a.com"] {
            assert!(EgressTarget::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn names_match_exact_and_wildcard() {
        let exact = EgressTarget::parse("allowed.test").unwrap();
        let wild = EgressTarget::parse("*.allowed.test").unwrap();
        assert!(exact.matches_name("allowed.test"));
        assert!(!exact.matches_name("x.allowed.test"));
        assert!(wild.matches_name("x.allowed.test"));
        assert!(wild.matches_name("a.b.allowed.test"));
        assert!(!wild.matches_name("allowed.test"));
        assert!(!wild.matches_name("xallowed.test"));
    }

    #[test]
    fn policy_decides_names() {
        let p = EgressPolicy::allow_only(vec![EgressTarget::parse("allowed.test").unwrap()]);
        assert!(p.name_allowed("allowed.test"));
        assert!(!p.name_allowed("denied.test"));
        let open = EgressPolicy {
            default_action: EgressAction::Allow,
            rules: vec![EgressRule { action: EgressAction::Deny, target: EgressTarget::parse("*.bad.test").unwrap() }],
        };
        assert!(open.name_allowed("good.test"));
        assert!(!open.name_allowed("x.bad.test"));
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, r#"{"defaultAction":"deny","egress":[{"action":"allow","target":"allowed.test"}]}"#);
        assert_eq!(serde_json::from_str::<EgressPolicy>(&json).unwrap(), p);
    }
}
