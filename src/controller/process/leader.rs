//! Leader election with a `coordination.k8s.io/v1` Lease, so that of several replicas only
//! one patches CRDs.
//!
//! The algorithm is client-go's (`tools/leaderelection`): the holder renews `renewTime`
//! every retry period; a candidate takes the lease over only after it has seen the same
//! lease record unchanged for a whole `leaseDurationSeconds` on its own monotonic clock (so
//! clock skew between replicas does not matter); every write carries the resourceVersion it
//! read, so two candidates cannot both win. No crate for this exists for kube 5
//! (kube-leader-election is built on kube 4), hence this module.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use crate::controller::request::status_code;

/// Timing of the election, as client-go's defaults.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (pod name, or host name and process id).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// The holder gives up leadership when it could not renew for this long.
    pub renew_deadline: Duration,
    /// How often to try to acquire or renew.
    pub retry_period: Duration,
}

impl LeaseSettings {
    pub fn new(namespace: String, name: String, identity: String) -> Self {
        Self {
            namespace,
            name,
            identity,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// What to do with the lease as last read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAction {
    /// No lease exists: create it holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Nobody holds it, or its holder stopped renewing: take it over.
    TakeOver,
    /// Somebody else holds it.
    Wait,
}

/// Decides from the lease record and whether it has been seen unchanged for a whole lease
/// duration.
pub fn decide(lease: Option<&Lease>, identity: &str, unchanged_for_a_lease_duration: bool) -> LeaseAction {
    let Some(lease) = lease else {
        return LeaseAction::Create;
    };
    let holder = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("");
    if holder == identity {
        LeaseAction::Renew
    } else if holder.is_empty() || unchanged_for_a_lease_duration {
        LeaseAction::TakeOver
    } else {
        LeaseAction::Wait
    }
}

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("lease {namespace}/{name} is held by another replica")]
    Taken { namespace: String, name: String },
    #[error("could not renew lease {namespace}/{name} for {deadline:?}; giving up leadership")]
    Lost {
        namespace: String,
        name: String,
        deadline: Duration,
    },
}

/// One replica's side of the election.
pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
    /// The last lease record seen (holder, renewTime, resourceVersion) and when it was
    /// first seen.
    observed: Mutex<Option<(String, Instant)>>,
}

impl LeaderElector {
    pub fn new(client: Client, settings: LeaseSettings) -> Self {
        Self {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            observed: Mutex::new(None),
        }
    }

    /// Waits until this replica holds the lease; returns when the winning attempt was sent,
    /// which `hold` measures its renew deadline from.
    pub async fn acquire(&self) -> Instant {
        info!(lease = %self.settings.name, namespace = %self.settings.namespace, identity = %self.settings.identity, "waiting for leadership");
        loop {
            let sent = Instant::now();
            // Bounded like a renewal: an answer later than that starts no leadership.
            match tokio::time::timeout(self.settings.renew_deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => {
                    info!(identity = %self.settings.identity, "became leader");
                    return sent;
                }
                Ok(Ok(false)) => {}
                Ok(Err(error)) => warn!(error = %error, "leader election request failed"),
                Err(_) => warn!("leader election request did not answer within the renew deadline"),
            }
            tokio::time::sleep(self.settings.retry_period).await;
        }
    }

    /// Renews the lease until renewal fails for longer than the renew deadline, or another
    /// replica holds it; returns only then. `renewed` is when the attempt that won the lease
    /// was sent (`acquire`'s answer).
    ///
    /// The deadline is measured from when the last successful renewal was **sent**, not from
    /// when its answer came: the apiserver wrote it at some instant in between, and the
    /// others' lease duration runs from that write, so an answer that arrives late must not
    /// move the deadline. As client-go bounds each renewal with
    /// `context.WithTimeout(RenewDeadline)`, every attempt here is cut off at the deadline: a
    /// hung request, or a client retrying 429 or 503 for minutes, cannot keep this replica
    /// acting after the lease it no longer renews has expired for the others
    /// (`renew_deadline` < `lease_duration`; docs/src/internals/architecture.md, "Fencing").
    pub async fn hold(&self, renewed: Instant) -> LeaseError {
        let mut deadline = renewed + self.settings.renew_deadline;
        loop {
            let pause = self
                .settings
                .retry_period
                .min(deadline.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause).await;
            let sent = Instant::now();
            let left = deadline.saturating_duration_since(sent);
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => deadline = sent + self.settings.renew_deadline,
                // Another replica holds the lease now: stop acting at once.
                Ok(Ok(false)) => {
                    return LeaseError::Taken {
                        namespace: self.settings.namespace.clone(),
                        name: self.settings.name.clone(),
                    };
                }
                Ok(Err(error)) => warn!(error = %error, "lease renewal failed"),
                Err(_) => {
                    warn!(deadline = ?self.settings.renew_deadline, "lease renewal did not answer before the renew deadline")
                }
            }
            if Instant::now() >= deadline {
                return LeaseError::Lost {
                    namespace: self.settings.namespace.clone(),
                    name: self.settings.name.clone(),
                    deadline: self.settings.renew_deadline,
                };
            }
        }
    }

    /// Gives the lease up on shutdown so that another replica takes over at once (bounded
    /// by the renew deadline: an apiserver that does not answer must not hold up the exit).
    pub async fn release(&self) {
        if tokio::time::timeout(self.settings.renew_deadline, self.release_now())
            .await
            .is_err()
        {
            warn!("could not release the lease in time; it expires by itself");
        }
    }

    async fn release_now(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.settings.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        match self
            .api
            .replace(&self.settings.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!("released leadership"),
            Err(error) => warn!(error = %error, "could not release the lease"),
        }
    }

    /// One round: `Ok(true)` when this replica holds the lease afterwards.
    async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.settings.name).await?;
        let expired = self.unchanged_for_a_lease_duration(current.as_ref());
        let action = decide(current.as_ref(), &self.settings.identity, expired);
        let now = MicroTime(Timestamp::now());
        let duration_seconds = i32::try_from(self.settings.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let result = match (action, current) {
            (LeaseAction::Wait, _) => return Ok(false),
            (LeaseAction::Create, _) | (_, None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.settings.name.clone()),
                        namespace: Some(self.settings.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.settings.identity.clone()),
                        lease_duration_seconds: Some(duration_seconds),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (action, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if action == LeaseAction::TakeOver {
                    spec.holder_identity = Some(self.settings.identity.clone());
                    spec.acquire_time = Some(now.clone());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.lease_duration_seconds = Some(duration_seconds);
                spec.renew_time = Some(now);
                // `replace` sends the resourceVersion we read: a concurrent writer makes
                // this fail with 409 instead of both replicas winning.
                self.api
                    .replace(&self.settings.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match result {
            Ok(lease) => {
                self.observe(Some(&lease));
                Ok(true)
            }
            Err(error) if matches!(status_code(&error), Some(409)) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Whether this lease record has been seen unchanged for a whole lease duration (by our
    /// monotonic clock), recording it as seen now if it is new.
    fn unchanged_for_a_lease_duration(&self, lease: Option<&Lease>) -> bool {
        let Some(lease) = lease else { return false };
        let record = record_key(lease);
        let duration = lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.settings.lease_duration, Duration::from_secs);
        let mut observed = self
            .observed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match observed.as_ref() {
            Some((seen, since)) if *seen == record => since.elapsed() >= duration,
            _ => {
                *observed = Some((record, Instant::now()));
                false
            }
        }
    }

    fn observe(&self, lease: Option<&Lease>) {
        let mut observed = self
            .observed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *observed = lease.map(|l| (record_key(l), Instant::now()));
    }
}

fn record_key(lease: &Lease) -> String {
    let spec = lease.spec.clone().unwrap_or_default();
    format!(
        "{}|{:?}|{}",
        spec.holder_identity.unwrap_or_default(),
        spec.renew_time.map(|t| t.0),
        lease.resource_version().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn decisions() {
        assert_eq!(decide(None, "me", false), LeaseAction::Create);
        assert_eq!(decide(Some(&lease(Some("me"))), "me", true), LeaseAction::Renew);
        assert_eq!(
            decide(Some(&lease(Some("other"))), "me", false),
            LeaseAction::Wait
        );
        assert_eq!(
            decide(Some(&lease(Some("other"))), "me", true),
            LeaseAction::TakeOver
        );
        assert_eq!(decide(Some(&lease(None)), "me", false), LeaseAction::TakeOver);
        assert_eq!(decide(Some(&lease(Some(""))), "me", false), LeaseAction::TakeOver);
    }
}
