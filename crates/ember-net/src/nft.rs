//! The nftables ruleset: one table `inet <tag>`, shared base chains, and one
//! chain plus four sets per slot (`s<N>`), all written as `nft -f -` scripts
//! and applied as single transactions (a script applies whole or not at all).
//!
//! Packet paths, from a sandbox (its packets enter the host on `<tag>-<N>`):
//! - to the host itself (`input`): only the resolver's port 53; the rest is
//!   logged (`host`) and dropped.
//! - forwarded (`forward` → `from_sandbox`): established flows pass; IPv6 is
//!   dropped; anything to the sandbox range is logged (`sandbox`) and dropped;
//!   then `iifname vmap @slots` jumps to the slot's chain, which applies its
//!   policy (see [`slot_script`]). A slot without a chain drops (`noslot`).
//! - nothing from outside may open a flow to a sandbox.
//! - `postrouting` masquerades the range towards everything but the slots.
//!
//! Each `log` statement sends the packet to nflog group `group` with prefix
//! `<tag>:<rule>`; the source address names the slot.
use crate::addr::AddrPlan;
use ember_types::{EgressAction, EgressPolicy, EgressTarget};
use std::fmt::Write;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("running nft")]
    Spawn(#[source] std::io::Error),
    #[error("nft refused the script: {stderr}")]
    Failed { stderr: String },
}

/// Runs `nft -f -` with `script` as one transaction.
pub fn apply(script: &str) -> Result<(), NftError> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(NftError::Spawn)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes()).map_err(NftError::Spawn)?;
    }
    let out = child.wait_with_output().map_err(NftError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NftError::Failed { stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() })
    }
}

/// Runs `nft` with arguments and returns stdout (listing).
pub fn query(args: &[&str]) -> Result<String, NftError> {
    let out = Command::new("nft").args(args).stderr(Stdio::piped()).output().map_err(NftError::Spawn)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NftError::Failed { stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() })
    }
}

fn log(tag: &str, group: u16, rule: &str) -> String {
    format!("log group {group} prefix \"{tag}:{rule}\"")
}

fn cidrs(list: &[(Ipv4Addr, u8)]) -> String {
    list.iter().map(|(a, p)| format!("{a}/{p}")).collect::<Vec<_>>().join(", ")
}

/// The table and its shared chains. Idempotent: re-running it at a restart
/// resets the shared parts and keeps every slot's chain, sets and pins.
/// `denied` = the special ranges plus the host's own networks.
pub fn base_script(tag: &str, plan: &AddrPlan, group: u16, denied: &[(Ipv4Addr, u8)]) -> String {
    let t = format!("inet {tag}");
    let r = plan.cidr();
    let res = plan.resolver();
    let mut s = String::new();
    let _ = writeln!(s, "add table {t}");
    let _ = writeln!(s, "add set {t} denied {{ type ipv4_addr; flags interval; auto-merge; }}");
    let _ = writeln!(s, "flush set {t} denied");
    if !denied.is_empty() {
        let _ = writeln!(s, "add element {t} denied {{ {} }}", cidrs(denied));
    }
    let _ = writeln!(s, "add map {t} slots {{ type ifname : verdict; }}");
    for (name, hook) in [
        ("input", Some("type filter hook input priority filter; policy accept;")),
        ("forward", Some("type filter hook forward priority filter; policy accept;")),
        ("postrouting", Some("type nat hook postrouting priority srcnat; policy accept;")),
        ("to_host", None),
        ("from_sandbox", None),
    ] {
        match hook {
            Some(h) => {
                let _ = writeln!(s, "add chain {t} {name} {{ {h} }}");
            }
            None => {
                let _ = writeln!(s, "add chain {t} {name}");
            }
        }
        let _ = writeln!(s, "flush chain {t} {name}");
    }
    let ifs = format!("\"{tag}-*\"");
    let _ = writeln!(s, "add rule {t} input iifname {ifs} jump to_host");
    let _ = writeln!(s, "add rule {t} to_host ip daddr {res} meta l4proto {{ tcp, udp }} th dport 53 accept");
    let _ = writeln!(s, "add rule {t} to_host meta nfproto ipv6 drop");
    let _ = writeln!(s, "add rule {t} to_host {} drop", log(tag, group, "host"));
    let _ = writeln!(s, "add rule {t} forward iifname {ifs} jump from_sandbox");
    let _ = writeln!(s, "add rule {t} forward oifname {ifs} ct state established,related accept");
    let _ = writeln!(s, "add rule {t} forward oifname {ifs} drop");
    let _ = writeln!(s, "add rule {t} from_sandbox ct state established,related accept");
    let _ = writeln!(s, "add rule {t} from_sandbox meta nfproto ipv6 drop");
    let _ = writeln!(s, "add rule {t} from_sandbox ip daddr {r} {} drop", log(tag, group, "sandbox"));
    let _ = writeln!(s, "add rule {t} from_sandbox iifname vmap @slots");
    let _ = writeln!(s, "add rule {t} from_sandbox {} drop", log(tag, group, "noslot"));
    let _ = writeln!(s, "add rule {t} postrouting ip saddr {r} oifname != {ifs} masquerade");
    s
}

/// CIDR rules of one action, split by whether they name a port.
fn cidr_elements(p: &EgressPolicy, action: EgressAction) -> (Vec<String>, Vec<String>) {
    let (mut plain, mut ported) = (Vec::new(), Vec::new());
    for r in p.rules.iter().filter(|r| r.action == action) {
        if let EgressTarget::Cidr { addr, prefix, port } = &r.target {
            match port {
                None => plain.push(format!("{addr}/{prefix}")),
                Some(port) => ported.push(format!("{addr}/{prefix} . {port}")),
            }
        }
    }
    (plain, ported)
}

/// Creates or replaces slot `n`'s chain and CIDR sets for `policy` and points
/// `slots` at it. Pins are kept unless `flush_pins` (a changed policy must not
/// keep addresses pinned for names it no longer allows; a restart keeps them).
pub fn slot_script(tag: &str, n: u32, plan: &AddrPlan, group: u16, policy: &EgressPolicy, flush_pins: bool) -> String {
    let t = format!("inet {tag}");
    let c = format!("s{n}");
    let mut s = String::new();
    let _ = writeln!(s, "add chain {t} {c}");
    let _ = writeln!(s, "flush chain {t} {c}");
    for (set, ty, timeout) in [
        ("a", "ipv4_addr", false),
        ("ap", "ipv4_addr . inet_service", false),
        ("d", "ipv4_addr", false),
        ("dp", "ipv4_addr . inet_service", false),
        ("p", "ipv4_addr", true),
        ("pp", "ipv4_addr . inet_service", true),
    ] {
        let flags = if timeout { "timeout" } else { "interval" };
        let _ = writeln!(s, "add set {t} {c}_{set} {{ type {ty}; flags {flags}; }}");
        if !timeout || flush_pins {
            let _ = writeln!(s, "flush set {t} {c}_{set}");
        }
    }
    for (action, set) in [(EgressAction::Allow, "a"), (EgressAction::Deny, "d")] {
        let (plain, ported) = cidr_elements(policy, action);
        if !plain.is_empty() {
            let _ = writeln!(s, "add element {t} {c}_{set} {{ {} }}", plain.join(", "));
        }
        if !ported.is_empty() {
            let _ = writeln!(s, "add element {t} {c}_{set}p {{ {} }}", ported.join(", "));
        }
    }
    let l4 = "meta l4proto { tcp, udp }";
    let rule = |s: &mut String, r: &str| {
        let _ = writeln!(s, "add rule {t} {c} {r}");
    };
    rule(&mut s, &format!("ip saddr != {} {} drop", plan.guest(n), log(tag, group, "spoof")));
    rule(&mut s, &format!("ip daddr @{c}_d {} drop", log(tag, group, "deny-rule")));
    rule(&mut s, &format!("{l4} ip daddr . th dport @{c}_dp {} drop", log(tag, group, "deny-rule")));
    rule(&mut s, &format!("ip daddr @{c}_a accept"));
    rule(&mut s, &format!("{l4} ip daddr . th dport @{c}_ap accept"));
    match policy.default_action {
        EgressAction::Allow => {
            rule(&mut s, &format!("ip daddr @denied {} drop", log(tag, group, "private")));
            rule(&mut s, "accept");
        }
        EgressAction::Deny => {
            rule(&mut s, &format!("ip daddr @{c}_p accept"));
            rule(&mut s, &format!("{l4} ip daddr . th dport @{c}_pp accept"));
            rule(&mut s, &format!("{l4} th dport {{ 53, 853 }} {} drop", log(tag, group, "dns")));
            rule(&mut s, &format!("{} drop", log(tag, group, "default")));
        }
    }
    let _ = writeln!(s, "add element {t} slots {{ \"{tag}-{n}\" : jump {c} }}");
    s
}

/// Removes slot `n`'s map entry, chain and sets (pins included). Each line is
/// its own statement of one transaction; run [`slot_cleanup_script`] when some
/// may not exist.
pub fn slot_remove_script(tag: &str, n: u32) -> String {
    let t = format!("inet {tag}");
    let c = format!("s{n}");
    let mut s = format!("delete element {t} slots {{ \"{tag}-{n}\" }}\ndelete chain {t} {c}\n");
    for set in ["a", "ap", "d", "dp", "p", "pp"] {
        let _ = writeln!(s, "delete set {t} {c}_{set}");
    }
    s
}

/// Like [`slot_remove_script`] but safe when parts are missing: it first
/// creates each (add is idempotent), then deletes them.
pub fn slot_cleanup_script(tag: &str, n: u32) -> String {
    let t = format!("inet {tag}");
    let c = format!("s{n}");
    let mut s = format!("add chain {t} {c}\nflush chain {t} {c}\n");
    s.push_str(&format!("add element {t} slots {{ \"{tag}-{n}\" : jump {c} }}\n"));
    for (set, ty) in [("a", "ipv4_addr"), ("ap", "ipv4_addr . inet_service"), ("d", "ipv4_addr")] {
        let _ = writeln!(s, "add set {t} {c}_{set} {{ type {ty}; flags interval; }}");
    }
    for (set, ty) in [("dp", "ipv4_addr . inet_service"), ("p", "ipv4_addr"), ("pp", "ipv4_addr . inet_service")] {
        let flags = if set == "dp" { "interval" } else { "timeout" };
        let _ = writeln!(s, "add set {t} {c}_{set} {{ type {ty}; flags {flags}; }}");
    }
    s + &slot_remove_script(tag, n)
}

/// Pins addresses the resolver answered: (address, port or all ports).
/// `refresh` = already pinned: delete first, so the timeout starts again.
pub fn pin_script(tag: &str, n: u32, pins: &[(Ipv4Addr, Option<u16>, bool)], timeout_secs: u64) -> String {
    let t = format!("inet {tag}");
    let mut s = String::new();
    for (a, port, refresh) in pins {
        let (set, el) = match port {
            None => (format!("s{n}_p"), a.to_string()),
            Some(p) => (format!("s{n}_pp"), format!("{a} . {p}")),
        };
        if *refresh {
            let _ = writeln!(s, "delete element {t} {set} {{ {el} }}");
        }
        let _ = writeln!(s, "add element {t} {set} {{ {el} timeout {timeout_secs}s }}");
    }
    s
}

/// Slot numbers that have a chain in the table.
pub fn slot_chains(tag: &str) -> Result<Vec<u32>, NftError> {
    let out = match query(&["-j", "list", "chains", "inet", tag]) {
        Ok(o) => o,
        Err(NftError::Failed { .. }) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    Ok(v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["chain"]["name"].as_str()?.strip_prefix('s')?.parse().ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_chain_pins_and_blocks_dns() {
        let plan = AddrPlan::parse("10.203.0.0/24").unwrap();
        let p = EgressPolicy::allow_only(vec![
            EgressTarget::parse("allowed.test").unwrap(),
            EgressTarget::parse("203.0.113.0/28:8080").unwrap(),
            EgressTarget::parse("1.2.3.4").unwrap(),
        ]);
        let s = slot_script("ember", 3, &plan, 7, &p, false);
        assert!(s.contains("add element inet ember s3_a { 1.2.3.4/32 }"), "{s}");
        assert!(s.contains("add element inet ember s3_ap { 203.0.113.0/28 . 8080 }"), "{s}");
        assert!(s.contains("th dport { 53, 853 } log group 7 prefix \"ember:dns\" drop"), "{s}");
        assert!(s.contains("ip saddr != 10.203.0.14"), "{s}");
        assert!(s.ends_with("add element inet ember slots { \"ember-3\" : jump s3 }\n"), "{s}");
        assert!(!s.contains("flush set inet ember s3_p "), "pins survive a policy update: {s}");
        let open = slot_script("ember", 3, &plan, 7, &EgressPolicy::default(), true);
        assert!(open.contains("flush set inet ember s3_p\n"), "{open}");
        assert!(open.contains("ip daddr @denied log group 7 prefix \"ember:private\" drop"), "{open}");
    }

    #[test]
    fn base_script_guards_host_and_sandboxes() {
        let plan = AddrPlan::parse("10.203.0.0/24").unwrap();
        let s = base_script("ember", &plan, 7, &[(Ipv4Addr::new(10, 0, 0, 0), 8)]);
        assert!(s.contains("to_host ip daddr 10.203.0.254 meta l4proto { tcp, udp } th dport 53 accept"));
        assert!(s.contains("from_sandbox ip daddr 10.203.0.0/24 log group 7 prefix \"ember:sandbox\" drop"));
        assert!(s.contains("postrouting ip saddr 10.203.0.0/24 oifname != \"ember-*\" masquerade"));
        let pins = pin_script("ember", 2, &[(Ipv4Addr::new(1, 2, 3, 4), Some(443), true)], 90);
        assert_eq!(
            pins,
            "delete element inet ember s2_pp { 1.2.3.4 . 443 }\nadd element inet ember s2_pp { 1.2.3.4 . 443 timeout 90s }\n"
        );
    }
}
