//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's
//! leaderelection does it: the holder renews `renewTime` every third of the
//! lease; another replica takes the lease only once it has gone unrenewed
//! for a whole `leaseDurationSeconds`. Every write carries the resourceVersion
//! read, so two replicas racing for an expired lease cannot both win (the
//! API server refuses the second with 409).
use crate::Error;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use std::time::Duration;

/// May `me` write the lease now? Pure: the decision behind `acquire`/`renew`.
pub fn may_take(spec: Option<&LeaseSpec>, me: &str, now: Timestamp) -> bool {
    let Some(spec) = spec else { return true };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == me {
        return true;
    }
    let (Some(renewed), Some(secs)) = (spec.renew_time.as_ref(), spec.lease_duration_seconds) else { return true };
    renewed.0 + SignedDuration::from_secs(i64::from(secs)) < now
}

/// The lease held by `me` from `now`, built from what was read.
fn held(prev: Option<&LeaseSpec>, me: &str, secs: i32, now: Timestamp) -> LeaseSpec {
    let ours = prev.and_then(|p| p.holder_identity.as_deref()) == Some(me);
    let transitions = prev.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.into()),
        lease_duration_seconds: Some(secs),
        acquire_time: if ours { prev.and_then(|p| p.acquire_time.clone()) } else { Some(MicroTime(now)) },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours || prev.is_none() { transitions } else { transitions + 1 }),
        ..Default::default()
    }
}

pub struct Elector {
    api: Api<Lease>,
    name: String,
    me: String,
    secs: i32,
}

impl Elector {
    pub fn new(client: kube::Client, namespace: &str, name: &str, me: &str, lease: Duration) -> Elector {
        let secs = i32::try_from(lease.as_secs().max(1)).unwrap_or(i32::MAX);
        Elector { api: Api::namespaced(client, namespace), name: name.into(), me: me.into(), secs }
    }

    /// One attempt to take or renew the lease: `Ok(true)` when `me` holds it.
    pub async fn try_hold(&self) -> Result<bool, Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(&self.name).await?;
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        if !may_take(spec, &self.me, now) {
            return Ok(false);
        }
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                resource_version: current.as_ref().and_then(|l| l.metadata.resource_version.clone()),
                ..Default::default()
            },
            spec: Some(held(spec, &self.me, self.secs, now)),
        };
        let written = match current {
            None => self.api.create(&PostParams::default(), &lease).await,
            Some(_) => self.api.replace(&self.name, &PostParams::default(), &lease).await,
        };
        match written {
            Ok(_) => Ok(true),
            // Another replica wrote first: it holds the lease.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits until `me` holds the lease.
    pub async fn acquire(&self) -> Result<(), Error> {
        loop {
            if self.try_hold().await? {
                return Ok(());
            }
            tokio::time::sleep(self.period()).await;
        }
    }

    /// Renews the lease every third of its duration; returns when it is lost
    /// (another holder, or no renewal for a whole lease): the caller must stop
    /// reconciling then, another replica may already be leading.
    pub async fn keep(&self) -> Error {
        let mut last_renewed = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.period()).await;
            match self.try_hold().await {
                Ok(true) => last_renewed = tokio::time::Instant::now(),
                Ok(false) => return Error::LeaseLost(self.name.clone(), "another replica holds it".into()),
                Err(e) if last_renewed.elapsed() >= Duration::from_secs(self.secs as u64) => {
                    return Error::LeaseLost(self.name.clone(), format!("not renewed for a whole lease: {e}"));
                }
                Err(e) => tracing::warn!("lease {}: renewal failed, retrying: {e}", self.name),
            }
        }
    }

    fn period(&self) -> Duration {
        Duration::from_secs(self.secs as u64) / 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn a_live_lease_of_another_is_respected_until_it_expires() {
        let other = held(None, "b", 15, at(0));
        assert!(!may_take(Some(&other), "a", at(10)));
        assert!(!may_take(Some(&other), "a", at(15)));
        assert!(may_take(Some(&other), "a", at(16)));
        assert!(may_take(Some(&other), "b", at(1)), "the holder renews");
        assert!(may_take(None, "a", at(0)), "no lease yet");
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let first = held(None, "a", 15, at(0));
        assert_eq!(first.lease_transitions, Some(0));
        let renewed = held(Some(&first), "a", 15, at(5));
        assert_eq!((renewed.lease_transitions, renewed.acquire_time.clone()), (Some(0), first.acquire_time.clone()));
        let taken = held(Some(&renewed), "b", 15, at(30));
        assert_eq!((taken.lease_transitions, taken.holder_identity.as_deref()), (Some(1), Some("b")));
    }
}
