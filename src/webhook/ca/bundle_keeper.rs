//! The leader keeps the `caBundle` of every CRD pointed at the webhook equal to the CAs the
//! replicas need, whatever governs the CRD. A policy's reconcile writes it with the rest of
//! `spec.conversion`, but a CRD whose policy reconciles nothing (suspended, in dry run, in
//! conflict, deleted and released with the webhook left in place) would keep the old CA:
//! no replica would ever serve the rotated certificate (each waits until every CRD pointed
//! at the webhook trusts its CA), and conversion of every CRD would fail once the old
//! certificate expires.
//!
//! The CRDs are not listed: the candidates are those the webhook serves (a policy names
//! them, or they record their conversion), and a candidate is read again only once it
//! changed (`pointed_crds`), so a pass on an unchanged cluster sends no request.
//!
//! Only `caBundle` is written, by a merge patch carrying the resourceVersion read: it sets
//! the field whether the CRD had one or not, and a CRD that changed since it was read answers
//! 409 Conflict (tests/fixtures/apiserver/crd-ca-bundle-writes-v1.36.txt, 3), a lost race:
//! the CRD is read again and written again. Any other refusal (the apiserver's validation of
//! the bundle, an admission policy, RBAC: ibid., 4) is the apiserver saying no, not a race:
//! it is reported (a Warning Event on the CRD and a log line, once per CRD and message) and
//! tried again at each pass, since the bundle or the policy may change.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use serde_json::json;
use tracing::{info, warn};

use super::Error;
use super::endpoint::WebhookEndpoint;
use super::pointed_crds::PointedCrd;
use crate::kube_events;

/// The reason of the Warning Event on a CRD whose CA bundle the apiserver refused
/// (listed with the controller's in `controller::events::EventReason`).
pub const CA_BUNDLE_REFUSED: &str = "CABundleRefused";

/// How often the CRDs are looked at when the bundle did not change (a CRD pointed at the
/// webhook since, a write that lost a race, a refusal that may have been lifted).
const LOOK_AGAIN_EVERY: Duration = Duration::from_secs(60);

/// How many times one pass writes a CRD that keeps changing under it (409 each time) before
/// leaving it to the next pass.
const WRITE_ATTEMPTS: usize = 3;

/// What one pass did.
#[derive(Debug, Default)]
pub struct Synced {
    /// The CRDs whose `caBundle` was written.
    pub written: Vec<String>,
    /// The CRDs that changed under each of the pass's writes (409 every time): the next pass.
    pub raced: Vec<String>,
    /// The CRDs whose write the apiserver refused (a 4xx but 404, 409 and 429: validation,
    /// admission, RBAC), with its message.
    pub refused: Vec<(String, String)>,
    /// The CRDs that could not be written for a reason that may pass by itself (a 5xx, a
    /// 429, the network), with it.
    pub failed: Vec<(String, String)>,
}

/// How one CRD's write went.
enum Outcome {
    Written,
    /// Read again after a 409, it needs no write any more (or is gone).
    Settled,
    Raced,
    Refused(String),
    Failed(String),
}

/// The leader's keeper of the CRDs' `caBundle`.
pub struct CaBundleKeeper {
    client: Client,
    endpoint: Arc<WebhookEndpoint>,
    recorder: Recorder,
    /// Each CRD refused at the last pass, and the apiserver's message: a refusal is reported
    /// when it is new or its message changed, not at every pass.
    refusals: HashMap<String, String>,
}

impl CaBundleKeeper {
    /// A keeper writing `endpoint`'s bundle, reporting refusals through `recorder`.
    pub fn new(client: Client, endpoint: Arc<WebhookEndpoint>, recorder: Recorder) -> CaBundleKeeper {
        CaBundleKeeper {
            client,
            endpoint,
            recorder,
            refusals: HashMap::new(),
        }
    }

    /// Writes the bundle to every CRD pointed at the webhook whose `caBundle` differs, and
    /// reports what the apiserver refused. `Err` only when the CRDs cannot be read.
    pub async fn sync(&mut self) -> Result<Synced, Error> {
        let Some(bundle) = self
            .endpoint
            .ca_bundle
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return Ok(Synced::default());
        };
        let bundle = bundle.into_bytes();
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let mut synced = Synced::default();
        for pointed in self.endpoint.pointed_crds(&self.client).await? {
            if pointed.ca_bundle.as_deref() == Some(bundle.as_slice()) {
                continue;
            }
            let name = pointed.name.clone();
            match self.write(&crds, pointed, &bundle).await {
                Outcome::Written => synced.written.push(name),
                Outcome::Settled => {}
                Outcome::Raced => synced.raced.push(name),
                Outcome::Refused(message) => synced.refused.push((name, message)),
                Outcome::Failed(error) => synced.failed.push((name, error)),
            }
        }
        self.report_refusals(&synced).await;
        Ok(synced)
    }

    /// Writes `bundle` to one CRD, reading it again after each lost race.
    async fn write(
        &self,
        crds: &Api<CustomResourceDefinition>,
        mut crd: PointedCrd,
        bundle: &[u8],
    ) -> Outcome {
        for _ in 0..WRITE_ATTEMPTS {
            let patch = json!({
                "metadata": {"resourceVersion": crd.resource_version},
                "spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": ByteString(bundle.to_vec())}}}},
            });
            match crds
                .patch(&crd.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(written) => {
                    self.endpoint.remember(&written).await;
                    return Outcome::Written;
                }
                Err(kube::Error::Api(status)) if status.code == 409 => match crds.get_opt(&crd.name).await {
                    Ok(Some(current)) => match self.endpoint.remember(&current).await {
                        Some(pointed) if pointed.ca_bundle.as_deref() != Some(bundle) => crd = pointed,
                        // Pointed elsewhere now, or someone wrote the same bundle.
                        _ => return Outcome::Settled,
                    },
                    Ok(None) => return Outcome::Settled,
                    Err(error) => return Outcome::Failed(error.to_string()),
                },
                Err(kube::Error::Api(status)) if status.code == 404 => return Outcome::Settled,
                Err(kube::Error::Api(status)) if refusal(status.code) => {
                    return Outcome::Refused(status.message);
                }
                Err(error) => return Outcome::Failed(error.to_string()),
            }
        }
        Outcome::Raced
    }

    /// A Warning Event on each CRD refused for a new reason, and a log line; a CRD refused
    /// before and written now is logged too.
    async fn report_refusals(&mut self, synced: &Synced) {
        for (crd, message) in &synced.refused {
            if self.refusals.get(crd) == Some(message) {
                continue;
            }
            warn!(
                crd,
                message,
                "the apiserver refused the webhook's CA bundle for the CRD; trying again every minute"
            );
            let note = format!(
                "the apiserver refused the conversion webhook's CA bundle for {crd}: {message}. Until it \
                 accepts one, the webhook's replicas do not serve a certificate of a new CA, and the \
                 CRD's conversions fail once the certificate it trusts expires"
            );
            let event = kube_events::event(EventType::Warning, CA_BUNDLE_REFUSED, "WriteCABundle", note);
            kube_events::send(&self.recorder, &crd_reference(crd), event).await;
        }
        for crd in &synced.written {
            if self.refusals.contains_key(crd) {
                info!(
                    crd,
                    "the apiserver accepted the webhook's CA bundle for the CRD it had refused"
                );
            }
        }
        self.refusals = synced.refused.iter().cloned().collect();
    }

    /// Runs `sync` whenever the bundle changes, and every minute.
    pub async fn run(mut self) {
        let mut changes = self.endpoint.bundle_changes();
        loop {
            match self.sync().await {
                Ok(synced) => {
                    if !synced.written.is_empty() {
                        info!(
                            crds = synced.written.join(", "),
                            "wrote the webhook's CA bundle to the CRDs pointed at it"
                        );
                    }
                    if !synced.raced.is_empty() {
                        info!(
                            crds = synced.raced.join(", "),
                            "the CRDs kept changing while the webhook's CA bundle was written; trying again"
                        );
                    }
                    for (crd, error) in &synced.failed {
                        warn!(
                            crd,
                            error, "cannot write the webhook's CA bundle to the CRD; retrying"
                        );
                    }
                }
                Err(error) => {
                    warn!(error = %error, "cannot read the CRDs to write the webhook's CA bundle; retrying")
                }
            }
            tokio::select! {
                biased;
                _ = changes.changed() => {}
                () = tokio::time::sleep(LOOK_AGAIN_EVERY) => {}
            }
        }
    }
}

/// Whether an error status is the apiserver refusing the write, rather than a race (409), a
/// deletion (404) or a failure that passes by itself (429, 5xx).
fn refusal(code: u16) -> bool {
    (400..500).contains(&code) && !matches!(code, 404 | 409 | 429)
}

/// The CRD named `name`, as an Event's subject.
fn crd_reference(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("apiextensions.k8s.io/v1".to_owned()),
        kind: Some("CustomResourceDefinition".to_owned()),
        name: Some(name.to_owned()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::refusal;

    #[test]
    fn a_refusal_is_neither_a_race_nor_a_passing_failure() {
        for code in [400, 403, 422] {
            assert!(refusal(code), "{code}");
        }
        for code in [404, 409, 429, 500, 503] {
            assert!(!refusal(code), "{code}");
        }
    }
}
