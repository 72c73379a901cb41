//! Metrics, probes and leader election.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::{Body, to_bytes};
use crd_lifecycle::controller::http::{Health, router};
use crd_lifecycle::controller::leader::{LeaderElector, LeaseSettings};
use http::{Request, StatusCode};
use tower::ServiceExt;

use super::Harness;

async fn get(app: axum::Router, path: &str) -> (StatusCode, String) {
    let response = app
        .oneshot(Request::builder().uri(path).body(Body::empty()).expect("request"))
        .await
        .expect("response");
    let status = response.status();
    let body = to_bytes(response.into_body(), 1 << 20).await.expect("body");
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(start_paused = true)]
async fn metrics_count_reconciles_transitions_and_blocks() {
    let mut h = Harness::with_example();
    h.at("2026-02-01T00:00:00Z");
    h.reconcile("widgets").await;
    let health = Arc::new(Health::default());
    let (status, text) = get(router(h.ctx.metrics.clone(), health), "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    for expected in [
        "crd_lifecycle_reconciles_total 1",
        r#"crd_lifecycle_transitions_applied_total{crd="widgets.example.com",version="v1",milestone="store"} 1"#,
        r#"crd_lifecycle_transitions_applied_total{crd="widgets.example.com",version="v1",milestone="introduce"} 1"#,
        r#"crd_lifecycle_next_transition_timestamp_seconds{policy="widgets"} 1772323200.0"#,
        "crd_lifecycle_reconcile_duration_seconds_count 1",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }

    h.at("2026-06-29T00:00:00Z");
    h.reconcile("widgets").await;
    let (_, text) = get(
        router(h.ctx.metrics.clone(), Arc::new(Health::default())),
        "/metrics",
    )
    .await;
    assert!(
        text.contains(r#"crd_lifecycle_blocked{policy="widgets",reason="AwaitingMigration"} 1"#),
        "{text}"
    );
}

#[tokio::test(start_paused = true)]
async fn probes_follow_health() {
    let metrics = Arc::new(crd_lifecycle::controller::metrics::Metrics::default());
    let health = Arc::new(Health::default());
    assert_eq!(
        get(router(metrics.clone(), health.clone()), "/healthz").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        get(router(metrics.clone(), health.clone()), "/readyz").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    health.alive.store(true, Ordering::Relaxed);
    assert_eq!(
        get(router(metrics.clone(), health.clone()), "/healthz").await.0,
        StatusCode::OK
    );
    assert_eq!(
        get(router(metrics.clone(), health.clone()), "/readyz").await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    health.ready.store(true, Ordering::Relaxed);
    assert_eq!(get(router(metrics, health), "/readyz").await.0, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn only_one_replica_holds_the_lease() {
    let h = Harness::new();
    let settings =
        |identity: &str| LeaseSettings::new("default".into(), "crd-lifecycle".into(), identity.into());
    let first = LeaderElector::new(h.fake.client(), settings("replica-a"));
    let second = LeaderElector::new(h.fake.client(), settings("replica-b"));
    first.acquire().await;
    let lease = h.fake.lock().leases["crd-lifecycle"].clone();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-a");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 15);

    // The second replica keeps waiting while the first holds the lease.
    let waited = tokio::time::timeout(std::time::Duration::from_millis(300), second.acquire()).await;
    assert!(waited.is_err(), "replica-b must not acquire a held lease");

    // On shutdown the first releases it and the second takes over with a new transition.
    first.release().await;
    tokio::time::timeout(std::time::Duration::from_secs(5), second.acquire())
        .await
        .expect("replica-b acquires the released lease");
    let lease = h.fake.lock().leases["crd-lifecycle"].clone();
    assert_eq!(lease["spec"]["holderIdentity"], "replica-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_lease_was_taken_stops_at_once() {
    let h = Harness::new();
    let mut settings = LeaseSettings::new("default".into(), "crd-lifecycle".into(), "replica-a".into());
    settings.retry_period = std::time::Duration::from_millis(20);
    let leader = LeaderElector::new(h.fake.client(), settings);
    let won = leader.acquire().await;
    // Another replica took the lease over (e.g. after this one stalled).
    h.fake.lock().leases.get_mut("crd-lifecycle").expect("lease")["spec"]["holderIdentity"] =
        "replica-b".into();
    let lost = tokio::time::timeout(std::time::Duration::from_secs(2), leader.hold(won))
        .await
        .expect("hold returns once the lease is taken");
    assert!(lost.to_string().contains("held by another replica"), "{lost}");
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewal_hangs_stops_before_its_lease_expires() {
    let h = Harness::new();
    let mut settings = LeaseSettings::new("default".into(), "crd-lifecycle".into(), "replica-a".into());
    settings.lease_duration = std::time::Duration::from_millis(1500);
    settings.renew_deadline = std::time::Duration::from_millis(1000);
    settings.retry_period = std::time::Duration::from_millis(100);
    let leader = LeaderElector::new(h.fake.client(), settings);
    let won = leader.acquire().await;
    let acquired = tokio::time::Instant::now();
    // From now on every lease request hangs: no answer, no error.
    h.fake.lock().leases_stall = true;
    let lost = tokio::time::timeout(std::time::Duration::from_secs(5), leader.hold(won))
        .await
        .expect("hold returns although the renewal never answers");
    let stopped = acquired.elapsed();
    assert!(lost.to_string().contains("could not renew"), "{lost}");
    // Stopped once the renew deadline passed, before another replica could take over
    // (a lease duration after the last renewal).
    assert!(stopped >= std::time::Duration::from_millis(900), "{stopped:?}");
    assert!(stopped < std::time::Duration::from_millis(1500), "{stopped:?}");
    // Releasing on the way out does not hang either.
    tokio::time::timeout(std::time::Duration::from_secs(3), leader.release())
        .await
        .expect("release is bounded");
}

/// A renewal the apiserver wrote but answered late must not move the renew deadline: the
/// others' lease duration runs from the write, so the deadline runs from when the renewal
/// was sent. (Measured from the late answer, this leader would act 400 ms past the instant
/// another replica may take over.)
#[tokio::test(start_paused = true)]
async fn a_renewal_answered_late_does_not_extend_leadership() {
    let h = Harness::new();
    let mut settings = LeaseSettings::new("default".into(), "crd-lifecycle".into(), "replica-a".into());
    settings.lease_duration = std::time::Duration::from_millis(1500);
    settings.renew_deadline = std::time::Duration::from_millis(1200);
    settings.retry_period = std::time::Duration::from_millis(100);
    let leader = LeaderElector::new(h.fake.client(), settings.clone());
    let won = leader.acquire().await;
    let version = |h: &Harness| h.fake.lock().leases["crd-lifecycle"]["metadata"]["resourceVersion"].clone();
    let acquired_version = version(&h);
    // Every lease request is written at once and answered 400 ms later; after the first
    // renewal lands, the apiserver is unreachable.
    h.fake.lock().lease_answer_delay = std::time::Duration::from_millis(400);
    let hold = tokio::spawn(async move {
        let lost = leader.hold(won).await;
        (lost, tokio::time::Instant::now())
    });
    let written = loop {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        if version(&h) != acquired_version {
            h.fake.lock().leases_stall = true;
            break tokio::time::Instant::now();
        }
    };
    let (lost, stopped) = tokio::time::timeout(std::time::Duration::from_secs(10), hold)
        .await
        .expect("hold returns")
        .expect("hold task");
    assert!(lost.to_string().contains("could not renew"), "{lost}");
    // The renewal was sent before the apiserver wrote it: the leader stops within the renew
    // deadline of that write, well before another replica may take over.
    assert!(
        stopped <= written + settings.renew_deadline,
        "stopped {:?} after the last renewal was written",
        stopped - written
    );
    assert!(stopped < written + settings.lease_duration);
}

#[tokio::test(start_paused = true)]
async fn run_stands_by_when_the_renewal_hangs_and_leads_again_when_it_answers() {
    use crd_lifecycle::controller::{RunSettings, run};
    let h = Harness::with_example();
    let mut lease = LeaseSettings::new("default".into(), "crd-lifecycle".into(), "replica-a".into());
    lease.lease_duration = std::time::Duration::from_millis(1500);
    lease.renew_deadline = std::time::Duration::from_millis(1000);
    lease.retry_period = std::time::Duration::from_millis(100);
    let settings = RunSettings {
        metrics_address: "127.0.0.1:0".parse().expect("address"),
        lease: Some(lease),
        resync: std::time::Duration::from_secs(600),
        identity: "replica-a".into(),
        parallel_migrations: 1,
        traffic_sample_interval: std::time::Duration::from_secs(60),
        svm_pending_deadline: std::time::Duration::from_secs(600),
        webhook: None,
    };
    // The whole controller runs here: its policy and CRD watches are not served by the fake
    // (they fail and back off), which this test does not depend on.
    h.fake.lock().unknown_requests_allowed = true;
    let running = tokio::spawn(run(h.fake.client(), settings));
    // It leads once it holds the lease; then the lease endpoint stops answering.
    for _ in 0..100 {
        if h.fake.lock().leases.contains_key("crd-lifecycle") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let stalled = tokio::time::Instant::now();
    h.fake.lock().leases_stall = true;
    // It gives leadership up by its renew deadline, before another replica could take over
    // (a lease duration after the last renewal), and does not exit: it stands by.
    let lease_requests = |h: &Harness| {
        h.fake
            .requests()
            .into_iter()
            .filter(|r| r.path.contains("/leases"))
            .map(|r| r.at)
            .collect::<Vec<_>>()
    };
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert!(!running.is_finished(), "run exited after it lost its lease");
    let renewals_sent = lease_requests(&h);
    let given_up = renewals_sent
        .iter()
        .filter(|at| **at > stalled)
        .min()
        .copied()
        .expect("a renewal after the stall");
    // The stalled renewal is the last of its term, which ends by the renew deadline (1 s)
    // after the last renewal sent. The standby then waits a lease duration (1.5 s) before
    // it tries to lead again: requests the old term sent may still land meanwhile.
    let acquires: Vec<_> = renewals_sent.iter().filter(|at| **at > given_up).collect();
    assert!(!acquires.is_empty(), "the standby never tried to lead again");
    let stood_by = *acquires[0] - stalled;
    assert!(
        stood_by >= std::time::Duration::from_millis(1500)
            && stood_by <= std::time::Duration::from_millis(2700),
        "tried to lead again {stood_by:?} after the stall"
    );
    // The lease answers again: it leads again (it still holds the record, so it renews).
    h.fake.lock().leases_stall = false;
    let answered = tokio::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let renewed = h
        .fake
        .requests()
        .into_iter()
        .any(|r| r.method == "PUT" && r.path.contains("/leases/crd-lifecycle") && r.at >= answered);
    assert!(renewed, "it did not lead again once the lease answered");
    assert!(!running.is_finished(), "run exited");
    running.abort();
}

#[tokio::test(start_paused = true)]
#[should_panic(
    expected = "requests the fake apiserver does not serve: [\"GET /apis/nowhere.example.com/v1/things/x?\"]"
)]
async fn a_request_the_fake_does_not_serve_fails_the_test() {
    let h = Harness::new();
    let request = http::Request::get("/apis/nowhere.example.com/v1/things/x")
        .body(Vec::new())
        .expect("request");
    let answer = h.ctx.client.request::<serde_json::Value>(request).await;
    // Not a 404 that code could read as "does not exist".
    assert!(
        matches!(answer, Err(kube::Error::Api(ref s)) if s.code == 501),
        "{answer:?}"
    );
}

/// The series names a `/metrics` text exposes: every `# TYPE` family with the suffixes its
/// type has (`_total` for counters; `_bucket`, `_sum` and `_count` for histograms).
fn exported_series(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                // The family by its own name too, as documentation refers to it.
                for suffix in ["", "_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

/// Every metric the alerts, the dashboard and the book name is one the operator exports,
/// as scraped from `/metrics`. A family without a sample is not in the text, so each gets
/// one first, through the same calls the controller, the migrations and the webhook make.
#[tokio::test]
async fn the_dashboard_alerts_and_book_use_only_exported_metrics() {
    use crd_lifecycle::controller::metrics::{CrdLabels, JobLabels, Metrics, MigrationResultLabels};
    use crd_lifecycle::webhook::metrics::ReviewResult;
    let metrics = Arc::new(Metrics::default());
    let crd = CrdLabels {
        crd: "widgets.example.com".into(),
    };
    let job = JobLabels {
        crd: "widgets.example.com".into(),
        job: "migration".into(),
    };
    let result = MigrationResultLabels {
        crd: "widgets.example.com".into(),
        result: "failed".into(),
    };
    metrics.observe_reconcile(std::time::Duration::from_millis(3));
    metrics.record_failure("patch_crd");
    metrics.record_transition("widgets.example.com", "v1", "store");
    metrics.set_next_transition("widgets", Some(jiff::Timestamp::UNIX_EPOCH));
    metrics.set_blocked("widgets", &["AwaitingMigration"]);
    metrics.set_state("widgets", Some("Reconciling"));
    metrics.leader.set(1);
    metrics.objects_migrated.get_or_create(&crd).inc();
    metrics.objects_failed.get_or_create(&crd).inc();
    metrics.objects_remaining.get_or_create(&job).set(1);
    metrics.objects_repaired.get_or_create(&crd).inc();
    metrics.job_objects_done.get_or_create(&job).set(1);
    metrics.job_objects_expected.get_or_create(&job).set(2);
    metrics.job_objects_per_second.get_or_create(&job).set(0.5);
    metrics.migrations.get_or_create(&result).inc();
    metrics.managed_fields_cleanups.get_or_create(&result).inc();
    metrics.migration_duration.observe(1.0);
    metrics.webhook.observe_review(
        "widgets",
        ReviewResult::failure,
        std::time::Duration::from_millis(1),
    );
    metrics.webhook.certificate_expiration.set(1.8e9);
    let (status, text) = get(router(metrics, Arc::new(Health::default())), "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let exported = exported_series(&text);
    assert!(exported.contains("crd_lifecycle_reconciles_total"), "{text}");
    let name = regex::Regex::new(r"crd_lifecycle_[a-z_]+[a-z]").expect("pattern");
    let root = env!("CARGO_MANIFEST_DIR");
    let mut checked = 0;
    for file in [
        "deploy/components/monitoring/prometheusrule.yaml",
        "deploy/components/monitoring/alerts.test.yaml",
        "deploy/components/monitoring/dashboard.json",
        "docs/src/concepts/controller.md",
        "docs/src/concepts/engines.md",
        "docs/src/concepts/webhook-ha.md",
        "docs/src/reference/conditions.md",
        "docs/src/reference/metrics.md",
    ] {
        let content = std::fs::read_to_string(format!("{root}/{file}")).expect("readable");
        let used: std::collections::BTreeSet<&str> = name.find_iter(&content).map(|m| m.as_str()).collect();
        assert!(!used.is_empty(), "{file} names no metric");
        let unknown: Vec<&&str> = used.iter().filter(|m| !exported.contains(**m)).collect();
        assert!(
            unknown.is_empty(),
            "{file} uses metrics the operator does not export: {unknown:?}\nexported: {exported:#?}"
        );
        checked += used.len();
    }
    // The alerts alone use these: a renamed metric must fail here, not in production.
    for needed in [
        "crd_lifecycle_policy_state",
        "crd_lifecycle_blocked",
        "crd_lifecycle_next_transition_timestamp_seconds",
        "crd_lifecycle_migration_objects_failed_total",
        "crd_lifecycle_migrations_total",
        "crd_lifecycle_leader",
        "crd_lifecycle_reconcile_failures_total",
        "crd_lifecycle_conversion_reviews_total",
        "crd_lifecycle_webhook_certificate_expiration_timestamp_seconds",
    ] {
        assert!(exported.contains(needed), "{needed} not exported");
    }
    assert!(checked > 30, "{checked}");
}
