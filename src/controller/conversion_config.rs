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
        Ok(self
            .our_bundles(client)
            .await?
            .iter()
            .all(|bundle| bundle.contains(ca.trim())))
    }

    /// The CAs (PEM) in the `caBundle` of the CRDs pointed at this webhook, each once.
    pub async fn crd_cas(&self, client: &kube::Client) -> Result<Vec<String>, kube::Error> {
        let mut cas: Vec<String> = Vec::new();
        for bundle in self.our_bundles(client).await? {
            for ca in pem_blocks(&bundle) {
                if !cas.iter().any(|known| same_ca(known, &ca)) {
                    cas.push(ca);
                }
            }
        }
        Ok(cas)
    }

    /// The `caBundle` (PEM, empty when unset) of every CRD pointed at this webhook.
    async fn our_bundles(&self, client: &kube::Client) -> Result<Vec<String>, kube::Error> {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let list = crds.list(&Default::default()).await?;
        Ok(list
            .items
            .iter()
            .filter_map(|crd| {
                crd.spec
                    .conversion
                    .as_ref()
                    .and_then(|c| c.webhook.as_ref())
                    .and_then(|w| w.client_config.as_ref())
                    .filter(|config| self.is_ours(config))
            })
            .map(|config| {
                config
                    .ca_bundle
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                    .unwrap_or_default()
            })
            .collect())
    }

    /// Whether a CRD's webhook client config points at this webhook.
    fn is_ours(
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
/// reaches `caBundle`, appended to the ones in use, before the serving certificate it signed
/// is used (otherwise the apiserver would refuse the webhook until every CRD is updated). It
/// starts from what the CRDs trust (shared by every replica and kept across restarts, unlike
/// this process's memory), and a CA leaves the bundle only once no live replica serves a
/// certificate it signed.
#[derive(Debug, Default)]
pub struct CaRotation {
    /// The CAs the bundle holds, oldest first.
    trusted: Vec<String>,
    serving: Option<CertificateSet>,
    pending: Option<CertificateSet>,
}

fn same_ca(a: &str, b: &str) -> bool {
    a.trim() == b.trim()
}

impl CaRotation {
    /// A set was read (from files, or a Secret). `crd_cas` are the CAs the CRDs pointed at
    /// this webhook trust now; `trusted_by_every_crd` whether each of them trusts the set's
    /// CA.
    pub fn load(&mut self, set: CertificateSet, crd_cas: &[String], trusted_by_every_crd: bool) -> Rotation {
        // What the CRDs trust stays trusted until no replica needs it (see `prune`).
        for ca in crd_cas {
            if !self.trusted.iter().any(|t| same_ca(t, ca)) {
                self.trusted.push(ca.clone());
            }
        }
        if !self.trusted.iter().any(|t| same_ca(t, &set.ca)) {
            self.trusted.push(set.ca.clone());
        }
        // At once: one the CA in use signed (a renewal), or, first in this process, one
        // every CRD already trusts (a restart mid-rotation must not serve a certificate the
        // CRDs cannot verify yet). Any other waits until every CRD trusts its CA.
        let renewal = self.serving.as_ref().is_some_and(|s| same_ca(&s.ca, &set.ca));
        if renewal || (self.serving.is_none() && trusted_by_every_crd) {
            if self.serving.as_ref() == Some(&set) {
                return Rotation::Unchanged;
            }
            self.pending = None;
            self.serving = Some(set.clone());
            return Rotation::Serve(set);
        }
        self.pending = Some(set);
        Rotation::Pending
    }

    /// The CA a pending set waits to be trusted for.
    pub fn pending_ca(&self) -> Option<&str> {
        self.pending.as_ref().map(|p| p.ca.as_str())
    }

    /// Every CRD trusts the pending CA: serve its set. The previous CA stays in the bundle
    /// while replicas still serve certificates it signed.
    pub fn promote(&mut self) -> Option<CertificateSet> {
        let set = self.pending.take()?;
        self.serving = Some(set.clone());
        Some(set)
    }

    /// The fingerprint of the CA whose certificate this replica serves.
    pub fn serving_fingerprint(&self) -> Option<String> {
        self.serving
            .as_ref()
            .map(|s| super::rotation_record::fingerprint(&s.ca))
    }

    /// Drops every CA that no live replica serves a certificate of (`live`: their
    /// fingerprints), except the one this replica serves and the one it waits to serve.
    pub fn prune(&mut self, live: &[String]) {
        let keep = |ca: &String| {
            live.contains(&super::rotation_record::fingerprint(ca))
                || self.serving.as_ref().is_some_and(|s| same_ca(&s.ca, ca))
                || self.pending.as_ref().is_some_and(|p| same_ca(&p.ca, ca))
        };
        let kept: Vec<String> = self.trusted.iter().filter(|ca| keep(ca)).cloned().collect();
        self.trusted = kept;
    }

    /// The `caBundle`: every trusted CA, oldest first.
    pub fn bundle(&self) -> String {
        self.trusted
            .iter()
            .map(|ca| format!("{}\n", ca.trim_end()))
            .collect()
    }
}

/// The PEM certificates of a bundle.
fn pem_blocks(bundle: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current = String::new();
    for line in bundle.lines() {
        current.push_str(line);
        current.push('\n');
        if line.starts_with("-----END ") {
            blocks.push(std::mem::take(&mut current));
        }
    }
    blocks
}

/// Reads a certificate set, and serves it or waits until the CRDs trust its CA; records
/// what this replica serves in `record` and keeps in the bundle exactly the CAs that the
/// set, a pending set or a live replica needs. `serve` installs a set in the TLS server.
pub async fn refresh(
    set: CertificateSet,
    rotation: &Mutex<CaRotation>,
    endpoint: &WebhookEndpoint,
    client: &kube::Client,
    record: Option<&super::rotation_record::RotationRecord>,
    serve: impl Fn(&CertificateSet) -> Result<(), String>,
) -> Result<Rotation, String> {
    let crd_cas = endpoint.crd_cas(client).await.map_err(|e| e.to_string())?;
    let trusted = endpoint
        .crds_trust(client, &set.ca)
        .await
        .map_err(|e| e.to_string())?;
    let mut outcome = crate::sync::lock(rotation).load(set, &crd_cas, trusted);
    match &outcome {
        Rotation::Serve(set) => serve(set)?,
        Rotation::Pending => {
            let pending = crate::sync::lock(rotation).pending_ca().map(str::to_owned);
            if let Some(ca) = pending
                && endpoint
                    .crds_trust(client, &ca)
                    .await
                    .map_err(|e| e.to_string())?
                && let Some(set) = crate::sync::lock(rotation).promote()
            {
                serve(&set)?;
                tracing::info!("every CRD trusts the new CA: serving the certificate it signed");
                outcome = Rotation::Serve(set);
            } else {
                tracing::info!(
                    "a new CA is in caBundle; the certificate it signed is served once every CRD trusts it"
                );
            }
        }
        Rotation::Unchanged => {}
    }
    if let Some(record) = record {
        let serving = crate::sync::lock(rotation).serving_fingerprint();
        let live = record
            .publish(client, serving.as_deref(), jiff::Timestamp::now())
            .await?;
        crate::sync::lock(rotation).prune(&live);
    }
    let bundle = crate::sync::lock(rotation).bundle();
    endpoint.set_ca_bundle(bundle);
    Ok(outcome)
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
        use crate::controller::rotation_record::fingerprint;
        let mut rotation = CaRotation::default();
        assert_eq!(rotation.load(set(1, 1), &[], true), Rotation::Serve(set(1, 1)));
        assert_eq!(rotation.bundle(), "CA-1\n");
        let one = ["CA-1".to_owned()];
        assert_eq!(rotation.load(set(1, 1), &one, true), Rotation::Unchanged);
        // Renewed by the same CA: served at once.
        assert_eq!(rotation.load(set(2, 1), &one, true), Rotation::Serve(set(2, 1)));
        // A new CA: appended to the bundle, the certificate waits.
        assert_eq!(rotation.load(set(3, 2), &one, false), Rotation::Pending);
        assert_eq!(rotation.bundle(), "CA-1\nCA-2\n");
        assert_eq!(rotation.pending_ca(), Some("CA-2"));
        assert_eq!(
            rotation.load(set(3, 2), &one, false),
            Rotation::Pending,
            "still waiting"
        );
        assert_eq!(rotation.promote(), Some(set(3, 2)));
        // The old CA stays while a replica serves a certificate it signed...
        rotation.prune(&[fingerprint("CA-1"), fingerprint("CA-2")]);
        assert_eq!(
            rotation.bundle(),
            "CA-1\nCA-2\n",
            "the old CA stays for slower replicas"
        );
        // ...and goes once none does.
        rotation.prune(&[fingerprint("CA-2")]);
        assert_eq!(rotation.bundle(), "CA-2\n");
    }

    /// A replica restarted mid-rotation: its memory is empty, the Secret already holds the
    /// new CA's set, and the CRDs trust only the old CA, which other replicas still serve.
    /// It must neither serve the new certificate at once nor drop the old CA.
    #[test]
    fn a_restart_mid_rotation_keeps_the_old_ca_and_waits_to_serve_the_new() {
        use crate::controller::rotation_record::fingerprint;
        let mut restarted = CaRotation::default();
        let crds_trust = ["CA-1".to_owned()];
        assert_eq!(restarted.load(set(3, 2), &crds_trust, false), Rotation::Pending);
        assert_eq!(
            restarted.bundle(),
            "CA-1\nCA-2\n",
            "the CRDs' CA is kept, the new one appended"
        );
        // Another replica still serves CA-1's certificate.
        restarted.prune(&[fingerprint("CA-1")]);
        assert_eq!(restarted.bundle(), "CA-1\nCA-2\n");
        // Once every CRD trusts CA-2, it serves it.
        let both = ["CA-1".to_owned(), "CA-2".to_owned()];
        assert_eq!(restarted.load(set(3, 2), &both, true), Rotation::Serve(set(3, 2)));
        assert_eq!(restarted.pending_ca(), None);
    }
}
