//! Which CRDs the conversion webhook serves, and the `caBundle` each holds, read without
//! listing the CRDs. A cluster may hold thousands of CRDs of hundreds of kB each (Crossplane
//! installs about a thousand): a list of them in full is hundreds of MB, too much for the
//! CA keeper's minute and the certificate refresher's rechecks (1 to 30 s, per replica,
//! during a rotation).
//!
//! The webhook already keeps, on every replica, a watch of the VersionPolicies and one of the
//! CRDs' metadata (`webhook::CachedPolicies`): it converts for a CRD through the policy the
//! CRD's webhook path names or, once the policy is gone, the conversion recorded on the CRD
//! (`crdlifecycle.io/conversion`). Those are the candidates: a CRD some policy names in
//! `spec.crdName`, or one that records a conversion. Any other CRD pointed at the webhook
//! gets every review refused (no policy, no record), whatever CA it trusts, so its
//! `caBundle` is not the keeper's to keep. A candidate's spec is read (one GET) only at a
//! resourceVersion this process has not read yet: once after a start, then after each
//! change the metadata watch delivers. Unrelated CRDs are never read.
//!
//! What is read is as fresh as the metadata watch (milliseconds behind the apiserver, as
//! any informer): a CRD written since is read at the next pass after the watch delivers
//! the write, and a write from a stale read is refused with 409 and read again.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::reflector::Store;

use super::Error;
use crate::api::VersionPolicy;
use crate::conversion::RecordedConversion;

/// How long a read waits for the webhook's watches to list for the first time.
const LISTED_WITHIN: Duration = Duration::from_secs(10);

/// How many CRDs are read at once (each may be a MB).
const READS_AT_ONCE: usize = 4;

/// A CRD whose `spec.conversion` points at the webhook, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PointedCrd {
    pub(crate) name: String,
    /// The resourceVersion it was read at.
    pub(crate) resource_version: String,
    /// Its `caBundle` (PEM), if it has one.
    pub(crate) ca_bundle: Option<Vec<u8>>,
}

/// The CRDs the webhook serves, as this process last read them.
pub struct WebhookCrds {
    policies: Store<DeserializeGuard<VersionPolicy>>,
    crds: Store<PartialObjectMeta<CustomResourceDefinition>>,
    /// Whether the two watches behind them listed once.
    listed: [crate::sync::Listed; 2],
    /// Each candidate read, by name: the resourceVersion it was read at and, if it points at
    /// the webhook, what it holds. One pass at a time, so that two never read the same CRD.
    read: tokio::sync::Mutex<BTreeMap<String, Read>>,
}

struct Read {
    resource_version: String,
    pointed: Option<PointedCrd>,
}

impl WebhookCrds {
    /// Candidates from the webhook's caches (see `webhook::CachedPolicies::watch`).
    pub fn new(caches: &crate::webhook::CachedPolicies) -> WebhookCrds {
        WebhookCrds {
            policies: caches.policies.clone(),
            crds: caches.crds.clone(),
            listed: caches.listed(),
            read: tokio::sync::Mutex::default(),
        }
    }

    /// No watch behind it: every read fails (an endpoint that only renders `spec.conversion`).
    pub(crate) fn unwatched() -> WebhookCrds {
        let (policies, _) = kube::runtime::reflector::store();
        let (crds, _) = kube::runtime::reflector::store();
        WebhookCrds::new(&crate::webhook::CachedPolicies::new(policies, crds))
    }

    /// Every candidate that `pointed` says points at the webhook, by name, reading the
    /// candidates whose resourceVersion changed since they were read. `Err` when the watches
    /// have not listed yet or a read failed (what was read meanwhile is kept).
    pub(crate) async fn pointed(
        &self,
        client: &kube::Client,
        pointed: impl Fn(&CustomResourceDefinition) -> Option<PointedCrd>,
    ) -> Result<Vec<PointedCrd>, Error> {
        self.listed().await?;
        let candidates = candidates(&self.policies.state(), &self.crds.state());
        let mut read = self.read.lock().await;
        read.retain(|name, _| candidates.contains_key(name));
        let stale: Vec<String> = candidates
            .iter()
            .filter(|(name, rv)| read.get(*name).map(|r| &r.resource_version) != Some(*rv))
            .map(|(name, _)| name.clone())
            .collect();
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let answers: Vec<(String, Result<Option<CustomResourceDefinition>, kube::Error>)> =
            futures::stream::iter(stale)
                .map(|name| {
                    let api = api.clone();
                    async move {
                        let answer = api.get_opt(&name).await;
                        (name, answer)
                    }
                })
                .buffer_unordered(READS_AT_ONCE)
                .collect()
                .await;
        let mut failed = None;
        for (name, answer) in answers {
            match answer {
                Ok(Some(crd)) => {
                    let _ = read.insert(name, read_of(&crd, &pointed));
                }
                // Deleted since the watch saw it.
                Ok(None) => {
                    read.remove(&name);
                }
                Err(error) => failed = failed.or(Some(error)),
            }
        }
        if let Some(error) = failed {
            return Err(Error::Kube(error));
        }
        Ok(read.values().filter_map(|r| r.pointed.clone()).collect())
    }

    /// Keeps what a write or a read answered (the CRD at its new resourceVersion), so that
    /// the next pass need not read it again; returns it if it points at the webhook.
    pub(crate) async fn remember(
        &self,
        crd: &CustomResourceDefinition,
        pointed: impl Fn(&CustomResourceDefinition) -> Option<PointedCrd>,
    ) -> Option<PointedCrd> {
        let read = read_of(crd, &pointed);
        let found = read.pointed.clone();
        if let Some(name) = &crd.metadata.name {
            let _ = self.read.lock().await.insert(name.clone(), read);
        }
        found
    }

    /// Waits (bounded) until both watches have listed once.
    async fn listed(&self) -> Result<(), Error> {
        // Not the stores' own `wait_until_ready`: the webhook's readiness waits on them too,
        // and they wake one waiter only (`sync::Listed`).
        let both = crate::sync::Listed::all(&self.listed);
        match tokio::time::timeout(LISTED_WITHIN, both).await {
            Ok(true) => Ok(()),
            _ => Err(Error::NotListed {
                what: "the conversion webhook's VersionPolicies and CRD metadata",
            }),
        }
    }
}

fn read_of(
    crd: &CustomResourceDefinition,
    pointed: &impl Fn(&CustomResourceDefinition) -> Option<PointedCrd>,
) -> Read {
    Read {
        resource_version: crd.metadata.resource_version.clone().unwrap_or_default(),
        pointed: pointed(crd),
    }
}

/// The CRDs the webhook can serve, with the resourceVersion the metadata watch last saw:
/// those a policy names in `spec.crdName` and those recording a conversion (pure).
pub(crate) fn candidates(
    policies: &[std::sync::Arc<DeserializeGuard<VersionPolicy>>],
    crds: &[std::sync::Arc<PartialObjectMeta<CustomResourceDefinition>>],
) -> BTreeMap<String, String> {
    let named: std::collections::BTreeSet<&str> = policies
        .iter()
        .filter_map(|guard| guard.0.as_ref().ok())
        .map(|policy| policy.spec.crd_name.as_str())
        .collect();
    crds.iter()
        .filter(|crd| {
            let name = crd.metadata.name.as_deref().unwrap_or_default();
            named.contains(name)
                || RecordedConversion::from_annotations(crd.metadata.annotations.as_ref()).is_some()
        })
        .map(|crd| {
            (
                crd.metadata.name.clone().unwrap_or_default(),
                crd.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    fn crd(
        name: &str,
        rv: &str,
        annotations: serde_json::Value,
    ) -> Arc<PartialObjectMeta<CustomResourceDefinition>> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": name, "resourceVersion": rv, "annotations": annotations},
            }))
            .expect("metadata"),
        )
    }

    fn policy(crd_name: &str) -> Arc<DeserializeGuard<VersionPolicy>> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
                "metadata": {"name": "p"},
                "spec": {"crdName": crd_name, "versions": []},
            }))
            .expect("policy"),
        )
    }

    /// The bound on waiting for the webhook's watches: a read before they listed fails after
    /// `LISTED_WITHIN` (and at once without a watch), and sends nothing.
    #[tokio::test(start_paused = true)]
    async fn a_read_before_the_watches_listed_fails_within_its_bound() {
        let (service, mut apiserver) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let client = kube::Client::new(service, "default");
        let (policies, _policy_writer) = kube::runtime::reflector::store();
        let (crds, _crd_writer) = kube::runtime::reflector::store();
        // Watches that run but have not listed yet.
        let (policies_listed, _policy_lists) = crate::sync::Listed::new::<()>();
        let (crds_listed, _crd_lists) = crate::sync::Listed::new::<()>();
        let unlisted = WebhookCrds {
            policies,
            crds,
            listed: [policies_listed, crds_listed],
            read: tokio::sync::Mutex::default(),
        };
        let started = tokio::time::Instant::now();
        let read = unlisted.pointed(&client, |_| None).await;
        assert!(matches!(read, Err(Error::NotListed { .. })), "{read:?}");
        assert_eq!(started.elapsed(), LISTED_WITHIN);
        let read = WebhookCrds::unwatched().pointed(&client, |_| None).await;
        assert!(matches!(read, Err(Error::NotListed { .. })), "{read:?}");
        assert_eq!(started.elapsed(), LISTED_WITHIN, "no watch: no wait");
        assert!(
            futures::FutureExt::now_or_never(apiserver.next_request()).is_none(),
            "nothing sent"
        );
    }

    #[test]
    fn candidates_are_the_crds_a_policy_names_or_that_record_a_conversion() {
        let recorded =
            json!({"crdlifecycle.io/conversion": json!({"policy": "gone", "conversion": {}}).to_string()});
        let crds = [
            crd("governed.example.com", "1", json!({})),
            crd("released.example.com", "2", recorded),
            crd(
                "broken.example.com",
                "3",
                json!({"crdlifecycle.io/conversion": "not JSON"}),
            ),
            crd("unrelated.example.com", "4", json!({})),
        ];
        let policies = [policy("governed.example.com"), policy("absent.example.com")];
        let found = candidates(&policies, &crds);
        assert_eq!(
            found.into_iter().collect::<Vec<_>>(),
            [
                ("governed.example.com".to_owned(), "1".to_owned()),
                ("released.example.com".to_owned(), "2".to_owned()),
            ],
            "a record the webhook cannot read serves nothing; a policy's CRD that does not exist is not read"
        );
    }
}
