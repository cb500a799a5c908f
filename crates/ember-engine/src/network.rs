//! Egress networking in the engine: a sandbox whose spec says `egress` gets a
//! network slot before it is launched (recorded write-ahead with the slot
//! number), joins it, and gives it back when it ends. Its policy can be
//! replaced while it runs; its denied flows are read from `ember-net`.
use crate::record::SandboxRecord;
use crate::{CreateSandbox, Engine, EngineError};
use ember_net::{Attachment, NetStats, Network};
use ember_types::{DeniedFlow, EgressAction, EgressPolicy, NetworkMode, SandboxId, SandboxSpec};
use std::sync::Arc;

/// A sandbox's network as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkStatus {
    pub mode: NetworkMode,
    pub policy: EgressPolicy,
    /// The sandbox's address, while it holds a slot.
    pub address: Option<std::net::Ipv4Addr>,
}

impl Engine {
    pub(crate) fn net(&self) -> Option<&Arc<Network>> {
        self.network.as_ref()
    }

    /// The mode and policy a create asks for, validated. OpenSandbox's
    /// `networkPolicy` implies egress when this daemon has egress networking
    /// (and is then enforced); without it, it is only recorded (port 18080
    /// reports `enforcementMode: none`), as the sandbox has loopback only.
    pub(crate) fn resolve_network(&self, req: &CreateSandbox) -> Result<(NetworkMode, EgressPolicy), EngineError> {
        let mut egress = req.egress.clone();
        if let (None, Some(wire)) = (&egress, &req.network_policy) {
            let enforce = req.network == Some(NetworkMode::Egress) || (req.network.is_none() && self.network.is_some());
            if enforce {
                egress = Some(egress_from_wire(wire)?);
            }
        }
        let mode = match (req.network, &egress) {
            (Some(m), _) => m,
            (None, Some(_)) => NetworkMode::Egress,
            (None, None) => NetworkMode::None,
        };
        let policy = egress.clone().unwrap_or_default();
        if mode == NetworkMode::None {
            if egress.is_some() {
                return Err(EngineError::invalid("network", "an egress policy needs network mode \"egress\""));
            }
            return Ok((mode, policy));
        }
        self.check_policy(&policy)?;
        Ok((mode, policy))
    }

    fn check_policy(&self, p: &EgressPolicy) -> Result<(), EngineError> {
        if self.network.is_none() {
            return Err(EngineError::invalid(
                "network",
                "egress networking is off on this daemon (start it without --network-range none)",
            ));
        }
        if p.rules.len() > ember_types::network::MAX_RULES {
            return Err(EngineError::invalid("networkPolicy", "at most 256 rules"));
        }
        Ok(())
    }

    /// Takes a slot for a sandbox about to launch (none for `network: none`).
    pub(crate) async fn attach_network(
        &self,
        id: &SandboxId,
        spec: &SandboxSpec,
    ) -> Result<Option<Attachment>, EngineError> {
        if spec.network != NetworkMode::Egress {
            return Ok(None);
        }
        let net = self.net().cloned().ok_or_else(|| EngineError::invalid("network", "egress networking is off"))?;
        let (sid, policy) = (id.to_string(), spec.egress.clone());
        let a = tokio::task::spawn_blocking(move || net.acquire(&sid, &policy))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|source| EngineError::Network { id: id.to_string(), source })?;
        Ok(Some(a))
    }

    /// Gives a sandbox's slot back (idempotent: only its owner's release counts).
    pub(crate) async fn release_network(&self, rec: &SandboxRecord) {
        if let (Some(net), Some(slot)) = (self.net().cloned(), rec.net_slot) {
            let sid = rec.id.to_string();
            let _ = tokio::task::spawn_blocking(move || net.release(slot, &sid)).await;
        }
    }

    /// After a restart: the slot of a re-adopted sandbox is its own again.
    pub(crate) async fn adopt_network(&self, rec: &SandboxRecord) {
        if let (Some(net), Some(slot)) = (self.net().cloned(), rec.net_slot) {
            let (sid, policy) = (rec.id.to_string(), rec.spec.egress.clone());
            match tokio::task::spawn_blocking(move || net.adopt(slot, &sid, &policy)).await {
                Ok(Ok(_)) => {}
                other => {
                    tracing::warn!(sandbox = %rec.id, slot, result = ?other.map(|r| r.map(|_| ())), "network slot not re-adopted")
                }
            }
        }
    }

    /// Reclaims unowned slots and starts the resolver, flow log and refill.
    pub(crate) async fn start_network(self: &Arc<Self>) -> Result<(), EngineError> {
        let Some(net) = self.net().cloned() else { return Ok(()) };
        let counter = self.metrics.network_denied.clone();
        net.set_observer(move |rule| {
            counter.get_or_create(&crate::metrics::RuleLabels { rule: rule.to_string() }).inc();
        });
        let n = net.clone();
        tokio::task::spawn_blocking(move || n.converge()).await.map_err(|e| EngineError::Internal(e.to_string()))?;
        net.start().map_err(|source| EngineError::Network { id: String::new(), source })
    }

    pub fn network_status(&self, id: &str) -> Result<NetworkStatus, EngineError> {
        let r = self.get(id)?;
        let address = match (self.net(), r.net_slot) {
            (Some(n), Some(s)) if !r.state.is_terminal() => Some(n.config().range.guest(s)),
            _ => None,
        };
        Ok(NetworkStatus { mode: r.spec.network, policy: r.spec.egress, address })
    }

    /// Replaces the egress policy of a running sandbox with egress networking.
    pub async fn set_network_policy(&self, id: &str, policy: EgressPolicy) -> Result<NetworkStatus, EngineError> {
        let e = self.visible(id)?;
        let r = e.snapshot();
        if r.state.is_terminal() {
            return Err(EngineError::NotRunning { id: r.id, state: r.state });
        }
        let Some(slot) = r.net_slot.filter(|_| r.spec.network == NetworkMode::Egress) else {
            return Err(EngineError::invalid(
                "network",
                "this sandbox was created with network \"none\"; create it with egress to give it a policy",
            ));
        };
        self.check_policy(&policy)?;
        let net = self.net().cloned().ok_or_else(|| EngineError::invalid("network", "egress networking is off"))?;
        let p = policy.clone();
        tokio::task::spawn_blocking(move || net.update(slot, &p))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|source| EngineError::Network { id: id.to_string(), source })?;
        e.ask(crate::sandbox::Command::Edit(crate::sandbox::Edit::Egress(policy))).await?;
        self.network_status(id)
    }

    /// Blocked connection attempts and DNS queries of a sandbox, oldest first.
    pub fn network_events(&self, id: &str) -> Result<Vec<DeniedFlow>, EngineError> {
        let r = self.get(id)?;
        Ok(self.net().map(|n| n.events(r.id.as_str())).unwrap_or_default())
    }

    /// The sandbox address range, when egress networking is on.
    pub fn network_range(&self) -> Option<String> {
        self.net().map(|n| n.config().range.cidr())
    }

    /// The slot pool's figures; `None` when egress networking is off.
    pub fn network_stats(&self) -> Option<NetStats> {
        self.net().map(|n| n.stats())
    }
}

/// OpenSandbox's wire policy (`defaultAction` absent = deny) → ember's.
pub fn egress_from_wire(w: &ember_types::api::NetworkPolicy) -> Result<EgressPolicy, EngineError> {
    let action = |a: &str| match a {
        "allow" => Ok(EgressAction::Allow),
        "deny" => Ok(EgressAction::Deny),
        other => Err(EngineError::invalid("networkPolicy", format!("action {other:?}: allow or deny"))),
    };
    let rules = w
        .egress
        .iter()
        .map(|r| {
            let target = ember_types::EgressTarget::parse(&r.target)
                .map_err(|e| EngineError::invalid("networkPolicy", e.to_string()))?;
            Ok(ember_types::EgressRule { action: action(&r.action)?, target })
        })
        .collect::<Result<_, EngineError>>()?;
    Ok(EgressPolicy { default_action: action(w.default_action.as_deref().unwrap_or("deny"))?, rules })
}

/// ember's policy → OpenSandbox's wire policy.
pub fn egress_to_wire(p: &EgressPolicy) -> ember_types::api::NetworkPolicy {
    let action = |a: EgressAction| if a == EgressAction::Allow { "allow" } else { "deny" }.to_string();
    ember_types::api::NetworkPolicy {
        default_action: Some(action(p.default_action)),
        egress: p
            .rules
            .iter()
            .map(|r| ember_types::api::NetworkRule { action: action(r.action), target: r.target.to_string() })
            .collect(),
    }
}

/// How the policy is enforced, for clients that ask (OpenSandbox's
/// `enforcementMode`).
pub fn enforcement(mode: NetworkMode, p: &EgressPolicy) -> &'static str {
    match (mode, p.default_action) {
        (NetworkMode::None, _) => "none: loopback only",
        (_, EgressAction::Allow) => "nftables: open egress, host/sandboxes/private ranges denied",
        (_, EgressAction::Deny) => "nftables allow-list + DNS pinning",
    }
}
