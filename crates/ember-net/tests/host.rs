//! Root tests on the real host: slots, the nftables table and policy updates.
//! Each test uses its own tag, range and nflog group, and removes all of it.
use ember_net::{nft, slot, AddrPlan, NetConfig, Network};
use ember_types::{EgressPolicy, EgressTarget};
use std::process::Command;

struct Cleanup(String, String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for n in slot::existing(&self.0) {
            slot::destroy(&self.0, n);
        }
        let _ = Command::new("nft").args(["delete", "table", "inet", &self.0]).output();
        let _ = Command::new("ip").args(["addr", "del", &self.1, "dev", "lo"]).output();
    }
}

fn sh(cmd: &[&str]) -> String {
    let out = Command::new(cmd[0]).args(&cmd[1..]).output().expect("command runs");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_slot_is_made_policed_scrubbed_and_reused() {
    let tag = format!("nt{}", std::process::id() % 100_000);
    let range = AddrPlan::parse("10.213.250.0/24").unwrap();
    let _c = Cleanup(tag.clone(), format!("{}/32", range.resolver()));
    let cfg = NetConfig {
        tag: tag.clone(),
        range,
        nflog_group: 3000 + (std::process::id() % 1000) as u16,
        upstream: "127.0.0.1:9".parse().unwrap(),
        ready_slots: 1,
    };
    let net = Network::open(cfg).expect("network opens");
    net.converge();
    let p = EgressPolicy::allow_only(vec![
        EgressTarget::parse("allowed.test").unwrap(),
        EgressTarget::parse("203.0.113.0/28:8080").unwrap(),
    ]);
    let a = net.acquire("sbx-a", &p).expect("a slot");
    assert!(a.netns.exists());
    let inside = sh(&["ip", "-n", &slot::name(&tag, a.slot), "-4", "addr", "show", "eth0"]);
    assert!(inside.contains(&a.address.to_string()), "{inside}");
    let route = sh(&["ip", "-n", &slot::name(&tag, a.slot), "route"]);
    assert!(route.contains(&format!("default via {}", a.gateway)), "{route}");
    let chain = sh(&["nft", "list", "chain", "inet", &tag, &format!("s{}", a.slot)]);
    assert!(chain.contains(":dns\" group"), "{chain}");
    let set = sh(&["nft", "list", "set", "inet", &tag, &format!("s{}_ap", a.slot)]);
    assert!(set.contains("203.0.113.0/28 . 8080"), "{set}");

    // A runtime update replaces the policy in one transaction.
    net.update(a.slot, &EgressPolicy::default()).expect("update");
    let chain = sh(&["nft", "list", "chain", "inet", &tag, &format!("s{}", a.slot)]);
    assert!(chain.contains(":private\" group") && !chain.contains(":dns\""), "{chain}");
    let set = sh(&["nft", "list", "set", "inet", &tag, &format!("s{}_ap", a.slot)]);
    assert!(!set.contains("8080"), "{set}");

    // Released: chain gone, slot ready again, and the next claim reuses it.
    net.release(a.slot, "sbx-a");
    assert_eq!(nft::slot_chains(&tag).unwrap(), Vec::<u32>::new());
    assert_eq!(net.stats().ready, 1);
    let b = net.acquire("sbx-b", &p).expect("reuse");
    assert_eq!(b.slot, a.slot);
    assert_eq!(net.stats().created_total, 1, "the slot was reused, not remade");

    // A slot nobody owns (as after a crash) is reclaimed by converge.
    let leftover = 7;
    slot::create(&tag, &range, leftover).expect("leftover slot");
    let net2 = Network::open(net.config().clone()).err();
    assert!(net2.is_some(), "a second reader of the same nflog group is refused");
    net.converge();
    assert_eq!(net.stats().ready, 1, "the whole leftover slot is made ready");
    net.release(b.slot, "sbx-b");
    assert!(slot::existing(&tag).contains(&leftover));
}
