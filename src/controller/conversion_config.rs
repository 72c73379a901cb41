//! Keeping a CRD's `spec.conversion` pointed at the operator's conversion webhook, and its
//! `caBundle` ahead of the serving certificate when the CA rotates.

use std::sync::{Mutex, RwLock};

use k8s_openapi::ByteString;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::Error;
use super::webhook_crds::{PointedCrd, WebhookCrds};

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
    pub fn bundle_changes(&self) -> watch::Receiver<u64> {
        let mut changes = self.bundle_changes.lock().unwrap_or_else(|p| p.into_inner());
        // Those gone since the last change (a leadership term's keeper and reconciles).
        changes.1.retain(|subscriber| !subscriber.is_closed());
        let (subscriber, receiver) = watch::channel(changes.0);
        changes.1.push(subscriber);
        receiver
    }

    /// Every CRD the webhook serves whose `spec.conversion` points at it, by name (see
    /// `WebhookCrds`: no list of the CRDs, a GET of each that changed since it was read).
    pub async fn pointed_crds(&self, client: &kube::Client) -> Result<Vec<PointedCrd>, Error> {
        self.crds.pointed(client, |crd| self.pointed(crd)).await
    }

    /// Keeps a CRD as a write or a read answered it, so that the next pass need not read it
    /// again; returns it if it points at the webhook.
    pub async fn remember(&self, crd: &CustomResourceDefinition) -> Option<PointedCrd> {
        self.crds.remember(crd, |crd| self.pointed(crd)).await
    }

    /// The `caBundle` of every CRD the webhook serves whose `spec.conversion` points at it.
    pub async fn read_bundles(&self, client: &kube::Client) -> Result<CrdBundles, Error> {
        let bundles = self
            .pointed_crds(client)
            .await?
            .into_iter()
            .map(|crd| String::from_utf8_lossy(&crd.ca_bundle.unwrap_or_default()).into_owned())
            .collect();
        Ok(CrdBundles { bundles })
    }

    /// The CRD, if its `spec.conversion` points at this webhook.
    pub fn pointed(&self, crd: &CustomResourceDefinition) -> Option<PointedCrd> {
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
    pub fn is_ours(
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

/// The `caBundle` (PEM, empty when unset) of each CRD pointed at the webhook, as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrdBundles {
    pub bundles: Vec<String>,
}

impl CrdBundles {
    /// Whether every CRD pointed at the webhook trusts `ca` (PEM); true when none is.
    pub fn all_trust(&self, ca: &str) -> bool {
        self.bundles
            .iter()
            .all(|bundle| pem_blocks(bundle).iter().any(|block| same_ca(block, ca)))
    }

    /// How many of the CRDs trust `ca`, and how many there are.
    pub fn trusting(&self, ca: &str) -> (usize, usize) {
        let trusting = self
            .bundles
            .iter()
            .filter(|bundle| pem_blocks(bundle).iter().any(|block| same_ca(block, ca)))
            .count();
        (trusting, self.bundles.len())
    }

    /// The CAs (PEM) in their bundles, each once.
    pub fn cas(&self) -> Vec<String> {
        let mut cas: Vec<String> = Vec::new();
        for bundle in &self.bundles {
            for ca in pem_blocks(bundle) {
                if !cas.iter().any(|known| same_ca(known, &ca)) {
                    cas.push(ca);
                }
            }
        }
        cas
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
/// certificate it signed. Its bundle always holds the CA of the certificate served and of
/// the one waiting to be.
#[derive(Debug, Default)]
pub struct CaRotation {
    /// The CAs the bundle holds, oldest first.
    trusted: Vec<String>,
    serving: Option<CertificateSet>,
    pending: Option<CertificateSet>,
    /// Whether the CRDs were read at least once: only then is the bundle known (before, it
    /// might leave out a CA another replica serves).
    seeded: bool,
}

fn same_ca(a: &str, b: &str) -> bool {
    a.trim() == b.trim()
}

impl CaRotation {
    /// The CAs the CRDs pointed at the webhook trust now stay in the bundle until no replica
    /// needs them (see `prune`).
    pub fn learn(&mut self, crds: &CrdBundles) {
        for ca in crds.cas() {
            if !self.trusted.iter().any(|t| same_ca(t, &ca)) {
                self.trusted.push(ca);
            }
        }
        self.seeded = true;
    }

    /// A set was read (from files, or a Secret), and the CRDs with it. It is served at once
    /// when the CA in use signed it (a renewal) or when every CRD already trusts its CA (a
    /// first start, or the CA reached the CRDs); otherwise its CA is appended to the bundle
    /// and it waits (a restart mid-rotation must not serve a certificate the CRDs cannot
    /// verify yet).
    pub fn load(&mut self, set: CertificateSet, crds: &CrdBundles) -> Rotation {
        self.learn(crds);
        if !self.trusted.iter().any(|t| same_ca(t, &set.ca)) {
            self.trusted.push(set.ca.clone());
        }
        if self.serving.as_ref() == Some(&set) {
            self.pending = None;
            return Rotation::Unchanged;
        }
        let renewal = self.serving.as_ref().is_some_and(|s| same_ca(&s.ca, &set.ca));
        if renewal || crds.all_trust(&set.ca) {
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

    /// The set served, if any.
    pub fn serving(&self) -> Option<&CertificateSet> {
        self.serving.as_ref()
    }

    /// The fingerprint of the CA whose certificate this replica serves.
    pub fn serving_fingerprint(&self) -> Option<String> {
        self.serving
            .as_ref()
            .map(|s| super::rotation_record::fingerprint(&s.ca))
    }

    /// Whether the bundle holds the CA with this fingerprint.
    pub fn knows(&self, fingerprint: &str) -> bool {
        self.trusted
            .iter()
            .any(|ca| super::rotation_record::fingerprint(ca) == fingerprint)
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

    /// The `caBundle`: every trusted CA, oldest first; `None` until the CRDs were read.
    pub fn bundle(&self) -> Option<String> {
        self.seeded.then(|| {
            self.trusted
                .iter()
                .map(|ca| format!("{}\n", ca.trim_end()))
                .collect()
        })
    }
}

/// The PEM certificates of a bundle, each with its `-----END` line.
pub fn pem_blocks(bundle: &str) -> Vec<String> {
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
            ca: pem(ca),
        }
    }

    fn pem(ca: u8) -> String {
        format!("-----BEGIN CERTIFICATE-----\nCA{ca}\n-----END CERTIFICATE-----\n")
    }

    /// CRDs pointed at the webhook, each trusting the given CAs.
    fn crds(trusting: &[&[u8]]) -> CrdBundles {
        CrdBundles {
            bundles: trusting
                .iter()
                .map(|cas| cas.iter().map(|&ca| pem(ca)).collect())
                .collect(),
        }
    }

    #[test]
    fn a_new_ca_is_trusted_before_its_certificate_is_served() {
        use crate::controller::rotation_record::fingerprint;
        let mut rotation = CaRotation::default();
        assert_eq!(rotation.bundle(), None, "unknown before the CRDs were read");
        assert_eq!(rotation.load(set(1, 1), &crds(&[])), Rotation::Serve(set(1, 1)));
        assert_eq!(rotation.bundle().as_deref(), Some(pem(1).as_str()));
        let one = crds(&[&[1], &[1]]);
        assert_eq!(rotation.load(set(1, 1), &one), Rotation::Unchanged);
        // Renewed by the same CA: served at once.
        assert_eq!(rotation.load(set(2, 1), &one), Rotation::Serve(set(2, 1)));
        // A new CA: appended to the bundle, the certificate waits.
        assert_eq!(rotation.load(set(3, 2), &one), Rotation::Pending);
        assert_eq!(rotation.bundle(), Some(pem(1) + &pem(2)));
        assert_eq!(rotation.pending_ca(), Some(pem(2).as_str()));
        // One CRD of two trusts it: still waiting.
        assert_eq!(
            rotation.load(set(3, 2), &crds(&[&[1, 2], &[1]])),
            Rotation::Pending
        );
        assert_eq!(
            rotation.load(set(3, 2), &crds(&[&[1, 2], &[1, 2]])),
            Rotation::Serve(set(3, 2))
        );
        assert_eq!(rotation.pending_ca(), None);
        // The old CA stays while a replica serves a certificate it signed...
        rotation.prune(&[fingerprint(&pem(1)), fingerprint(&pem(2))]);
        assert_eq!(
            rotation.bundle(),
            Some(pem(1) + &pem(2)),
            "the old CA stays for slower replicas"
        );
        // ...and goes once none does.
        rotation.prune(&[fingerprint(&pem(2))]);
        assert_eq!(rotation.bundle(), Some(pem(2)));
        assert!(rotation.knows(&fingerprint(&pem(2))) && !rotation.knows(&fingerprint(&pem(1))));
    }

    /// A replica restarted mid-rotation: its memory is empty, the Secret already holds the
    /// new CA's set, and the CRDs trust only the old CA, which other replicas still serve.
    /// It must neither serve the new certificate at once nor drop the old CA.
    #[test]
    fn a_restart_mid_rotation_keeps_the_old_ca_and_waits_to_serve_the_new() {
        use crate::controller::rotation_record::fingerprint;
        let mut restarted = CaRotation::default();
        assert_eq!(restarted.load(set(3, 2), &crds(&[&[1]])), Rotation::Pending);
        assert_eq!(restarted.serving(), None, "nothing served");
        assert_eq!(
            restarted.bundle(),
            Some(pem(1) + &pem(2)),
            "the CRDs' CA is kept, the new one appended"
        );
        // Another replica still serves CA-1's certificate.
        restarted.prune(&[fingerprint(&pem(1))]);
        assert_eq!(restarted.bundle(), Some(pem(1) + &pem(2)));
        // Once every CRD trusts CA-2, it serves it.
        assert_eq!(
            restarted.load(set(3, 2), &crds(&[&[1, 2]])),
            Rotation::Serve(set(3, 2))
        );
        assert_eq!(restarted.pending_ca(), None);
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

    #[test]
    fn bundles_count_the_crds_that_trust_a_ca() {
        let read = crds(&[&[1, 2], &[2], &[]]);
        assert_eq!(read.trusting(&pem(2)), (2, 3));
        assert!(!read.all_trust(&pem(2)), "the third trusts nothing");
        assert_eq!(read.cas(), [pem(1), pem(2)]);
        assert!(crds(&[]).all_trust(&pem(9)), "no CRD to trust it");
    }
}
