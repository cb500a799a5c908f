//! Pod mode's IO around `plan.rs`: a pod-mode SandboxPool's pass reads its
//! Pods from the informer cache and its PVCs from the API server, takes the
//! planned actions and writes the status; a claim of such a pool is answered
//! from the cache alone (a Ready warm Pod), its status written, and only then
//! the ownership patch (the Pod's claim label and owner) is sent: the claim
//! never waits on it. Until the cache shows that patch, the operator keeps
//! the answer in memory ([`Answered`]), so neither the pool nor another claim
//! takes the Pod meanwhile; after a restart the claim's own status names it.
use super::plan::{self, Desired, ObservedPod, ObservedPvc, CLAIM_LABEL, POOL_LABEL};
use crate::claim_controller::claim_uid;
use crate::controller::{now, patch_status, Ctx};
use crate::crd::{Condition, SandboxClaim, SandboxClaimStatus, SandboxPool};
use crate::{conditions, Error};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

/// Claims answered whose ownership patch the cache does not show yet:
/// claim uid → (namespace, Pod name).
#[derive(Default)]
pub(crate) struct Answered(Mutex<BTreeMap<String, (String, String)>>);

impl Answered {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (String, String)>> {
        // A panic while holding it left a map that is still whole.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pods_in(map: &BTreeMap<String, (String, String)>, ns: &str) -> BTreeSet<String> {
        map.values().filter(|(n, _)| n == ns).map(|(_, p)| p.clone()).collect()
    }

    fn in_namespace(&self, ns: &str) -> BTreeSet<String> {
        Answered::pods_in(&self.lock(), ns)
    }
}

fn desired(p: &SandboxPool, ns: &str) -> Desired {
    Desired {
        pool: p.name_any(),
        namespace: ns.to_string(),
        image: p.spec.template.clone(),
        replicas: u32::try_from(p.spec.replicas).unwrap_or(0),
        runtime_class: p.spec.runtime_class.clone(),
        resources: p.spec.resources.clone(),
        pod: p.spec.pod.clone().unwrap_or_default(),
        owner: p.controller_owner_ref(&()),
    }
}

/// The pool's Pods as the informer cache holds them.
fn cached(ctx: &Ctx, ns: &str, pool: &str) -> Vec<ObservedPod> {
    let of_pool = |p: &Pod| {
        p.namespace().as_deref() == Some(ns)
            && p.metadata.labels.as_ref().and_then(|l| l.get(POOL_LABEL)).map(String::as_str) == Some(pool)
    };
    ctx.pods.state().iter().filter(|p| of_pool(p)).map(|p| ObservedPod::of(p)).collect()
}

async fn pvcs(ctx: &Ctx, ns: &str, selector: &str) -> Result<Vec<ObservedPvc>, Error> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.kube.clone(), ns);
    let list = api.list(&ListParams::default().labels(selector)).await?;
    let observed = |v: &PersistentVolumeClaim| ObservedPvc {
        name: v.name_any(),
        deleting: v.metadata.deletion_timestamp.is_some(),
        claimed: v.labels().contains_key(CLAIM_LABEL),
    };
    Ok(list.items.iter().map(observed).collect())
}

/// A create of a name that exists (a pass repeated on a stale cache) and a
/// delete of one already gone are what was asked: done.
fn done<T>(r: Result<T, kube::Error>) -> Result<(), Error> {
    match r {
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        r => r.map(drop).map_err(Error::from),
    }
}

async fn step(ctx: &Ctx, ns: &str, action: plan::Action) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.kube.clone(), ns);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.kube.clone(), ns);
    let pp = PostParams { field_manager: Some(crate::controller::MANAGER.into()), ..Default::default() };
    match action {
        plan::Action::CreatePvc(v) => done(pvcs.create(&pp, &v).await),
        plan::Action::CreatePod(p) => done(pods.create(&pp, &p).await),
        plan::Action::DeletePod(name) => done(pods.delete(&name, &DeleteParams::default()).await),
        plan::Action::DeletePvc(name) => done(pvcs.delete(&name, &DeleteParams::default()).await),
    }
}

/// A pod-mode SandboxPool's pass: the warm Pods and their PVCs made or
/// removed toward `spec.replicas`, the status from the cache.
pub(crate) async fn apply_pool(p: &SandboxPool, ns: &str, api: &Api<SandboxPool>, ctx: &Ctx) -> Result<Action, Error> {
    // An empty cache before the first list would read as an empty pool.
    if ctx.pods.wait_until_ready().await.is_err() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let d = desired(p, ns);
    let pods = cached(ctx, ns, &d.pool);
    let answered = ctx.answered.in_namespace(ns);
    let volumes = pvcs(ctx, ns, &format!("{POOL_LABEL}={}", d.pool)).await?;
    for action in plan::plan(Some(&d), &pods, &volumes, &answered) {
        step(ctx, ns, action).await?;
    }
    let status = plan::status(p.status.as_ref(), &d, &pods, &answered, p.metadata.generation, &now());
    let settled = status.idle >= status.target && status.starting == 0;
    if p.status.as_ref() != Some(&status) {
        patch_status(api, &d.pool, &status).await?;
    }
    Ok(Action::requeue(if settled { ctx.resync } else { Duration::from_millis(500) }))
}

/// A deleted pod-mode SandboxPool: its warm Pods (and PVCs) removed; the
/// claimed ones stay with their claims.
pub(crate) async fn cleanup_pool(p: &SandboxPool, ns: &str, ctx: &Ctx) -> Result<Action, Error> {
    let pool = p.name_any();
    let pods = cached(ctx, ns, &pool);
    let volumes = pvcs(ctx, ns, &format!("{POOL_LABEL}={pool}")).await?;
    for action in plan::plan(None, &pods, &volumes, &ctx.answered.in_namespace(ns)) {
        step(ctx, ns, action).await?;
    }
    Ok(Action::await_change())
}

/// The Pod bound to the claim: labelled with it (the patch is in), else
/// answered by this process, else named by the claim's status (answered
/// before a restart, the patch lost).
fn bound(c: &SandboxClaim, uid: &str, pods: &[ObservedPod], ctx: &Ctx) -> Option<String> {
    let labelled = pods.iter().find(|p| p.claimed_by.as_deref() == Some(uid)).map(|p| p.name.clone());
    let answered = || ctx.answered.lock().get(uid).map(|(_, p)| p.clone());
    labelled.or_else(answered).or_else(|| c.status.as_ref().and_then(|s| s.sandbox_id.clone()))
}

/// A claim of a pod-mode pool: answered from the cache, the ownership patch after.
pub(crate) async fn apply_claim(
    c: &SandboxClaim,
    ns: &str,
    api: &Api<SandboxClaim>,
    pool: &SandboxPool,
    ctx: &Ctx,
) -> Result<Action, Error> {
    let uid = claim_uid(c, ns)?;
    let pods = cached(ctx, ns, &pool.name_any());
    let name = match bound(c, &uid, &pods, ctx) {
        Some(name) => name,
        None => {
            // Picked and held in one step: two claims never take one Pod.
            let picked = {
                let mut answered = ctx.answered.lock();
                let pick = plan::pick(&pods, &Answered::pods_in(&answered, ns)).map(|p| p.name.clone());
                if let Some(name) = &pick {
                    answered.insert(uid.clone(), (ns.to_string(), name.clone()));
                }
                pick
            };
            let Some(name) = picked else {
                let why = Condition::new("Ready", false, "NoWarmPod", "no Ready warm Pod in the pool yet");
                write_claim(c, api, None, 0, why).await?;
                return Ok(Action::requeue(Duration::from_millis(500)));
            };
            name
        }
    };
    let pod = pods.iter().find(|p| p.name == name);
    let ready = match pod {
        Some(p) if p.ready && !p.ended => Condition::new("Ready", true, "PodReady", format!("Pod {name} is Ready")),
        Some(p) => Condition::new("Ready", false, "PodNotReady", format!("Pod {name} ended or is not Ready: {p:?}")),
        None => Condition::new("Ready", false, "SandboxEnded", format!("Pod {name} is gone")),
    };
    // The answer first: the claim's status names its Pod.
    let port = pool.spec.pod.as_ref().and_then(|p| p.port).unwrap_or(plan::DEFAULT_PORT);
    write_claim(c, api, pod, port, ready).await?;
    if let Some(p) = pod.filter(|p| p.claimed_by.is_none()) {
        own(c, ns, &p.name, &uid, ctx).await?;
    } else if pod.is_some_and(|p| p.claimed_by.as_deref() == Some(uid.as_str())) {
        // The cache shows the patch: the Pod's label holds the claim now.
        ctx.answered.lock().remove(&uid);
    }
    Ok(Action::requeue(if pod.is_some_and(|p| p.ready) { ctx.resync } else { Duration::from_millis(500) }))
}

async fn write_claim(
    c: &SandboxClaim,
    api: &Api<SandboxClaim>,
    pod: Option<&ObservedPod>,
    port: u16,
    ready: Condition,
) -> Result<(), Error> {
    let prev = c.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let status = SandboxClaimStatus {
        sandbox_id: pod.map(|p| p.name.clone()),
        endpoint: pod.and_then(|p| p.ip.as_deref()).map(|ip| plan::endpoint(ip, port)),
        launch: pod.map(|_| "warm".to_string()),
        conditions: conditions::set(prev, ready.generation(c.metadata.generation), &now()),
    };
    if c.status.as_ref() != Some(&status) {
        patch_status(api, &c.name_any(), &status).await?;
    }
    Ok(())
}

/// The ownership patch: the Pod (and its PVC) labelled with the claim and
/// owned by it, which takes it out of the pool's warm count for good.
async fn own(c: &SandboxClaim, ns: &str, pod: &str, uid: &str, ctx: &Ctx) -> Result<(), Error> {
    let owner = c.controller_owner_ref(&()).map(|o| vec![o]).unwrap_or_default();
    let patch = Patch::Merge(serde_json::json!({
        "metadata": { "labels": { CLAIM_LABEL: uid }, "ownerReferences": owner }
    }));
    let pp = PatchParams::apply(crate::controller::MANAGER);
    Api::<Pod>::namespaced(ctx.kube.clone(), ns).patch(pod, &pp, &patch).await?;
    done(Api::<PersistentVolumeClaim>::namespaced(ctx.kube.clone(), ns).patch(pod, &pp, &patch).await)
}

/// A deleted claim's Pods and PVCs (labelled with it, or answered and not
/// yet patched) removed. Returns whether it had any: a pod-mode claim.
pub(crate) async fn cleanup_claim(c: &SandboxClaim, ns: &str, ctx: &Ctx) -> Result<bool, Error> {
    let uid = c.uid().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.kube.clone(), ns);
    let labelled = pods.list(&ListParams::default().labels(&format!("{CLAIM_LABEL}={uid}"))).await?;
    let mut names: BTreeSet<String> = labelled.items.iter().map(|p| p.name_any()).collect();
    let answered = ctx.answered.lock().get(&uid).map(|(_, p)| p.clone());
    names.extend(answered);
    for name in &names {
        step(ctx, ns, plan::Action::DeletePod(name.clone())).await?;
        step(ctx, ns, plan::Action::DeletePvc(name.clone())).await?;
    }
    ctx.answered.lock().remove(&uid);
    Ok(!names.is_empty())
}
