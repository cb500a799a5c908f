//! SandboxPool → the node's warm pool: the pure plan (desired + observed →
//! one action) and the status it reports. No IO; `controller.rs` does the
//! calls around it.
use crate::conditions;
use crate::crd::Condition;
use crate::crd::{PoolCapacity, SandboxPoolSpec, SandboxPoolStatus};
use ember_types::api::{CreatePoolRequest, PoolInfo, ResizePoolRequest, ResourcesSpec};

/// What a SandboxPool asks of the node.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// The ember pool's name on the node (`node_pool_name`).
    pub name: String,
    pub template: String,
    pub replicas: u32,
    pub resources: Option<ResourcesSpec>,
    pub runtime_class: Option<String>,
}

impl Desired {
    pub fn from_spec(name: String, spec: &SandboxPoolSpec) -> Desired {
        Desired {
            name,
            template: spec.template.clone(),
            // The schema keeps replicas >= 0; a negative one (an older schema) asks for none.
            replicas: u32::try_from(spec.replicas).unwrap_or(0),
            resources: spec.resources.as_ref().map(crate::resources),
            runtime_class: spec.runtime_class.clone(),
        }
    }

    /// The node pool's bounds and target: a fixed idle count of `replicas`
    /// (min 0, max replicas: ember clamps the target to them).
    fn bounds(&self) -> (u32, u32, serde_json::Value) {
        (0, self.replicas, self.replicas.into())
    }
}

/// The one step the reconciler takes next.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Create(Box<CreatePoolRequest>),
    Resize {
        name: String,
        req: ResizePoolRequest,
    },
    /// The node pool was made from another template or runtime class, which
    /// ember cannot change in place: removed, and created anew next pass.
    Delete(String),
    Nothing,
}

/// `desired` is `None` once the resource is being deleted.
pub fn plan(desired: Option<&Desired>, observed: Option<&PoolInfo>) -> Action {
    match (desired, observed) {
        (None, None) => Action::Nothing,
        (None, Some(o)) => Action::Delete(o.name.clone()),
        (Some(d), None) => {
            let (min, max, target) = d.bounds();
            Action::Create(Box::new(CreatePoolRequest {
                name: Some(d.name.clone()),
                template: d.template.clone(),
                min,
                max,
                target: Some(target),
                resources: d.resources.clone(),
                runtime_class: d.runtime_class.clone(),
                network: None,
                allow: Vec::new(),
                from_snapshot: None,
                from_checkpoint: None,
                auto_pause: None,
            }))
        }
        (Some(d), Some(o)) => {
            let class_differs = d.runtime_class.as_ref().is_some_and(|c| *c != o.runtime_class);
            if d.template != o.template || class_differs {
                return Action::Delete(o.name.clone());
            }
            let (min, max, target) = d.bounds();
            if (o.min, o.max, &o.target) == (min, max, &target) {
                return Action::Nothing;
            }
            Action::Resize {
                name: o.name.clone(),
                req: ResizePoolRequest { min: Some(min), max: Some(max), target: Some(target) },
            }
        }
    }
}

/// The status a SandboxPool reports for what the node has. `claimed`: the
/// pool's claimed sandboxes still alive on the node.
pub fn status(
    prev: Option<&SandboxPoolStatus>,
    observed: &PoolInfo,
    claimed: u32,
    generation: Option<i64>,
    selector: String,
    now: &str,
) -> SandboxPoolStatus {
    let ready = if observed.idle >= observed.sizing.target {
        Condition::new(
            "Ready",
            true,
            "Warm",
            format!("{} idle of a target of {}", observed.idle, observed.sizing.target),
        )
    } else {
        Condition::new(
            "Ready",
            false,
            "Filling",
            format!(
                "{} idle, {} starting, target {}; {} create failures so far",
                observed.idle, observed.starting, observed.sizing.target, observed.create_failures
            ),
        )
    };
    let prev_conditions = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    SandboxPoolStatus {
        replicas: i32::try_from(observed.idle).unwrap_or(i32::MAX),
        selector,
        node_pool: observed.name.clone(),
        idle: observed.idle,
        starting: observed.starting,
        claimed,
        target: observed.sizing.target,
        capacity: PoolCapacity {
            arrival_per_sec: observed.sizing.arrival_per_sec,
            refill_secs: observed.sizing.refill_secs,
            in_flight_demand: observed.sizing.in_flight_demand,
            headroom: observed.sizing.headroom,
            min: observed.min,
            max: observed.max,
        },
        observed_generation: generation,
        conditions: conditions::set(prev_conditions, ready.generation(generation), now),
    }
}
