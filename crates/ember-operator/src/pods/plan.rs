//! Pod mode, the pure parts: the Pods and PersistentVolumeClaims a pod-mode
//! SandboxPool asks for, the actions that bring what the informer cache
//! holds to it, the warm Pod a claim takes, and the pool's status. No IO:
//! `controller.rs` reads the cache and the API server around it.
//!
//! Names are `<pool>-<n>` (the Pod and its workspace PVC alike), the
//! smallest `n` free: a pass repeated on a stale cache asks for the same
//! names again and the API server's `AlreadyExists` makes it a no-op, so the
//! pool is never overfilled by a lagging cache.
use crate::crd::{Condition, PodPoolSpec, PoolCapacity, SandboxPoolStatus};
use crate::{conditions, crd};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile,
    SecurityContext, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use std::collections::{BTreeMap, BTreeSet};

/// Label on a pool's Pods and PVCs: the SandboxPool's name.
pub const POOL_LABEL: &str = "ember.run/pool";
/// Label on a claimed Pod (and its PVC): the SandboxClaim's uid.
pub const CLAIM_LABEL: &str = "ember.run/claim";
/// Where a Pod's workspace PVC is mounted.
pub const WORKSPACE_PATH: &str = "/workspace";
/// The Pods' port when the pool names none: agent-sandbox's runtime's.
pub const DEFAULT_PORT: u16 = 8888;

/// A claimed Pod's endpoint: the URL of its server, `http://<ip>:<port>`
/// (an IPv6 address in brackets), what a client takes as its base URL.
pub fn endpoint(ip: &str, port: u16) -> String {
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => format!("http://[{v6}]:{port}"),
        _ => format!("http://{ip}:{port}"),
    }
}

/// The uid and gid the sandbox runs as (non-root, as PodSecurity's
/// `restricted` level requires).
const SANDBOX_UID: i64 = 65532;

/// What a pod-mode SandboxPool asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    /// The SandboxPool's name (the Pods' name prefix and label).
    pub pool: String,
    pub namespace: String,
    pub image: String,
    pub replicas: u32,
    pub runtime_class: Option<String>,
    pub resources: Option<crd::Resources>,
    pub pod: PodPoolSpec,
    /// The SandboxPool as the Pods' controller (garbage-collected with it
    /// where a garbage collector runs; a claim takes the Pod over).
    pub owner: Option<OwnerReference>,
}

/// One of the pool's Pods as the informer cache shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedPod {
    pub name: String,
    /// The claim's uid in [`CLAIM_LABEL`], once the ownership patch is in.
    pub claimed_by: Option<String>,
    /// Its `Ready` condition is `True` (the kubelet's word).
    pub ready: bool,
    /// `Succeeded` or `Failed`: it never runs again.
    pub ended: bool,
    pub deleting: bool,
    pub ip: Option<String>,
}

impl ObservedPod {
    pub fn of(p: &Pod) -> ObservedPod {
        let status = p.status.as_ref();
        let conds = status.and_then(|s| s.conditions.as_ref());
        ObservedPod {
            name: p.metadata.name.clone().unwrap_or_default(),
            claimed_by: p.metadata.labels.as_ref().and_then(|l| l.get(CLAIM_LABEL)).cloned(),
            ready: conds.is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            ended: status.and_then(|s| s.phase.as_deref()).is_some_and(|ph| ph == "Succeeded" || ph == "Failed"),
            deleting: p.metadata.deletion_timestamp.is_some(),
            ip: status.and_then(|s| s.pod_ip.clone()),
        }
    }
}

/// One of the pool's PersistentVolumeClaims (a deleted one lingers while
/// its `pvc-protection` finalizer holds it: its name stays taken).
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedPvc {
    pub name: String,
    pub deleting: bool,
    /// Labelled with a claim: a claimed sandbox's workspace, never handed
    /// to a warm Pod (another claim's sandbox) even if its Pod is gone.
    pub claimed: bool,
}

/// One step toward the desired pool.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    CreatePvc(Box<PersistentVolumeClaim>),
    CreatePod(Box<Pod>),
    DeletePod(String),
    DeletePvc(String),
}

/// A Pod no claim holds: neither labelled with one nor answered to one
/// whose ownership patch is still to come (`answered`).
fn warm(p: &ObservedPod, answered: &BTreeSet<String>) -> bool {
    p.claimed_by.is_none() && !answered.contains(&p.name) && !p.deleting
}

/// The actions that make the pool's warm Pods `d.replicas` (`desired` is
/// `None` once the SandboxPool is being deleted: every warm Pod goes).
/// `pods`: the pool's Pods in the cache; `pvcs`: its PVCs;
/// `answered`: Pods a claim was answered with (the ownership patch follows).
pub fn plan(
    desired: Option<&Desired>,
    pods: &[ObservedPod],
    pvcs: &[ObservedPvc],
    answered: &BTreeSet<String>,
) -> Vec<Action> {
    let mut actions = Vec::new();
    let remove = |name: &str, actions: &mut Vec<Action>| {
        actions.push(Action::DeletePod(name.to_string()));
        if pvcs.iter().any(|v| v.name == name && !v.deleting) {
            actions.push(Action::DeletePvc(name.to_string()));
        }
    };
    let (live, ended): (Vec<&ObservedPod>, Vec<&ObservedPod>) =
        pods.iter().filter(|p| warm(p, answered)).partition(|p| !p.ended);
    // An ended warm Pod is no sandbox: replaced, never restarted.
    for p in &ended {
        remove(&p.name, &mut actions);
    }
    let want = desired.map_or(0, |d| d.replicas as usize);
    if live.len() > want {
        // Keep the Ready ones, then the lowest names.
        let mut extra = live.clone();
        extra.sort_by(|a, b| (a.ready, &b.name).cmp(&(b.ready, &a.name)));
        for p in extra.iter().take(live.len() - want) {
            remove(&p.name, &mut actions);
        }
    }
    let Some(d) = desired else { return actions };
    let taken: BTreeSet<&str> =
        pods.iter().map(|p| p.name.as_str()).chain(pvcs.iter().map(|v| v.name.as_str())).collect();
    // A live PVC without its Pod (the Pod's create lost, or the cache
    // behind): its Pod is made again before a new name is taken.
    let mut podless = pvcs
        .iter()
        .filter(|v| !v.deleting && !v.claimed && d.pod.workspace.is_some() && !pods.iter().any(|p| p.name == v.name))
        .map(|v| v.name.clone());
    let mut fresh = (0..).map(|n| format!("{}-{n}", d.pool)).filter(|n| !taken.contains(n.as_str()));
    for _ in live.len()..want {
        match podless.next() {
            Some(name) => actions.push(Action::CreatePod(Box::new(pod(d, &name)))),
            None => {
                let name = fresh.next().unwrap_or_default();
                if let Some(v) = pvc(d, &name) {
                    actions.push(Action::CreatePvc(Box::new(v)));
                }
                actions.push(Action::CreatePod(Box::new(pod(d, &name))));
            }
        }
    }
    actions
}

/// The warm Pod a claim takes: Ready in the cache, held by no claim, the
/// lowest name first (deterministic for a given cache).
pub fn pick<'a>(pods: &'a [ObservedPod], answered: &BTreeSet<String>) -> Option<&'a ObservedPod> {
    pods.iter().filter(|p| warm(p, answered) && p.ready && !p.ended).min_by(|a, b| a.name.cmp(&b.name))
}

fn labels(d: &Desired) -> BTreeMap<String, String> {
    BTreeMap::from([
        (POOL_LABEL.to_string(), d.pool.clone()),
        ("app.kubernetes.io/managed-by".to_string(), "ember-operator".to_string()),
        ("app.kubernetes.io/component".to_string(), "sandbox".to_string()),
    ])
}

fn meta(d: &Desired, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(d.namespace.clone()),
        labels: Some(labels(d)),
        owner_references: d.owner.clone().map(|o| vec![o]),
        ..Default::default()
    }
}

/// A sandbox Pod: the runtime class's isolation (gVisor, Kata) under a
/// security context PodSecurity's `restricted` level admits (non-root, no
/// privilege escalation, every capability dropped, the runtime's seccomp
/// profile), no service-account token and no service links (a sandbox has no
/// business with the API server or the cluster's Services), never restarted.
pub fn pod(d: &Desired, name: &str) -> Pod {
    let limits: BTreeMap<String, Quantity> = d
        .resources
        .iter()
        .flat_map(|r| [("memory", r.memory.clone()), ("cpu", r.cpu.clone())])
        .filter_map(|(k, v)| Some((k.to_string(), Quantity(v?))))
        .collect();
    let workspace = d.pod.workspace.is_some();
    let container = Container {
        name: "sandbox".into(),
        image: Some(d.image.clone()),
        command: (!d.pod.command.is_empty()).then(|| d.pod.command.clone()),
        ports: Some(vec![ContainerPort {
            name: Some("sandbox".into()),
            container_port: i32::from(d.pod.port.unwrap_or(DEFAULT_PORT)),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        resources: (!limits.is_empty()).then(|| ResourceRequirements { limits: Some(limits), ..Default::default() }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
            run_as_non_root: Some(true),
            ..Default::default()
        }),
        volume_mounts: workspace.then(|| {
            vec![VolumeMount { name: "workspace".into(), mount_path: WORKSPACE_PATH.into(), ..Default::default() }]
        }),
        ..Default::default()
    };
    let spec = PodSpec {
        runtime_class_name: d.runtime_class.clone(),
        containers: vec![container],
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(SANDBOX_UID),
            run_as_group: Some(SANDBOX_UID),
            fs_group: Some(SANDBOX_UID),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
            ..Default::default()
        }),
        volumes: workspace.then(|| {
            let source = PersistentVolumeClaimVolumeSource { claim_name: name.to_string(), read_only: None };
            vec![Volume { name: "workspace".into(), persistent_volume_claim: Some(source), ..Default::default() }]
        }),
        ..Default::default()
    };
    Pod { metadata: meta(d, name), spec: Some(spec), status: None }
}

/// The Pod's workspace, when the pool asks for one.
pub fn pvc(d: &Desired, name: &str) -> Option<PersistentVolumeClaim> {
    let w = d.pod.workspace.as_ref()?;
    let spec = PersistentVolumeClaimSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        storage_class_name: w.storage_class_name.clone(),
        resources: Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([("storage".to_string(), Quantity(w.size.clone()))])),
            ..Default::default()
        }),
        ..Default::default()
    };
    Some(PersistentVolumeClaim { metadata: meta(d, name), spec: Some(spec), status: None })
}

/// The pool's status: `idle` the Ready warm Pods (a claim takes one now),
/// `starting` the warm ones not Ready yet, `claimed` the Pods claims hold.
pub fn status(
    prev: Option<&SandboxPoolStatus>,
    d: &Desired,
    pods: &[ObservedPod],
    answered: &BTreeSet<String>,
    generation: Option<i64>,
    now: &str,
) -> SandboxPoolStatus {
    let live = |p: &&ObservedPod| !p.deleting && !p.ended;
    let idle = pods.iter().filter(live).filter(|p| warm(p, answered) && p.ready).count() as u32;
    let starting = pods.iter().filter(live).filter(|p| warm(p, answered) && !p.ready).count() as u32;
    let claimed = pods.iter().filter(live).filter(|p| !warm(p, answered)).count() as u32;
    let ready = if idle >= d.replicas {
        Condition::new("Ready", true, "Warm", format!("{idle} Ready Pods of a target of {}", d.replicas))
    } else {
        let why = format!("{idle} Ready Pods, {starting} starting, target {}", d.replicas);
        Condition::new("Ready", false, "Filling", why)
    };
    let prev_conditions = prev.map(|p| p.conditions.as_slice()).unwrap_or_default();
    SandboxPoolStatus {
        replicas: i32::try_from(idle).unwrap_or(i32::MAX),
        selector: format!("{POOL_LABEL}={}", d.pool),
        node_pool: String::new(),
        idle,
        starting,
        claimed,
        target: d.replicas,
        capacity: PoolCapacity { min: 0, max: d.replicas, ..Default::default() },
        observed_generation: generation,
        conditions: conditions::set(prev_conditions, ready.generation(generation), now),
    }
}
