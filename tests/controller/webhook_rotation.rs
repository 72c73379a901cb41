//! The webhook's certificate refresher against the fake apiserver: the CRDs are read once
//! at most per pass (and only to learn something), a new CA reaches every CRD before the
//! certificate it signed is served, also while the rotation record cannot be written, a
//! failing start is retried rather than fatal, and a replica is Ready only while it serves
//! a certificate every CRD trusts.

use std::sync::Arc;

use crd_lifecycle::conversion::CRD_CONVERSION_ANNOTATION;
use crd_lifecycle::webhook::ca::{
    CaBundleKeeper, CertificateRefresher, CertificateSource, RotationRecord, SINCE_ANNOTATION, Synced,
    WebhookCrds, WebhookEndpoint, WebhookTarget,
};
use crd_lifecycle::webhook::{CachedPolicies, CertStore, Readiness, WebhookMetrics, WebhookSettings, certs};
use kube::ResourceExt;
use kube::runtime::events::{Recorder, Reporter};

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
    /// The webhook's caches (as `run` keeps them) the replica finds the CRDs through.
    caches: CachedPolicies,
    _watches: Watches,
}

/// The watches filling a replica's caches, stopped with it.
struct Watches(tokio::task::JoinHandle<()>);

impl Drop for Watches {
    fn drop(&mut self) {
        self.0.abort();
    }
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
        let (caches, watches) = CachedPolicies::watch(h.ctx.client.clone());
        let crds = WebhookCrds::new(&caches);
        let endpoint = Arc::new(WebhookEndpoint::new(target()).with_crds(crds));
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
            caches,
            _watches: Watches(tokio::spawn(watches)),
        }
    }

    /// Waits until the replica's watches have delivered every CRD and policy as the fake
    /// holds them (a watch delivers a write some time after its answer).
    async fn caught_up(&self, h: &Harness) {
        for _ in 0..10_000 {
            let (crds, policies) = {
                let state = h.fake.lock();
                let versions = |objects: &std::collections::BTreeMap<String, serde_json::Value>| {
                    objects
                        .iter()
                        .map(|(name, o)| {
                            (
                                name.clone(),
                                o["metadata"]["resourceVersion"]
                                    .as_str()
                                    .unwrap_or_default()
                                    .to_owned(),
                            )
                        })
                        .collect::<std::collections::BTreeMap<_, _>>()
                };
                (versions(&state.crds), versions(&state.policies))
            };
            let seen_crds: std::collections::BTreeMap<_, _> = self
                .caches
                .crds
                .state()
                .iter()
                .map(|c| (c.name_any(), c.resource_version().unwrap_or_default()))
                .collect();
            let seen_policies: std::collections::BTreeMap<_, _> = self
                .caches
                .policies
                .state()
                .iter()
                .map(|p| (p.name_any(), p.resource_version().unwrap_or_default()))
                .collect();
            if seen_crds == crds && seen_policies == policies {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        panic!("the replica's watches did not deliver the fake's CRDs and policies");
    }

    /// One refresh once the watches caught up; how many CRDs it read (GET), after checking
    /// that it listed none in full.
    async fn refresh(&mut self, h: &Harness) -> usize {
        self.caught_up(h).await;
        let before = crd_reads(h).len();
        self.refresher.refresh().await;
        assert_eq!(full_crd_lists(h), 0, "the CRDs are never listed in full");
        crd_reads(h).len() - before
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

/// The CRDs read one by one (GET), in order.
fn crd_reads(h: &Harness) -> Vec<String> {
    let prefix = format!("{CRD_LIST}/");
    h.fake
        .requests()
        .iter()
        .filter(|r| r.method == "GET")
        .filter_map(|r| r.path.strip_prefix(&prefix).map(str::to_owned))
        .collect()
}

/// Lists of the CRDs' full objects (the webhook's metadata-only watch lists only metadata).
fn full_crd_lists(h: &Harness) -> usize {
    h.fake
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == CRD_LIST && !r.accept.contains("as=PartialObjectMetadata"))
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

/// The leader's CA bundle keeper for this replica's bundle, reporting to the fake.
fn keeper(h: &Harness, replica: &Replica) -> CaBundleKeeper {
    let reporter = Reporter {
        controller: "crd-lifecycle".into(),
        instance: Some("replica-a".into()),
    };
    CaBundleKeeper::new(
        h.ctx.client.clone(),
        replica.endpoint.clone(),
        Recorder::new(h.ctx.client.clone(), reporter),
    )
}

/// One pass of the keeper once the replica's watches caught up.
async fn sync(h: &Harness, replica: &Replica, keeper: &mut CaBundleKeeper) -> Synced {
    replica.caught_up(h).await;
    let synced = keeper.sync().await.expect("the CRDs read");
    assert_eq!(full_crd_lists(h), 0, "the CRDs are never listed in full");
    synced
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
    /// CRDs read by the replica's first refresh.
    first_reads: usize,
}

async fn rotating(test: &str) -> Rotating {
    let mut h = harness();
    let files = Files::new(test);
    let (ca1, ca2) = (new_ca(), new_ca());
    files.write(&ca1);
    let mut a = Replica::new(&h, files.source(), "replica-a");
    let first_reads = a.refresh(&h).await;
    record_kept_for_a_ttl(&h);
    lead(&mut h, &a).await;
    Rotating {
        h,
        files,
        ca1,
        ca2,
        a,
        first_reads,
    }
}

/// A refresh reads the CRDs only to learn something, never lists them, and reads a CRD again
/// only once it changed: waiting for the leader during a rotation costs no request.
#[tokio::test]
async fn a_refresh_reads_a_crd_only_to_learn_something_and_only_once_it_changed() {
    let Rotating {
        mut h,
        files,
        ca1,
        ca2,
        mut a,
        first_reads,
    } = rotating("rotation-reads").await;
    assert_eq!(first_reads, 1, "a first start reads the policy's CRD once");
    assert!(a.certs.serves(&ca1.cert_pem));
    assert_eq!(a.ready(), Ok(()));
    assert_eq!(crd_bundle(&h), ca1.ca_pem);
    for _ in 0..3 {
        assert_eq!(a.refresh(&h).await, 0, "nothing changed: nothing to read");
    }

    // cert-manager rotates the CA: the new certificate waits, its CA appended. The CRD is
    // read: it changed since the first read (the leader pointed it at the webhook).
    files.write(&ca2);
    assert_eq!(a.refresh(&h).await, 1);
    assert!(a.certs.serves(&ca1.cert_pem), "still the old certificate");
    assert_eq!(a.ready(), Ok(()), "serving a certificate the CRDs trust");
    assert_eq!(a.bundle(), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    // While it waits: nothing read until the CRD changes.
    assert_eq!(a.refresh(&h).await, 0);
    lead(&mut h, &a).await;
    assert_eq!(crd_bundle(&h), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    assert_eq!(
        a.refresh(&h).await,
        1,
        "the CRD changed: read once, and it trusts the new CA"
    );
    assert!(a.certs.serves(&ca2.cert_pem));
    // No replica serves the old CA any more: it leaves the bundle.
    assert_eq!(a.bundle(), ca2.ca_pem);
    lead(&mut h, &a).await;
    assert_eq!(crd_bundle(&h), ca2.ca_pem);
    assert_eq!(a.refresh(&h).await, 0, "settled");
}

/// A CRD like the conversion example's, named `name`, that the webhook does not serve: no
/// policy names it and it records no conversion. Some are pointed at another webhook.
fn unrelated(i: usize) -> serde_json::Value {
    let mut crd = crate::yaml(include_str!("../../examples/conversion/crd.yaml"));
    crd["metadata"]["name"] = format!("things{i}.example.com").into();
    crd["spec"]["names"]["plural"] = format!("things{i}").into();
    if i.is_multiple_of(5) {
        crd["spec"]["conversion"] = serde_json::json!({
            "strategy": "Webhook",
            "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": {"service": {
                "namespace": "other", "name": "other-webhook", "path": "/convert", "port": 443}}},
        });
    }
    crd
}

/// Among 50 CRDs the webhook does not serve, the refresher and the keeper read only the two
/// it does (the policy's, and one a deleted policy released with its conversion recorded),
/// each once until it changes, and never list the CRDs: on a cluster of a thousand CRDs of
/// hundreds of kB each, a minute's pass costs nothing when nothing changed. A CRD pointed at
/// the webhook's Service that no policy names and that records no conversion is not read
/// either: the webhook refuses every review for it, whatever CA it trusts.
#[tokio::test]
async fn only_the_crds_the_webhook_serves_are_read_and_only_once_they_changed() {
    const RELEASED: &str = "widgets.example.com";
    const STRAY: &str = "strays.example.com";
    let h = harness();
    for i in 0..50 {
        h.fake.create_crd(unrelated(i));
    }
    h.fake.create_crd(released_without_a_bundle(RELEASED));
    let mut stray = released_without_a_bundle(STRAY);
    stray["metadata"]["annotations"] = serde_json::json!({});
    h.fake.create_crd(stray);
    let files = Files::new("rotation-reads-few");
    let ca1 = new_ca();
    files.write(&ca1);
    let mut a = Replica::new(&h, files.source(), "replica-a");
    a.refresh(&h).await;
    let mut reads = crd_reads(&h);
    reads.sort();
    assert_eq!(
        reads,
        [CRD, RELEASED],
        "each CRD the webhook serves read once, no other"
    );

    let mut keeper = keeper(&h, &a);
    h.fake.clear_requests();
    let synced = sync(&h, &a, &mut keeper).await;
    assert_eq!(synced.written, [RELEASED], "{synced:?}");
    assert!(
        crd_reads(&h).is_empty(),
        "what the refresher read serves the keeper"
    );
    assert_eq!(bundle_of(&h, RELEASED), ca1.ca_pem);
    assert_eq!(bundle_of(&h, STRAY), "", "not the keeper's");

    // Nothing changed: a pass of each reads nothing (the keeper's own write included).
    h.fake.clear_requests();
    sync(&h, &a, &mut keeper).await;
    a.refresh(&h).await;
    assert!(crd_reads(&h).is_empty(), "{:?}", crd_reads(&h));
    // An unrelated CRD changes: nothing read.
    h.fake.edit_crd("things7.example.com", |crd| {
        crd["metadata"]["labels"] = serde_json::json!({"edited": "yes"})
    });
    sync(&h, &a, &mut keeper).await;
    assert!(crd_reads(&h).is_empty(), "{:?}", crd_reads(&h));
    // A CRD the webhook serves changes: read once, and its bundle put back.
    h.fake.edit_crd(RELEASED, |crd| {
        crd["spec"]["conversion"]["webhook"]["clientConfig"]
            .as_object_mut()
            .expect("clientConfig")
            .remove("caBundle");
    });
    let synced = sync(&h, &a, &mut keeper).await;
    assert_eq!(synced.written, [RELEASED]);
    assert_eq!(crd_reads(&h), [RELEASED]);
    assert_eq!(bundle_of(&h, RELEASED), ca1.ca_pem);
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

/// A replica started while the apiserver was down (restarted with it, as in the soak on
/// v1.36.2, where its passes had backed off to 29 s and both replicas were unready for 10 s
/// during the other's drain): however long the outage, it is Ready within 5 s of the first
/// pass that can succeed.
#[tokio::test(start_paused = true)]
async fn a_replica_not_ready_retries_at_least_every_five_seconds() {
    let h = harness();
    // Forty refused reads: twenty failed passes, minutes of outage.
    h.fake.lock().secrets_forbidden.insert("GET".into(), 40);
    let a = Replica::new(&h, secret(), "replica-a");
    let readiness = a.readiness.clone();
    let refresher = tokio::spawn(a.refresher.run());
    let refused = || h.fake.lock().secrets_forbidden.get("GET").copied();
    let started = tokio::time::Instant::now();
    let mut last = (refused(), started);
    while refused() != Some(0) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if refused() != last.0 {
            last = (refused(), tokio::time::Instant::now());
        }
        let since = last.1.elapsed();
        assert!(
            since <= std::time::Duration::from_secs(6),
            "no pass for {since:?}"
        );
        assert!(readiness.check().is_err());
    }
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(60),
        "a backoff, no spin: {:?}",
        started.elapsed()
    );
    let recovered = tokio::time::Instant::now();
    while readiness.check().is_err() {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let took = recovered.elapsed();
    assert!(took <= std::time::Duration::from_secs(6), "{took:?}");
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

    // A write that failed for a passing reason is said, and tried again at the next pass.
    let mut keeper = keeper(&h, &a);
    h.fake.fail_next_crd_patch(500, "etcdserver: request timed out");
    let failed = sync(&h, &a, &mut keeper).await;
    assert!(failed.written.is_empty() && failed.refused.is_empty());
    assert_eq!(failed.failed.len(), 1, "{:?}", failed.failed);
    assert!(
        failed.failed[0].1.contains("request timed out"),
        "{:?}",
        failed.failed
    );
    let synced = sync(&h, &a, &mut keeper).await;
    assert_eq!(synced.written, [CRD]);
    assert!(synced.failed.is_empty(), "{:?}", synced.failed);
    assert_eq!(crd_bundle(&h), format!("{}{}", ca1.ca_pem, ca2.ca_pem));
    a.refresh(&h).await;
    assert!(a.certs.serves(&ca2.cert_pem), "trusted: served");
    // Once the old CA leaves the bundle, it leaves the CRD too; then nothing to write.
    a.refresh(&h).await;
    sync(&h, &a, &mut keeper).await;
    assert_eq!(crd_bundle(&h), ca2.ca_pem);
    let again = sync(&h, &a, &mut keeper).await;
    assert!(again.written.is_empty() && again.failed.is_empty(), "{again:?}");
}

/// A CRD like the conversion example's, named `name`, that the policy `released` pointed at
/// the webhook's Service before it was deleted: its conversion recorded on it (so the webhook
/// still converts for it), and no `caBundle`, which the apiserver accepts
/// (tests/fixtures/apiserver/crd-ca-bundle-writes-v1.36.txt, 1), e.g. applied again by a
/// chart that leaves the bundle to whoever injects it.
fn released_without_a_bundle(name: &str) -> serde_json::Value {
    let mut crd = crate::yaml(include_str!("../../examples/conversion/crd.yaml"));
    crd["metadata"]["name"] = name.into();
    let plural = name.split('.').next().unwrap_or_default();
    crd["spec"]["names"]["plural"] = plural.into();
    crd["spec"]["conversion"] = serde_json::json!({
        "strategy": "Webhook",
        "webhook": {"conversionReviewVersions": ["v1"], "clientConfig": {"service": {
            "namespace": NAMESPACE, "name": "crd-lifecycle-webhook",
            "path": "/convert/released", "port": 443}}},
    });
    let policy = crate::yaml(include_str!("../../examples/conversion/policy.yaml"));
    let record = serde_json::json!({"policy": "released", "conversion": policy["spec"]["conversion"]});
    crd["metadata"]["annotations"] = serde_json::json!({CRD_CONVERSION_ANNOTATION: record.to_string()});
    crd
}

/// The `caBundle` a CRD holds (PEM), empty when it has none.
fn bundle_of(h: &Harness, name: &str) -> String {
    let encoded = &h.fake.crd(name)["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"];
    if encoded.is_null() {
        return String::new();
    }
    decode(encoded)
}

/// The keeper's write of a CRD pointed at the webhook without a `caBundle` lands (a merge
/// patch sets the absent member: ibid., 3a; the JSON Patch `replace` it sent before did too,
/// 2a), so the rotation does not wait on that CRD for ever.
#[tokio::test]
async fn a_crd_pointed_at_the_webhook_without_a_bundle_gets_it() {
    let Rotating { h, ca1, mut a, .. } = rotating("rotation-no-bundle").await;
    const RELEASED: &str = "widgets.example.com";
    h.fake.create_crd(released_without_a_bundle(RELEASED));
    let synced = sync(&h, &a, &mut keeper(&h, &a)).await;
    assert_eq!(synced.written, [RELEASED], "{synced:?}");
    assert_eq!(bundle_of(&h, RELEASED), ca1.ca_pem);
    a.refresh(&h).await;
    assert_eq!(
        a.ready(),
        Ok(()),
        "every CRD pointed at the webhook trusts the CA served"
    );
}

/// The CRD changes between the keeper's read and its write: the merge patch's resourceVersion
/// is stale, the apiserver answers 409 (ibid., 3b), and the keeper reads the CRD again and
/// writes it in the same pass, not a minute later.
#[tokio::test]
async fn a_write_that_lost_a_race_is_read_and_written_again() {
    let Rotating { h, ca1, a, .. } = rotating("rotation-race").await;
    const RELEASED: &str = "widgets.example.com";
    h.fake.create_crd(released_without_a_bundle(RELEASED));
    // Someone labels the CRD just before the keeper's write lands.
    h.fake.before_next_crd_patch(|state| {
        let mut crd = state.crds[RELEASED].clone();
        crd["metadata"]["labels"] = serde_json::json!({"team": "widgets"});
        state.store_crd(crd, false);
    });
    h.fake.clear_requests();
    let synced = sync(&h, &a, &mut keeper(&h, &a)).await;
    assert_eq!(synced.written, [RELEASED], "{synced:?}");
    assert!(synced.raced.is_empty() && synced.refused.is_empty() && synced.failed.is_empty());
    assert_eq!(bundle_of(&h, RELEASED), ca1.ca_pem);
    assert_eq!(
        h.fake.crd(RELEASED)["metadata"]["labels"]["team"],
        "widgets",
        "the label kept"
    );
    let writes = h.fake.crd_writes();
    assert_eq!(writes.len(), 2, "the write lost, then won");
    for write in &writes {
        assert!(write.content_type.starts_with("application/merge-patch+json"));
        assert!(write.body["metadata"]["resourceVersion"].is_string(), "guarded");
    }
    assert_ne!(
        writes[0].body["metadata"]["resourceVersion"], writes[1].body["metadata"]["resourceVersion"],
        "the second write carries the resourceVersion read again"
    );
}

/// The apiserver refuses the bundle (its validation: a CA file that holds no certificate,
/// answered 422 as tests/fixtures/apiserver/crd-ca-bundle-writes-v1.36.txt, 4a): a refusal is
/// not a race. The keeper says so on the CRD (a Warning Event with the apiserver's words) and
/// in its result, once per refusal, keeps trying at each pass, and writes the next bundle the
/// apiserver accepts.
#[tokio::test]
async fn a_bundle_the_apiserver_refuses_is_reported_not_taken_for_a_race() {
    let Rotating { h, ca1, a, .. } = rotating("rotation-refused").await;
    const RELEASED: &str = "widgets.example.com";
    h.fake.create_crd(released_without_a_bundle(RELEASED));
    let mut keeper = keeper(&h, &a);
    a.endpoint
        .set_ca_bundle("-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n".into());
    let refused = sync(&h, &a, &mut keeper).await;
    assert!(refused.written.is_empty() && refused.raced.is_empty() && refused.failed.is_empty());
    let names: Vec<&str> = refused.refused.iter().map(|(crd, _)| crd.as_str()).collect();
    assert_eq!(names, [CRD, RELEASED], "{refused:?}");
    for (_, message) in &refused.refused {
        assert!(
            message.ends_with(
                "spec.conversion.webhookClientConfig.caBundle: Invalid value: \"LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCkNBCi0tLS0tRU5EIENFUlRJRklDQVRFLS0tLS0K\": unable to load root certificates: unable to parse bytes as PEM block"
            ),
            "{message}"
        );
    }
    let warnings = |h: &Harness| -> Vec<serde_json::Value> {
        h.fake
            .events()
            .into_iter()
            .filter(|e| e["reason"] == "CABundleRefused")
            .collect()
    };
    let events = warnings(&h);
    assert_eq!(events.len(), 2, "one per CRD: {events:?}");
    assert_eq!(events[1]["type"], "Warning");
    assert_eq!(events[1]["regarding"]["kind"], "CustomResourceDefinition");
    assert_eq!(events[1]["regarding"]["name"], RELEASED);
    let note = events[1]["note"].as_str().unwrap_or_default();
    assert!(
        note.starts_with(&format!(
            "the apiserver refused the conversion webhook's CA bundle for {RELEASED}: CustomResourceDefinition.apiextensions.k8s.io \"{RELEASED}\" is invalid"
        )),
        "{note}"
    );
    // The next pass tries again (the apiserver may accept it, e.g. an admission policy
    // lifted) and reports nothing new.
    let again = sync(&h, &a, &mut keeper).await;
    assert_eq!(again.refused.len(), 2);
    assert_eq!(warnings(&h).len(), 2, "reported once");
    // A CA the apiserver accepts is written.
    a.endpoint.set_ca_bundle(ca1.ca_pem.clone());
    let synced = sync(&h, &a, &mut keeper).await;
    assert_eq!(synced.written, [RELEASED], "{synced:?}");
    assert!(synced.refused.is_empty());
    assert_eq!(bundle_of(&h, RELEASED), ca1.ca_pem);
}

/// After `kubectl delete secret`, the rotation record may write first and create the Secret
/// Opaque; the certificate keeper then fills that Secret without changing its type (the
/// apiserver refuses a type change with 422 "field is immutable", recorded in
/// tests/fixtures/apiserver/secret-answers-v1.36.txt: the certificates would never be
/// written again).
#[tokio::test]
async fn certificates_are_written_into_a_secret_the_rotation_record_created() {
    let h = Harness::new();
    let client = h.fake.client();
    let record = RotationRecord {
        namespace: NAMESPACE.to_owned(),
        secret: SECRET.to_owned(),
        replica: "replica-a".to_owned(),
        ttl: std::time::Duration::from_secs(180),
    };
    record
        .publish(&client, None, jiff::Timestamp::now())
        .await
        .expect("the record creates the Secret");
    assert_eq!(h.fake.lock().secrets[SECRET]["type"], "Opaque");
    let bundle = certs::ensure_secret(&client, NAMESPACE, SECRET, &target().certificate_names())
        .await
        .expect("the certificates are written into the Secret the record created");
    let secret = h.fake.lock().secrets[SECRET].clone();
    assert_eq!(secret["type"], "Opaque", "the type stays as created");
    assert!(
        secret["metadata"]["annotations"]
            .as_object()
            .is_some_and(|a| a.contains_key(SINCE_ANNOTATION)),
        "the record's entries are kept: {secret}"
    );
    let again = certs::ensure_secret(&client, NAMESPACE, SECRET, &target().certificate_names())
        .await
        .expect("read back");
    assert_eq!(again, bundle, "the certificates read back from the Opaque Secret");
}
