//! Egress networking in the engine (`Network`, the service that owns the
//! `ember-net` handle): a sandbox whose spec says `egress` gets a
//! network slot before it is launched (recorded write-ahead with the slot
//! number), joins it, and gives it back when it ends. Its policy can be
//! replaced while it runs; its denied flows are read from `ember-net`.
use crate::record::SandboxRecord;
use crate::{CreateSandbox, EngineError};
use ember_net::{Attachment, NetStats};
use ember_types::{DeniedFlow, EgressAction, EgressPolicy, NetworkMode, SandboxId, SandboxSpec};
use std::sync::Arc;

/// A sandbox's network as the API shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetworkStatus {
    pub mode: NetworkMode,
    pub policy: EgressPolicy,
    /// The sandbox's address, while it holds a slot.
    pub address: Option<std::net::Ipv4Addr>,
}

/// Egress networking of this node: the optional `ember-net` handle. Knows
/// slots and policies, not sandboxes: the sandbox service records what it
/// attaches.
pub(crate) struct Network {
    net: Option<Arc<ember_net::Network>>,
    /// Denied flows by rule, fed by the flow log once started.
    denied: prometheus_client::metrics::family::Family<
        crate::metrics::RuleLabels,
        prometheus_client::metrics::counter::Counter,
    >,
}

impl Network {
    pub fn new(net: Option<Arc<ember_net::Network>>, metrics: &crate::Metrics) -> Network {
        Network { net, denied: metrics.network_denied.clone() }
    }

    /// Whether this daemon has egress networking.
    pub fn enabled(&self) -> bool {
        self.net.is_some()
    }

    fn handle(&self) -> Result<Arc<ember_net::Network>, EngineError> {
        self.net.clone().ok_or_else(|| EngineError::invalid("network", "egress networking is off"))
    }

    /// The mode and policy a create asks for, validated. OpenSandbox's
    /// `networkPolicy` implies egress when this daemon has egress networking
    /// (and is then enforced); without it, it is only recorded (port 18080
    /// reports `enforcementMode: none`), as the sandbox has loopback only.
    pub fn resolve(&self, req: &CreateSandbox) -> Result<(NetworkMode, EgressPolicy), EngineError> {
        let mut egress = req.egress.clone();
        if let (None, Some(wire)) = (&egress, &req.network_policy) {
            let enforce = req.network == Some(NetworkMode::Egress) || (req.network.is_none() && self.enabled());
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

    pub fn check_policy(&self, p: &EgressPolicy) -> Result<(), EngineError> {
        if !self.enabled() {
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
    pub async fn attach(&self, id: &SandboxId, spec: &SandboxSpec) -> Result<Option<Attachment>, EngineError> {
        if spec.network != NetworkMode::Egress {
            return Ok(None);
        }
        let net = self.handle()?;
        let (sid, policy) = (id.to_string(), spec.egress.clone());
        let a = tokio::task::spawn_blocking(move || net.acquire(&sid, &policy))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|source| EngineError::Network { id: id.to_string(), source })?;
        Ok(Some(a))
    }

    /// Gives a sandbox's slot back (idempotent: only its owner's release counts).
    pub async fn release(&self, rec: &SandboxRecord) {
        if let (Some(net), Some(slot)) = (self.net.clone(), rec.net_slot) {
            let sid = rec.id.to_string();
            let _ = tokio::task::spawn_blocking(move || net.release(slot, &sid)).await;
        }
    }

    /// After a restart: the slot of a re-adopted sandbox is its own again.
    pub async fn adopt(&self, rec: &SandboxRecord) {
        if let (Some(net), Some(slot)) = (self.net.clone(), rec.net_slot) {
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
    pub async fn start(&self) -> Result<(), EngineError> {
        let Some(net) = self.net.clone() else { return Ok(()) };
        let counter = self.denied.clone();
        net.set_observer(move |rule| {
            counter.get_or_create(&crate::metrics::RuleLabels { rule: rule.to_string() }).inc();
        });
        let n = net.clone();
        tokio::task::spawn_blocking(move || n.converge()).await.map_err(|e| EngineError::Internal(e.to_string()))?;
        net.start().map_err(|source| EngineError::Network { id: String::new(), source })
    }

    /// Replaces the enforced policy of slot `slot` (sandbox `id`'s).
    pub async fn update(&self, id: &str, slot: u32, policy: &EgressPolicy) -> Result<(), EngineError> {
        self.check_policy(policy)?;
        let (net, p) = (self.handle()?, policy.clone());
        tokio::task::spawn_blocking(move || net.update(slot, &p))
            .await
            .map_err(|e| EngineError::Internal(e.to_string()))?
            .map_err(|source| EngineError::Network { id: id.to_string(), source })
    }

    /// The address of a sandbox in slot `slot`.
    pub fn address(&self, slot: u32) -> Option<std::net::Ipv4Addr> {
        self.net.as_ref().map(|n| n.config().range.guest(slot))
    }

    /// Blocked connection attempts and DNS queries of sandbox `id`, oldest first.
    pub fn events(&self, id: &str) -> Vec<DeniedFlow> {
        self.net.as_ref().map(|n| n.events(id)).unwrap_or_default()
    }

    /// The sandbox address range, when egress networking is on.
    pub fn range(&self) -> Option<String> {
        self.net.as_ref().map(|n| n.config().range.cidr())
    }

    /// The slot pool's figures; `None` when egress networking is off.
    pub fn stats(&self) -> Option<NetStats> {
        self.net.as_ref().map(|n| n.stats())
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
