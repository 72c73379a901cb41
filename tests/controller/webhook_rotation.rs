//! The webhook's certificate refresher against the fake apiserver: the CRDs are read once
//! at most per pass (and only to learn something), a new CA reaches every CRD before the
//! certificate it signed is served, also while the rotation record cannot be written, a
//! failing start is retried rather than fatal, and a replica is Ready only while it serves
//! a certificate every CRD trusts.

use std::sync::Arc;

use crd_lifecycle::controller::rotation_record::{RotationRecord, SINCE_ANNOTATION};
use crd_lifecycle::controller::{
    CertificateRefresher, CertificateSource, WebhookEndpoint, WebhookSettings, WebhookTarget,
};
use crd_lifecycle::webhook::{CertStore, Readiness, WebhookMetrics, certs};

use crate::Harness;
use crate::webhook::crd_conversion::harness;

const CRD: &str = "gadgets.example.com";
const NAMESPACE: &str = "crd-lifecycle";
const SECRET: &str = "crd-lifecycle-webhook-tls";
const CRD_LIST: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

fn target() -> WebhookTarget {
    WebhookTarget::parse_service("crd-lifecycle/crd-lifecycle-webhook").expect("service")
}

/// One replica's webhook: what its refresher updates.
struct Replica {
    refresher: CertificateRefresher,
    endpoint: Arc<WebhookEndpoint>,
    certs: Arc<CertStore>,
    readiness: Arc<Readiness>,
}

impl Replica {
    fn new(h: &Harness, certificates: CertificateSource, name: &str) -> Replica {
        let settings = WebhookSettings {
            address: ([127, 0, 0, 1], 0).into(),
            target: target(),
            certificates,
            limits: Default::default(),
            record: Some(RotationRecord {
                namespace: NAMESPACE.into(),
                secret: SECRET.into(),
                replica: name.into(),
                ttl: std::time::Duration::from_secs(180),
            }),
            connections: Default::default(),
        };
        let endpoint = Arc::new(WebhookEndpoint::new(target()));
        let certs = Arc::new(CertStore::default());
        let readiness = Arc::new(Readiness::default());
        readiness.policies_loaded();
        let refresher = CertificateRefresher::new(
            h.ctx.client.clone(),
            &settings,
            endpoint.clone(),
            certs.clone(),
            readiness.clone(),
            Arc::new(WebhookMetrics::default()),
        );
        Replica {
            refresher,
            endpoint,
            certs,
            readiness,
        }
    }

    /// One refresh; how many times it listed the CRDs.
    async fn refresh(&mut self, h: &Harness) -> usize {
        let before = crd_lists(h);
        self.refresher.refresh().await;
        crd_lists(h) - before
    }

    fn ready(&self) -> Result<(), String> {
        self.readiness.check()
    }

    /// The CAs of the bundle this replica would write to the CRDs (leader or not).
    fn bundle(&self) -> String {
        let desired = self.endpoint.desired_conversion("gadgets").expect("a bundle");
        decode(&desired["webhook"]["clientConfig"]["caBundle"])
    }
}

fn crd_lists(h: &Harness) -> usize {
    h.fake
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == CRD_LIST)
        .count()
}

fn decode(encoded: &serde_json::Value) -> String {
    let bytes: k8s_openapi::ByteString = serde_json::from_value(encoded.clone()).expect("base64");
    String::from_utf8(bytes.0).expect("PEM")
}

/// The CRD's `caBundle` as the apiserver holds it.
fn crd_bundle(h: &Harness) -> String {
    decode(&h.fake.crd(CRD)["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"])
}

/// A CA and a serving certificate it signed.
fn new_ca() -> certs::Bundle {
    certs::new_bundle(&target().certificate_names(), jiff::Timestamp::now()).expect("certificates")
}

/// Certificate files, as cert-manager's Secret mounted in the pod.
struct Files(std::path::PathBuf);

impl Files {
    fn new(test: &str) -> Files {
        let dir = std::env::temp_dir().join(format!("crd-lifecycle-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary directory");
        Files(dir)
    }

    fn write(&self, bundle: &certs::Bundle) {
        for (name, pem) in [
            ("tls.crt", &bundle.cert_pem),
            ("tls.key", &bundle.key_pem),
            ("ca.crt", &bundle.ca_pem),
        ] {
            std::fs::write(self.0.join(name), pem).expect("written");
        }
    }

    fn source(&self) -> CertificateSource {
        let path = |name: &str| self.0.join(name).to_string_lossy().into_owned();
        CertificateSource::Files {
            cert: path("tls.crt"),
            key: path("tls.key"),
            ca: path("ca.crt"),
        }
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn secret() -> CertificateSource {
    CertificateSource::Secret {
        namespace: NAMESPACE.into(),
        name: SECRET.into(),
    }
}

/// The rotation record on the Secret has been kept for longer than its time to live: it
/// names every live replica, so CAs none of them serves may leave the bundle.
fn record_kept_for_a_ttl(h: &Harness) {
    let mut state = h.fake.lock();
    let secret = state.secrets.get_mut(SECRET).expect("the record's Secret");
    secret["metadata"]["annotations"][SINCE_ANNOTATION] = "2000-01-01T00:00:00Z".into();
}

/// The leader: its reconcile writes its bundle to the CRD.
async fn lead(h: &mut Harness, replica: &Replica) {
    h.serve_webhook(replica.endpoint.clone());
    h.at("2026-01-20T00:00:00Z");
    h.reconcile("gadgets").await;
}

/// One replica (the leader) with certificates from files, serving CA1's certificate; the
/// CRD trusts CA1, the record is a TTL old, and CA2 waits to be rotated to.
struct Rotating {
    h: Harness,
    files: Files,
    ca1: certs::Bundle,
    ca2: certs::Bundle,
    a: Replica,
    /// CRD lists of the replica's first refresh.
    first_lists: usize,
}

async fn rotating(test: &str) -> Rotating {
    let mut h = harness();
    let files = Files::new(test);
    let (ca1, ca2) = (new_ca(), new_ca());
    files.write(&ca1);
    let mut a = Replica::new(&h, files.source(), "replica-a");
    let first_lists = a.refresh(&h).await;
    record_kept_for_a_ttl(&h);
    lead(&mut h, &a).await;
    Rotating {
        h,
        files,
        ca1,
        ca2,
        a,
        first_lists,
    }
}

#[tokio::test]
async fn a_refresh_lists_the_crds_at_most_once_and_only_to_learn_something() {
    let Rotating {
        mut h,
        files,
        ca1,
        ca2,
        mut a,
        first_lists,
    } = rotating("rotation-lists").await;
    assert_eq!(first_lists, 1, "a first start reads the CRDs once");
    assert!(a.certs.serves(&ca1.cert_pem));
    assert_eq!(a.ready(), Ok(()));
    assert_eq!(crd_bundle(&h), ca1.ca_pem);
    for _ in 0..3 {
        assert_eq!(a.refresh(&h).await, 0, "nothing changed: nothing to read");
    }

    // cert-manager rotates the CA: one list; the new certificate waits, its CA appended.
    files.write(&ca2);
    assert_eq!(a.refresh(&h).await, 1);
    assert!(a.certs.serves(&ca1.cert_pem), "still the old certificate");
    assert_eq!(a.ready(), Ok(()), "serving a certificate the CRDs trust");
    assert_eq!(a.bundle(), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    // While it waits: one list per pass.
    assert_eq!(a.refresh(&h).await, 1);
    lead(&mut h, &a).await;
    assert_eq!(crd_bundle(&h), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    assert_eq!(a.refresh(&h).await, 1, "the CRDs trust the new CA");
    assert!(a.certs.serves(&ca2.cert_pem));
    // No replica serves the old CA any more: it leaves the bundle.
    assert_eq!(a.bundle(), ca2.ca_pem);
    lead(&mut h, &a).await;
    assert_eq!(crd_bundle(&h), ca2.ca_pem);
    assert_eq!(a.refresh(&h).await, 0, "settled");
}

#[tokio::test]
async fn a_new_ca_reaches_the_crds_while_the_rotation_record_cannot_be_written() {
    let Rotating {
        mut h,
        files,
        ca1,
        ca2,
        mut a,
        ..
    } = rotating("rotation-record-fails").await;
    // RBAC on the Secret breaks (403 on every update), then the CA rotates.
    h.fake.lock().secrets_forbidden.insert("PUT".into(), usize::MAX);
    files.write(&ca2);
    a.refresh(&h).await;
    assert_eq!(
        a.bundle(),
        format!("{}{}", ca1.ca_pem, ca2.ca_pem),
        "the new CA is in the bundle although the record was not written"
    );
    lead(&mut h, &a).await;
    assert_eq!(crd_bundle(&h), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    a.refresh(&h).await;
    assert!(a.certs.serves(&ca2.cert_pem), "the CRDs trust it: served");
    assert_eq!(a.ready(), Ok(()));
    // Without a record nothing is known of the other replicas: no CA leaves the bundle.
    a.refresh(&h).await;
    assert_eq!(a.bundle(), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    // Writable again: the record is written at the next pass, and the old CA goes.
    h.fake.lock().secrets_forbidden.clear();
    a.refresh(&h).await;
    assert_eq!(a.bundle(), ca2.ca_pem);
}

#[tokio::test(start_paused = true)]
async fn a_failing_start_is_retried_with_backoff_and_not_ready_until_it_succeeds() {
    let h = harness();
    // The Role on the Secret is not there yet: its first six reads are refused (a pass
    // reads it once for the certificate and once for the record).
    h.fake.lock().secrets_forbidden.insert("GET".into(), 6);
    let a = Replica::new(&h, secret(), "replica-a");
    let (readiness, certs) = (a.readiness.clone(), a.certs.clone());
    let started = tokio::time::Instant::now();
    let refresher = tokio::spawn(a.refresher.run());
    let refused = || h.fake.lock().secrets_forbidden.get("GET").copied();
    while refused() != Some(0) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let why = readiness.check().expect_err("not ready while it fails");
        assert!(
            why.starts_with(
                "no serving certificate: cannot read or write Secret crd-lifecycle/crd-lifecycle-webhook-tls"
            ) && why.contains("forbidden"),
            "{why}"
        );
        assert!(!refresher.is_finished(), "it keeps trying");
    }
    while readiness.check().is_err() {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!refresher.is_finished());
    }
    assert!(certs.is_ready());
    // At least three failed passes, 1 s, 2 s and 4 s apart at least: a backoff, no spin.
    let waited = started.elapsed();
    assert!(waited >= std::time::Duration::from_secs(7), "{waited:?}");
    refresher.abort();
}

/// The Secret's CA changed (someone deleted the Secret and a replica made a new one) and a
/// replica restarts: it has no certificate the CRDs trust, so it is not Ready until the
/// leader has the new CA in every CRD and it serves the new certificate.
#[tokio::test(start_paused = true)]
async fn a_replica_restarted_mid_rotation_is_not_ready_until_it_serves_a_trusted_certificate() {
    let mut h = harness();
    let mut a = Replica::new(&h, secret(), "replica-a");
    a.refresh(&h).await;
    assert_eq!(a.ready(), Ok(()));
    lead(&mut h, &a).await;
    let old = crd_bundle(&h);
    h.fake.lock().secrets.remove(SECRET);
    let client = h.fake.client();
    let new = certs::ensure_secret(&client, NAMESPACE, SECRET, &target().certificate_names())
        .await
        .expect("a new Secret");
    assert_ne!(new.ca_pem, old);

    let mut b = Replica::new(&h, secret(), "replica-b");
    b.refresh(&h).await;
    assert!(!b.certs.is_ready(), "no certificate served");
    let why = b.ready().expect_err("not ready");
    assert!(
        why.contains("waiting until every CRD pointed at the webhook trusts it (0 of 1 do)"),
        "{why}"
    );
    assert_eq!(
        b.bundle(),
        format!("{old}{}", new.ca_pem),
        "the old CA kept, the new appended"
    );
    // The leader reads the Secret too, and writes both CAs to the CRD.
    a.refresh(&h).await;
    assert_eq!(a.ready(), Ok(()), "the leader still serves the old certificate");
    lead(&mut h, &a).await;
    b.refresh(&h).await;
    assert!(b.certs.serves(&new.cert_pem));
    assert_eq!(b.ready(), Ok(()));
    // The old CA stays while the leader serves a certificate it signed.
    assert!(b.bundle().contains(old.trim()));
    a.refresh(&h).await;
    assert!(a.certs.serves(&new.cert_pem));
    assert!(
        a.bundle().contains(old.trim()),
        "the record went with the Secret: until it is a TTL old it may miss a replica"
    );
    // A TTL later: the record names every live replica again, and A writes its entry.
    record_kept_for_a_ttl(&h);
    tokio::time::advance(std::time::Duration::from_secs(61)).await;
    a.refresh(&h).await;
    assert_eq!(a.bundle(), new.ca_pem, "no replica serves the old CA any more");
    lead(&mut h, &a).await;
    assert_eq!(crd_bundle(&h), new.ca_pem);
}

/// Two replicas share the rotation through the CRDs' caBundle and the Secret's record: the
/// leader (A) keeps the CA another replica (B) still serves, and B, restarted with the new
/// files before the leader saw them, neither serves the new certificate early nor loses the
/// old CA that A serves.
#[tokio::test]
async fn a_replica_restarted_mid_rotation_never_breaks_the_other() {
    let mut h = harness();
    let (files_a, files_b) = (Files::new("rotation-a"), Files::new("rotation-b"));
    let (ca1, ca2) = (new_ca(), new_ca());
    files_a.write(&ca1);
    files_b.write(&ca1);
    let mut a = Replica::new(&h, files_a.source(), "replica-a");
    let mut b = Replica::new(&h, files_b.source(), "replica-b");
    a.refresh(&h).await;
    b.refresh(&h).await;
    record_kept_for_a_ttl(&h);
    lead(&mut h, &a).await;
    assert_eq!(crd_bundle(&h), ca1.ca_pem);

    // The kubelet updates B's files first, and B restarts.
    files_b.write(&ca2);
    let mut b = Replica::new(&h, files_b.source(), "replica-b");
    b.refresh(&h).await;
    assert!(!b.certs.is_ready(), "B does not serve CA2's certificate yet");
    assert!(b.ready().is_err());
    assert_eq!(b.bundle(), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    // A, the leader, sees the new files too: both CAs reach the CRD, CA1 kept for A.
    files_a.write(&ca2);
    a.refresh(&h).await;
    assert!(a.certs.serves(&ca1.cert_pem));
    lead(&mut h, &a).await;
    assert_eq!(crd_bundle(&h), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    // B serves CA2 now, and keeps CA1 while A serves it (were B the leader).
    b.refresh(&h).await;
    assert!(b.certs.serves(&ca2.cert_pem));
    assert_eq!(b.ready(), Ok(()));
    assert_eq!(b.bundle(), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    // A switches too; no replica serves CA1 any more and it leaves the CRD.
    a.refresh(&h).await;
    assert!(a.certs.serves(&ca2.cert_pem));
    lead(&mut h, &a).await;
    assert_eq!(crd_bundle(&h), ca2.ca_pem);
}

#[tokio::test]
async fn readyz_reports_the_webhook_when_the_replica_serves_it() {
    use crd_lifecycle::controller::http::{Health, router};
    use std::sync::atomic::Ordering;
    use tower::ServiceExt;
    let webhook = Arc::new(Readiness::default());
    let health = Arc::new(Health {
        webhook: Some(webhook.clone()),
        ..Health::default()
    });
    health.ready.store(true, Ordering::Relaxed);
    let h = Harness::new();
    let readyz = || async {
        let response = router(h.ctx.metrics.clone(), health.clone())
            .oneshot(
                http::Request::get("/readyz")
                    .body(axum::body::Body::empty())
                    .expect("request"),
            )
            .await
            .expect("answered");
        let code = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        (code, String::from_utf8_lossy(&body).into_owned())
    };
    assert_eq!(
        readyz().await,
        (
            503,
            "not ok: the conversion webhook is not ready: no serving certificate yet\n".to_owned()
        )
    );
    webhook.policies_loaded();
    webhook.certificate_served();
    assert_eq!(readyz().await, (200, "ok\n".to_owned()));
    webhook.begin_drain();
    assert_eq!(readyz().await.0, 503);
}

/// A CRD pointed at the webhook whose policy reconciles nothing (here suspended) still gets
/// the new CA: the leader's keeper writes `caBundle` alone, and the rotation completes.
#[tokio::test]
async fn a_crd_whose_policy_is_suspended_still_gets_the_new_ca() {
    let Rotating {
        mut h,
        files,
        ca1,
        ca2,
        mut a,
        ..
    } = rotating("rotation-suspended").await;
    h.edit_policy("gadgets", |p| p["spec"]["suspend"] = true.into());
    files.write(&ca2);
    a.refresh(&h).await;
    assert_eq!(a.bundle(), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    lead(&mut h, &a).await;
    assert_eq!(crd_bundle(&h), ca1.ca_pem, "a suspended policy changes nothing");
    a.refresh(&h).await;
    assert!(a.certs.serves(&ca1.cert_pem), "the CRD does not trust CA2 yet");

    // A write refused otherwise than by a race is said, and tried again at the next pass.
    h.fake.fail_next_crd_patch(500, "etcdserver: request timed out");
    let refused = crd_lifecycle::controller::ca_bundles::sync_ca_bundles(&h.ctx.client, &a.endpoint)
        .await
        .expect("listed");
    assert!(refused.written.is_empty());
    assert_eq!(refused.failed.len(), 1, "{:?}", refused.failed);
    assert!(
        refused.failed[0].1.contains("request timed out"),
        "{:?}",
        refused.failed
    );
    let synced = crd_lifecycle::controller::ca_bundles::sync_ca_bundles(&h.ctx.client, &a.endpoint)
        .await
        .expect("synced");
    assert_eq!(synced.written, [CRD]);
    assert!(synced.failed.is_empty(), "{:?}", synced.failed);
    assert_eq!(crd_bundle(&h), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    a.refresh(&h).await;
    assert!(a.certs.serves(&ca2.cert_pem), "trusted: served");
    // Once the old CA leaves the bundle, it leaves the CRD too; then nothing to write.
    a.refresh(&h).await;
    crd_lifecycle::controller::ca_bundles::sync_ca_bundles(&h.ctx.client, &a.endpoint)
        .await
        .expect("synced");
    assert_eq!(crd_bundle(&h), ca2.ca_pem);
    let again = crd_lifecycle::controller::ca_bundles::sync_ca_bundles(&h.ctx.client, &a.endpoint)
        .await
        .expect("synced");
    assert!(again.written.is_empty() && again.failed.is_empty(), "{again:?}");
}
