//! `ember sandbox policy` and `ember sandbox events`.
use anyhow::Context;
use ember_client::Client;
use ember_types::{EgressAction, EgressPolicy, EgressTarget, NetworkInfo};

fn print_info(i: &NetworkInfo) {
    println!("network:     {}", serde_json::to_value(i.network).unwrap_or_default().as_str().unwrap_or("?"));
    if let Some(a) = &i.address {
        println!("address:     {a}");
    }
    let default = match i.policy.default_action {
        EgressAction::Allow => "allow (open egress; host, sandboxes and private ranges denied)",
        EgressAction::Deny => "deny (allow-list)",
    };
    println!("default:     {default}");
    for r in &i.policy.rules {
        let action = if r.action == EgressAction::Allow { "allow" } else { "deny" };
        println!("  {action:<5} {}", r.target);
    }
    println!("enforcement: {}", i.enforcement_mode);
}

pub async fn policy(client: &Client, id: &str, allow: Vec<String>, open: bool, json: bool) -> anyhow::Result<i32> {
    let info = if open || !allow.is_empty() {
        let targets = allow.iter().map(|a| EgressTarget::parse(a)).collect::<Result<Vec<_>, _>>().context("--allow")?;
        let p = if open { EgressPolicy::default() } else { EgressPolicy::allow_only(targets) };
        client.set_network_policy(id, &p).await?
    } else {
        client.network(id).await?
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&info)?);
    } else {
        print_info(&info);
    }
    Ok(0)
}

pub async fn events(client: &Client, id: &str, json: bool) -> anyhow::Result<i32> {
    let evs = client.network_events(id).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&evs)?);
        return Ok(0);
    }
    println!("{:<30} {:<8} {:<10} {:<32} PORT", "TIME", "KIND", "RULE", "DESTINATION");
    for e in evs {
        let port = e.port.map(|p| format!("{p}/{}", e.protocol)).unwrap_or(e.protocol);
        println!("{:<30} {:<8} {:<10} {:<32} {port}", e.time, e.kind, e.rule, e.destination);
    }
    Ok(0)
}
