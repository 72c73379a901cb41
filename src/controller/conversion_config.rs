//! Keeping a CRD's `spec.conversion` pointed at the operator's conversion webhook, and its
//! `caBundle` ahead of the serving certificate when the CA rotates.

use std::sync::{Mutex, RwLock};

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use serde_json::{Value, json};
use tokio::sync::watch;

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

/// The webhook endpoint and the CA bundle the CRDs must trust.
pub struct WebhookEndpoint {
    pub target: WebhookTarget,
    /// The CA certificates (PEM), once known.
    pub ca_bundle: RwLock<Option<String>>,
    /// Bumped whenever the bundle changes, so that every policy is reconciled at once.
    bundle_changes: watch::Sender<u64>,
}

impl WebhookEndpoint {
    pub fn new(target: WebhookTarget) -> Self {
        Self {
            target,
            ca_bundle: RwLock::new(None),
            bundle_changes: watch::Sender::new(0),
        }
    }

    /// Sets the CAs the CRDs must trust (PEM, one or more certificates).
    pub fn set_ca_bundle(&self, pem: String) {
        let mut bundle = self.ca_bundle.write().unwrap_or_else(|p| p.into_inner());
        if bundle.as_deref() != Some(pem.as_str()) {
            *bundle = Some(pem);
            self.bundle_changes.send_modify(|n| *n += 1);
        }
    }

    /// A change of the bundle (for `Controller::reconcile_all_on`).
    pub fn bundle_changes(&self) -> watch::Receiver<u64> {
        self.bundle_changes.subscribe()
    }

    /// Whether every CRD whose `spec.conversion` points at this webhook trusts `ca` (PEM) in
    /// its `caBundle`: only then may the serving certificate switch to one `ca` signed.
    pub async fn crds_trust(&self, client: &kube::Client, ca: &str) -> Result<bool, kube::Error> {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let list = crds.list(&Default::default()).await?;
        Ok(list.items.iter().all(|crd| {
            let Some(config) = crd
                .spec
                .conversion
                .as_ref()
                .and_then(|c| c.webhook.as_ref())
                .and_then(|w| w.client_config.as_ref())
            else {
                return true;
            };
            let ours = match &self.target {
                WebhookTarget::Service { namespace, name, .. } => config
                    .service
                    .as_ref()
                    .is_some_and(|s| s.namespace == *namespace && s.name == *name),
                WebhookTarget::Url(base) => config
                    .url
                    .as_deref()
                    .is_some_and(|u| u.starts_with(base.trim_end_matches('/'))),
            };
            !ours
                || config
                    .ca_bundle
                    .as_ref()
                    .is_some_and(|bundle| String::from_utf8_lossy(&bundle.0).contains(ca.trim()))
        }))
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

/// A certificate, its key and the CA that signed it (PEM), as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateSet {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

/// What to do after a certificate set was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rotation {
    /// Serve this set now.
    Serve(CertificateSet),
    /// Its CA is new: it is appended to the bundle, and the set is served once every CRD
    /// trusts it.
    Pending,
    /// Nothing changed.
    Unchanged,
}

/// The CAs the CRDs must trust and the certificate served, across CA rotations: a new CA
/// reaches `caBundle`, appended to the one in use, before the serving certificate it signed
/// is used (otherwise the apiserver would refuse the webhook until every CRD is updated).
#[derive(Debug, Default)]
pub struct CaRotation {
    /// The last two CAs seen, oldest first.
    trusted: Vec<String>,
    serving: Option<CertificateSet>,
    pending: Option<CertificateSet>,
}

impl CaRotation {
    /// A set was read (from files, or a Secret).
    pub fn load(&mut self, set: CertificateSet) -> Rotation {
        let known = self.trusted.iter().any(|ca| ca.trim() == set.ca.trim());
        // At once: the first set, or one the CA in use signed (a renewal). Any other CA,
        // even one already in the bundle, waits until every CRD is seen to trust it.
        if self.serving.as_ref().is_none_or(|s| s.ca.trim() == set.ca.trim()) {
            if !known {
                self.trusted = vec![set.ca.clone()];
            }
            if self.serving.as_ref() == Some(&set) {
                return Rotation::Unchanged;
            }
            self.pending = None;
            self.serving = Some(set.clone());
            return Rotation::Serve(set);
        }
        if !known {
            self.trusted.push(set.ca.clone());
            if self.trusted.len() > 2 {
                self.trusted.remove(0);
            }
        }
        self.pending = Some(set);
        Rotation::Pending
    }

    /// The CA a pending set waits to be trusted for.
    pub fn pending_ca(&self) -> Option<&str> {
        self.pending.as_ref().map(|p| p.ca.as_str())
    }

    /// Every CRD trusts the pending CA: serve its set. The previous CA stays in the bundle,
    /// for replicas that switch a little later.
    pub fn promote(&mut self) -> Option<CertificateSet> {
        let set = self.pending.take()?;
        self.serving = Some(set.clone());
        Some(set)
    }

    /// The `caBundle`: every trusted CA, oldest first.
    pub fn bundle(&self) -> String {
        self.trusted
            .iter()
            .map(|ca| format!("{}\n", ca.trim_end()))
            .collect()
    }
}

/// Reads a certificate set, and serves it or waits until the CRDs trust its CA. `serve`
/// installs a set in the TLS server.
pub async fn refresh(
    set: CertificateSet,
    rotation: &Mutex<CaRotation>,
    endpoint: &WebhookEndpoint,
    client: &kube::Client,
    serve: impl Fn(&CertificateSet) -> Result<(), String>,
) -> Result<Rotation, String> {
    let outcome = crate::sync::lock(rotation).load(set);
    let bundle = crate::sync::lock(rotation).bundle();
    endpoint.set_ca_bundle(bundle);
    if let Rotation::Serve(set) = &outcome {
        serve(set)?;
        return Ok(outcome);
    }
    let pending = crate::sync::lock(rotation).pending_ca().map(str::to_owned);
    let Some(ca) = pending else {
        return Ok(outcome);
    };
    if endpoint
        .crds_trust(client, &ca)
        .await
        .map_err(|e| e.to_string())?
    {
        let promoted = crate::sync::lock(rotation).promote();
        if let Some(set) = promoted {
            serve(&set)?;
            tracing::info!("every CRD trusts the new CA: serving the certificate it signed");
            return Ok(Rotation::Serve(set));
        }
    }
    tracing::info!("a new CA is in caBundle; the certificate it signed is served once every CRD trusts it");
    Ok(Rotation::Pending)
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

    fn set(n: u8, ca: u8) -> CertificateSet {
        CertificateSet {
            cert: format!("cert-{n}"),
            key: format!("key-{n}"),
            ca: format!("CA-{ca}"),
        }
    }

    #[test]
    fn a_new_ca_is_trusted_before_its_certificate_is_served() {
        let mut rotation = CaRotation::default();
        assert_eq!(rotation.load(set(1, 1)), Rotation::Serve(set(1, 1)));
        assert_eq!(rotation.bundle(), "CA-1\n");
        assert_eq!(rotation.load(set(1, 1)), Rotation::Unchanged);
        // Renewed by the same CA: served at once.
        assert_eq!(rotation.load(set(2, 1)), Rotation::Serve(set(2, 1)));
        // A new CA: appended to the bundle, the certificate waits.
        assert_eq!(rotation.load(set(3, 2)), Rotation::Pending);
        assert_eq!(rotation.bundle(), "CA-1\nCA-2\n");
        assert_eq!(rotation.pending_ca(), Some("CA-2"));
        assert_eq!(rotation.load(set(3, 2)), Rotation::Pending, "still waiting");
        assert_eq!(rotation.promote(), Some(set(3, 2)));
        assert_eq!(
            rotation.bundle(),
            "CA-1\nCA-2\n",
            "the old CA stays for slower replicas"
        );
        // The next rotation drops the oldest.
        assert_eq!(rotation.load(set(4, 3)), Rotation::Pending);
        assert_eq!(rotation.bundle(), "CA-2\nCA-3\n");
    }
}
