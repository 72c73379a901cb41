//! Where the apiserver reaches the conversion webhook: the `spec.conversion` a governed
//! CRD is given (a Service or a URL, the policy's path, the `caBundle` the replicas need),
//! which CRDs point at the webhook, and the changes of the bundle that every policy is
//! reconciled at.

use std::sync::{Mutex, RwLock};

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::Error;
use super::pointed_crds::{PointedCrd, WebhookCrds};
use super::rotation::CrdBundles;

/// How the apiserver reaches the webhook.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookTarget {
    /// A Service in the cluster (the usual in-cluster deployment).
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
    /// A URL (`https://host:port`), e.g. a controller run outside the cluster.
    Url(String),
}

impl WebhookTarget {
    /// Parses `NAMESPACE/NAME[:PORT]` (port 443 by default).
    pub fn parse_service(text: &str) -> Result<WebhookTarget, String> {
        let (namespace, rest) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not NAMESPACE/NAME[:PORT]"))?;
        let (name, port) = match rest.split_once(':') {
            Some((name, port)) => (name, port.parse().map_err(|_| format!("{port:?} is not a port"))?),
            None => (rest, 443),
        };
        if namespace.is_empty() || name.is_empty() {
            return Err(format!("{text:?} is not NAMESPACE/NAME[:PORT]"));
        }
        Ok(WebhookTarget::Service {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            port,
        })
    }

    /// The names the serving certificate must carry.
    pub fn certificate_names(&self) -> Vec<String> {
        match self {
            WebhookTarget::Service { namespace, name, .. } => vec![
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
                format!("{name}.{namespace}"),
                name.clone(),
            ],
            WebhookTarget::Url(url) => {
                let host = url
                    .split_once("://")
                    .map_or(url.as_str(), |(_, rest)| rest)
                    .split(['/', ':'])
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                vec![host]
            }
        }
    }
}

/// The webhook endpoint, the CA bundle the CRDs must trust, and the CRDs it serves.
pub struct WebhookEndpoint {
    pub target: WebhookTarget,
    /// The CA certificates (PEM), once known.
    pub ca_bundle: RwLock<Option<String>>,
    /// Bumped whenever the bundle changes, so that every policy is reconciled at once: how
    /// many changes so far, and one channel per subscriber (`bundle_changes`), told in the
    /// order they subscribed. Not one channel for all: a `watch` channel wakes its receivers
    /// in a random order (tokio spreads them over several `Notify`s at random), and the
    /// simulation's replays must wake the keeper and the reconciles in one order.
    bundle_changes: Mutex<(u64, Vec<watch::Sender<u64>>)>,
    /// The CRDs the webhook serves, as read.
    crds: WebhookCrds,
}

impl WebhookEndpoint {
    /// An endpoint that renders `spec.conversion` but cannot read the CRDs (see `with_crds`).
    pub fn new(target: WebhookTarget) -> Self {
        Self {
            target,
            ca_bundle: RwLock::new(None),
            bundle_changes: Mutex::default(),
            crds: WebhookCrds::unwatched(),
        }
    }

    /// The same, reading the CRDs it serves through `crds`.
    pub fn with_crds(self, crds: WebhookCrds) -> Self {
        Self { crds, ..self }
    }

    /// Sets the CAs the CRDs must trust (PEM, one or more certificates).
    pub fn set_ca_bundle(&self, pem: String) {
        let mut bundle = self.ca_bundle.write().unwrap_or_else(|p| p.into_inner());
        if bundle.as_deref() != Some(pem.as_str()) {
            *bundle = Some(pem);
            let mut changes = self.bundle_changes.lock().unwrap_or_else(|p| p.into_inner());
            changes.0 += 1;
            let changed = changes.0;
            // A subscriber gone (its receiver dropped) is forgotten.
            changes.1.retain(|subscriber| subscriber.send(changed).is_ok());
        }
    }

    /// The changes of the bundle from now on (for `Controller::reconcile_all_on`).
    pub(crate) fn bundle_changes(&self) -> watch::Receiver<u64> {
        let mut changes = self.bundle_changes.lock().unwrap_or_else(|p| p.into_inner());
        // Those gone since the last change (a leadership term's keeper and reconciles).
        changes.1.retain(|subscriber| !subscriber.is_closed());
        let (subscriber, receiver) = watch::channel(changes.0);
        changes.1.push(subscriber);
        receiver
    }

    /// Every CRD the webhook serves whose `spec.conversion` points at it, by name (see
    /// `WebhookCrds`: no list of the CRDs, a GET of each that changed since it was read).
    pub(crate) async fn pointed_crds(&self, client: &kube::Client) -> Result<Vec<PointedCrd>, Error> {
        self.crds.pointed(client, |crd| self.pointed(crd)).await
    }

    /// Keeps a CRD as a write or a read answered it, so that the next pass need not read it
    /// again; returns it if it points at the webhook.
    pub(crate) async fn remember(&self, crd: &CustomResourceDefinition) -> Option<PointedCrd> {
        self.crds.remember(crd, |crd| self.pointed(crd)).await
    }

    /// The `caBundle` of every CRD the webhook serves whose `spec.conversion` points at it.
    pub(crate) async fn read_bundles(&self, client: &kube::Client) -> Result<CrdBundles, Error> {
        let bundles = self
            .pointed_crds(client)
            .await?
            .into_iter()
            .map(|crd| String::from_utf8_lossy(&crd.ca_bundle.unwrap_or_default()).into_owned())
            .collect();
        Ok(CrdBundles { bundles })
    }

    /// The CRD, if its `spec.conversion` points at this webhook.
    pub(crate) fn pointed(&self, crd: &CustomResourceDefinition) -> Option<PointedCrd> {
        let config = crd
            .spec
            .conversion
            .as_ref()
            .and_then(|c| c.webhook.as_ref())
            .and_then(|w| w.client_config.as_ref())
            .filter(|config| self.is_ours(config))?;
        Some(PointedCrd {
            name: crd.metadata.name.clone().unwrap_or_default(),
            resource_version: crd.metadata.resource_version.clone().unwrap_or_default(),
            ca_bundle: config.ca_bundle.as_ref().map(|b| b.0.clone()),
        })
    }

    /// Whether a CRD's webhook client config points at this webhook.
    pub(crate) fn is_ours(
        &self,
        config: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::WebhookClientConfig,
    ) -> bool {
        match &self.target {
            WebhookTarget::Service { namespace, name, .. } => config
                .service
                .as_ref()
                .is_some_and(|s| s.namespace == *namespace && s.name == *name),
            WebhookTarget::Url(base) => config
                .url
                .as_deref()
                .is_some_and(|u| u.starts_with(base.trim_end_matches('/'))),
        }
    }

    /// The CRD's `spec.conversion` for a policy, once the CA bundle is known.
    pub fn desired_conversion(&self, policy: &str) -> Option<Value> {
        let ca = self.ca_bundle.read().unwrap_or_else(|p| p.into_inner()).clone()?;
        let ca_bundle = serde_json::to_value(ByteString(ca.into_bytes())).ok()?;
        let path = format!("/convert/{policy}");
        let client_config = match &self.target {
            WebhookTarget::Service {
                namespace,
                name,
                port,
            } => json!({
                "caBundle": ca_bundle,
                "service": {"namespace": namespace, "name": name, "path": path, "port": port},
            }),
            WebhookTarget::Url(base) => json!({
                "caBundle": ca_bundle,
                "url": format!("{}{path}", base.trim_end_matches('/')),
            }),
        };
        Some(json!({
            "strategy": "Webhook",
            "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": client_config},
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_service_references() {
        assert_eq!(
            WebhookTarget::parse_service("crd-lifecycle/crd-lifecycle-webhook"),
            Ok(WebhookTarget::Service {
                namespace: "crd-lifecycle".into(),
                name: "crd-lifecycle-webhook".into(),
                port: 443
            })
        );
        assert!(matches!(
            WebhookTarget::parse_service("ns/name:8443"),
            Ok(WebhookTarget::Service { port: 8443, .. })
        ));
        for bad in ["name", "/name", "ns/", "ns/name:x"] {
            assert!(WebhookTarget::parse_service(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn certificate_names_follow_the_target() {
        let url = WebhookTarget::Url("https://10.1.2.3:8443".into());
        assert_eq!(url.certificate_names(), ["10.1.2.3"]);
        let service = WebhookTarget::parse_service("ops/hook").expect("service");
        assert_eq!(service.certificate_names()[0], "hook.ops.svc");
    }

    #[test]
    fn the_desired_conversion_points_at_the_policy_path() {
        let endpoint = WebhookEndpoint::new(WebhookTarget::Url("https://127.0.0.1:8443/".into()));
        assert_eq!(endpoint.desired_conversion("widgets"), None, "no CA yet");
        endpoint.set_ca_bundle("PEM".into());
        let desired = endpoint.desired_conversion("widgets").expect("desired");
        assert_eq!(desired["strategy"], "Webhook");
        assert_eq!(desired["webhook"]["conversionReviewVersions"], json!(["v1"]));
        assert_eq!(
            desired["webhook"]["clientConfig"]["url"],
            "https://127.0.0.1:8443/convert/widgets"
        );
        assert_eq!(desired["webhook"]["clientConfig"]["caBundle"], "UEVN");
    }

    fn pem(ca: u8) -> String {
        format!("-----BEGIN CERTIFICATE-----\nCA{ca}\n-----END CERTIFICATE-----\n")
    }

    /// Every subscriber (the CA keeper, the reconciles) is told of each change from the time
    /// it subscribed, each on a channel of its own; one that went away is forgotten.
    #[test]
    fn every_subscriber_is_told_of_a_change_of_the_bundle() {
        let endpoint = WebhookEndpoint::new(WebhookTarget::Url("https://127.0.0.1:8443".into()));
        let mut keeper = endpoint.bundle_changes();
        let reconciles = endpoint.bundle_changes();
        assert!(!keeper.has_changed().expect("open"), "nothing yet");
        endpoint.set_ca_bundle(pem(1));
        endpoint.set_ca_bundle(pem(1));
        assert!(keeper.has_changed().expect("open") && reconciles.has_changed().expect("open"));
        assert_eq!(
            *keeper.borrow_and_update(),
            1,
            "the same bundle again is no change"
        );
        drop(reconciles);
        endpoint.set_ca_bundle(pem(2));
        assert_eq!(*keeper.borrow_and_update(), 2);
        let late = endpoint.bundle_changes();
        assert!(!late.has_changed().expect("open"), "from the time it subscribed");
        assert_eq!(
            endpoint.bundle_changes.lock().expect("lock").1.len(),
            2,
            "the keeper and the late one: the dropped one forgotten"
        );
    }
}
