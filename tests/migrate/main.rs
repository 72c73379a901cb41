//! Migrator tests against kube's `Client` over the in-process fake apiserver.

#[path = "../support/apiserver/mod.rs"]
mod apiserver;
mod lister;
#[path = "../support/over_http.rs"]
mod over_http;

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use apiserver::{CheckedFake, FakeApiserver, ListFault, ObjectFault};
use crd_lifecycle::migrate::{
    self, Checkpoint, Counts, Mode, Observer, Outcome, Resume, RetryPolicy, Settings, SettleCheck, Target,
};
use over_http::{serve_over_http, tempfile_path};
use serde_json::{Value, json};

const CRD: &str = "widgets.example.com";

/// A CRD whose storage moved from v1alpha1 to v1 (both still listed in storedVersions)
/// with `count` objects still encoded as v1alpha1.
fn cluster(count: usize) -> CheckedFake {
    let fake = CheckedFake(FakeApiserver::new());
    let version = |name: &str, storage: bool| {
        json!({"name": name, "served": true, "storage": storage,
               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
    };
    fake.create_crd(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD},
        "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"}, "scope": "Namespaced",
                 "versions": [version("v1alpha1", false), version("v1", true)]},
        "status": {"storedVersions": ["v1alpha1", "v1"]},
    }));
    fake.add_objects(CRD, count, 3, "v1alpha1");
    fake
}

fn settings(page_size: u32) -> Settings {
    Settings {
        page_size,
        retry: RetryPolicy {
            attempts: 4,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        },
        settle: SettleCheck {
            confirmations: 3,
            interval: Duration::from_millis(1),
            timeout: Duration::from_secs(5),
            ..SettleCheck::default()
        },
        ..Settings::default()
    }
}

fn stored_versions(fake: &FakeApiserver) -> Value {
    fake.crd(CRD)["status"]["storedVersions"].clone()
}

/// The CRD's resourceVersion now (where a run starting now watches it from).
fn resource_version(fake: &FakeApiserver) -> Option<String> {
    fake.crd(CRD)["metadata"]["resourceVersion"]
        .as_str()
        .map(str::to_owned)
}

/// Records checkpoints, restarts, continuations, totals and the targets passes started on.
#[derive(Default)]
struct Recorder {
    started: Mutex<Vec<Target>>,
    checkpoints: Mutex<Vec<(Checkpoint, Counts)>>,
    restarts: Mutex<Vec<String>>,
    continued: Mutex<usize>,
    totals: Mutex<Vec<Option<u64>>>,
}

impl Observer for Recorder {
    fn started(&self, target: &Target, _counts: &Counts) {
        self.started.lock().expect("lock").push(target.clone());
    }

    fn progress(&self, _counts: &Counts, total: Option<u64>) {
        self.totals.lock().expect("lock").push(total);
    }

    fn continued(&self, _reason: &str) {
        *self.continued.lock().expect("lock") += 1;
    }

    fn checkpoint(&self, checkpoint: &Checkpoint, counts: &Counts) {
        self.checkpoints
            .lock()
            .expect("lock")
            .push((checkpoint.clone(), *counts));
    }

    fn restarted(&self, reason: &str) {
        self.restarts.lock().expect("lock").push(reason.to_owned());
    }
}

#[tokio::test(start_paused = true)]
async fn every_page_is_rewritten_then_stored_versions_trimmed() {
    let fake = cluster(1234);
    let observer = Recorder::default();
    let report = migrate::migrate(&fake.client(), CRD, &settings(100), &observer)
        .await
        .expect("runs");
    assert_eq!(
        report.outcome,
        Outcome::Trimmed {
            previous: vec!["v1alpha1".into(), "v1".into()]
        }
    );
    assert!(report.succeeded());
    assert_eq!(
        report.counts,
        Counts {
            listed: 1234,
            rewritten: 1234,
            skipped: 0,
            failed: 0
        }
    );
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 1234)].into());
    assert_eq!(stored_versions(&fake), json!(["v1"]));

    let requests = fake.object_requests();
    let lists = fake.metadata_lists();
    assert_eq!(lists.len(), 13, "1234 objects in pages of 100");
    assert!(
        lists
            .iter()
            .all(|r| r.path == "/apis/example.com/v1/widgets" && r.query.contains("limit=100"))
    );
    let rewrite = requests.iter().find(|r| r.method == "PATCH").expect("a rewrite");
    assert_eq!(rewrite.content_type, "application/merge-patch+json");
    assert!(
        rewrite.path.starts_with("/apis/example.com/v1/namespaces/ns"),
        "{}",
        rewrite.path
    );
    assert_eq!(
        rewrite.body.as_object().map(|o| o.len()),
        Some(1),
        "only metadata.resourceVersion: {}",
        rewrite.body
    );
    assert!(rewrite.body.pointer("/metadata/resourceVersion").is_some());

    // The trim carries a resourceVersion precondition.
    let trim = fake
        .crd_writes()
        .into_iter()
        .find(|r| r.path.ends_with("/status"))
        .expect("trim");
    assert_eq!(trim.body["status"], json!({"storedVersions": ["v1"]}));
    assert!(trim.body.pointer("/metadata/resourceVersion").is_some());

    // Checkpoints come in page order and end with Finished.
    let checkpoints = observer.checkpoints.lock().expect("lock");
    assert_eq!(checkpoints.len(), 13);
    assert_eq!(checkpoints.last().map(|c| &c.0), Some(&Checkpoint::Finished));
    let done: Vec<u64> = checkpoints.iter().map(|(_, c)| c.done()).collect();
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "{done:?}");
}

#[tokio::test(start_paused = true)]
async fn conflicts_and_deletions_count_as_done() {
    let fake = cluster(50);
    fake.after_next_list_page(|state| {
        // Written since listed (409) and deleted since listed (404).
        let key = (CRD.to_owned(), "ns1".to_owned(), "w00001".to_owned());
        state.objects.get_mut(&key).expect("w00001").resource_version = "999999".into();
        state
            .objects
            .remove(&(CRD.to_owned(), "ns2".to_owned(), "w00002".to_owned()));
    });
    let report = migrate::migrate(&fake.client(), CRD, &settings(500), &migrate::Quiet)
        .await
        .expect("runs");
    assert_eq!(
        report.counts,
        Counts {
            listed: 50,
            rewritten: 48,
            skipped: 2,
            failed: 0
        }
    );
    assert!(matches!(report.outcome, Outcome::Trimmed { .. }));
    assert_eq!(stored_versions(&fake), json!(["v1"]));
}

#[tokio::test(start_paused = true)]
async fn too_many_requests_waits_for_retry_after() {
    let fake = cluster(3);
    fake.set_fault(
        "ns0",
        "w00000",
        ObjectFault::Transient {
            code: 429,
            times: 1,
            retry_after: Some(1),
        },
    );
    let report = migrate::migrate(&fake.client(), CRD, &settings(500), &migrate::Quiet)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert_eq!(report.counts.rewritten, 3);
    let to_w0: Vec<Instant> = fake
        .object_requests()
        .iter()
        .filter(|r| r.path.ends_with("/w00000"))
        .map(|r| r.at)
        .collect();
    assert_eq!(to_w0.len(), 2, "one 429, one retry");
    assert!(
        to_w0[1] - to_w0[0] >= Duration::from_millis(990),
        "waited {:?}",
        to_w0[1] - to_w0[0]
    );
}

#[tokio::test(start_paused = true)]
async fn transient_server_errors_are_retried() {
    let fake = cluster(3);
    fake.set_fault(
        "ns1",
        "w00001",
        ObjectFault::Transient {
            code: 503,
            times: 2,
            retry_after: None,
        },
    );
    let report = migrate::migrate(&fake.client(), CRD, &settings(500), &migrate::Quiet)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert_eq!(report.counts.rewritten, 3);
}

#[tokio::test(start_paused = true)]
async fn a_failing_conversion_is_recorded_and_stored_versions_untouched() {
    let fake = cluster(20);
    fake.set_fault(
        "ns1",
        "w00004",
        ObjectFault::ConversionFails("cannot convert widget broken: spec.size must be an integer".into()),
    );
    let report = migrate::migrate(&fake.client(), CRD, &settings(500), &migrate::Quiet)
        .await
        .expect("runs");
    assert_eq!(report.outcome, Outcome::Failed);
    assert_eq!(
        report.counts,
        Counts {
            listed: 20,
            rewritten: 19,
            skipped: 0,
            failed: 1
        }
    );
    assert_eq!(report.failures.len(), 1);
    assert_eq!(report.failures[0].object, "ns1/w00004");
    assert!(
        report.failures[0].message.contains(
            "conversion webhook for example.com/v1, Kind=Widget failed: cannot convert widget broken"
        ),
        "{}",
        report.failures[0].message
    );
    assert!(report.failures[0].message.contains("gave up after 4 attempts"));
    assert_eq!(stored_versions(&fake), json!(["v1alpha1", "v1"]), "not trimmed");
    assert!(report.summary().contains("ns1/w00004"), "{}", report.summary());
}

/// The rewrites each object received.
fn rewrites_per_object(fake: &FakeApiserver) -> std::collections::BTreeMap<String, usize> {
    let mut rewrites = std::collections::BTreeMap::new();
    for request in fake.object_requests().iter().filter(|r| r.method == "PATCH") {
        *rewrites.entry(request.path.clone()).or_default() += 1;
    }
    rewrites
}

#[tokio::test(start_paused = true)]
async fn an_expired_continue_token_goes_on_with_the_fresh_one() {
    let fake = cluster(30);
    fake.after_next_list_page(|state| state.expire_continue_tokens());
    let observer = Recorder::default();
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &observer)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert_eq!((report.restarts, report.expired_tokens), (0, 1));
    assert_eq!(*observer.continued.lock().expect("lock"), 1);
    assert!(observer.restarts.lock().expect("lock").is_empty());
    assert_eq!(report.counts.listed, 30, "no object listed twice");
    let rewrites = rewrites_per_object(&fake);
    assert_eq!(rewrites.len(), 30);
    assert!(rewrites.values().all(|n| *n == 1), "{rewrites:?}");
    // The page after the 410 was asked for with the token the 410 carried (sample 27).
    let lists = fake.metadata_lists();
    assert_eq!(lists.len(), 4, "3 pages and the expired request");
    assert!(
        lists[3].query.contains("continue=1%3A") || lists[3].query.contains("continue=1:"),
        "{}",
        lists[3].query
    );
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 30)].into());
    assert_eq!(stored_versions(&fake), json!(["v1"]));
    assert!(
        report
            .summary()
            .contains("going on after 1 expired continue tokens"),
        "{}",
        report.summary()
    );
}

#[tokio::test(start_paused = true)]
async fn an_expired_token_without_a_fresh_one_restarts_the_listing() {
    let fake = cluster(30);
    fake.lock().expired_without_token = true;
    fake.after_next_list_page(|state| state.expire_continue_tokens());
    let observer = Recorder::default();
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &observer)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert_eq!(report.restarts, 1);
    assert_eq!(observer.restarts.lock().expect("lock").len(), 1);
    assert_eq!(
        report.counts.listed, 30,
        "the counts are those of the complete pass"
    );
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 30)].into());
    assert_eq!(stored_versions(&fake), json!(["v1"]));
}

#[tokio::test(start_paused = true)]
async fn a_migration_across_many_compactions_finishes() {
    // A compaction after every second page: 50 pages, 24 expired tokens.
    let fake = cluster(500);
    fake.lock().compact_every_pages = Some(2);
    let observer = Recorder::default();
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &observer)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert_eq!(report.restarts, 0);
    assert!(report.expired_tokens >= 20, "{}", report.expired_tokens);
    let rewrites = rewrites_per_object(&fake);
    assert_eq!(rewrites.len(), 500, "every object rewritten");
    assert!(rewrites.values().all(|n| *n == 1), "and only once");
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 500)].into());
    assert_eq!(stored_versions(&fake), json!(["v1"]));
    // Every checkpoint after an expiry names a token of the current epoch, so that a
    // resumed run continues the same way.
    let checkpoints = observer.checkpoints.lock().expect("lock").clone();
    assert!(
        checkpoints
            .iter()
            .any(|(c, _)| matches!(c, Checkpoint::Continue(t) if t.starts_with("20:"))),
        "{checkpoints:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_migration_longer_than_the_compaction_interval_finishes() {
    // Requests take 2 ms; etcd compacts every 40 ms: a pass of 300 objects outlasts it
    // many times over.
    let fake = cluster(300);
    {
        let mut state = fake.lock();
        state.latency = Duration::from_millis(2);
        state.compact_every = Some(Duration::from_millis(40));
    }
    let report = migrate::migrate(
        &fake.client(),
        CRD,
        &Settings {
            concurrency: 2,
            ..settings(10)
        },
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert!(report.expired_tokens > 0);
    assert_eq!(report.restarts, 0);
    let rewrites = rewrites_per_object(&fake);
    assert_eq!(rewrites.len(), 300);
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 300)].into());
    assert_eq!(stored_versions(&fake), json!(["v1"]));
}

#[tokio::test(start_paused = true)]
async fn a_stalled_request_times_out_and_is_retried() {
    let fake = cluster(30);
    fake.set_fault("ns1", "w00004", ObjectFault::Stall { times: 1 });
    fake.lock().list_faults.push_back(ListFault::Stall);
    let started = Instant::now();
    let report = migrate::migrate(
        &fake.client(),
        CRD,
        &Settings {
            request_timeout: Duration::from_millis(200),
            ..settings(10)
        },
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let rewrites = rewrites_per_object(&fake);
    assert_eq!(
        rewrites["/apis/example.com/v1/namespaces/ns1/widgets/w00004"], 2,
        "timed out, then retried"
    );
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 30)].into());
}

#[tokio::test(start_paused = true)]
async fn a_failing_list_page_is_retried_not_fatal() {
    let fake = cluster(30);
    fake.after_next_list_page(|state| {
        state.list_faults.extend([
            ListFault::Status {
                code: 503,
                retry_after: None,
            },
            ListFault::Status {
                code: 500,
                retry_after: None,
            },
            ListFault::Status {
                code: 429,
                retry_after: Some(1),
            },
        ]);
    });
    let started = Instant::now();
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After honoured"
    );
    assert_eq!(report.counts.listed, 30);
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 30)].into());
}

/// A CRD storing v1alpha1 whose storage is then switched to v1, as the controller's `store`
/// does, on an apiserver that acts on the switch only after `lag` more requests.
fn switched_with_lag(count: usize, lag: u32) -> CheckedFake {
    let fake = cluster(count);
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"][0]["storage"] = json!(true);
        crd["spec"]["versions"][1]["storage"] = json!(false);
        crd["status"]["storedVersions"] = json!(["v1alpha1"]);
    });
    fake.lock().switch_lag = lag;
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"][0]["storage"] = json!(false);
        crd["spec"]["versions"][1]["storage"] = json!(true);
        crd["status"]["storedVersions"] = json!(["v1alpha1", "v1"]);
    });
    fake
}

#[tokio::test(start_paused = true)]
async fn the_storage_switch_lag_is_waited_out() {
    let fake = switched_with_lag(30, 8);
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    // Rewritten only after the apiserver stored v1: every object is really re-encoded.
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 30)].into());
    assert_eq!(stored_versions(&fake), json!(["v1"]));
    let discovery = fake.discovery_requests();
    // Lagging answers (the lag also answers the count and the first page, listed
    // meanwhile), then 3 in a row; the trim needs no more (the CRD did not change since).
    assert!(
        discovery.len() > 3,
        "lagging answers, then 3 in a row: {}",
        discovery.len()
    );
    assert!(discovery.iter().all(|r| r.path == "/apis/example.com/v1"));
}

#[tokio::test(start_paused = true)]
async fn without_the_wait_a_lagging_apiserver_would_leave_objects_in_the_old_version() {
    // The hazard the wait guards against, shown on the fake: a rewrite answered by an
    // apiserver that has not switched writes nothing.
    let fake = switched_with_lag(1, 1_000_000);
    let client = fake.client();
    let request = http::Request::patch("/apis/example.com/v1/namespaces/ns0/widgets/w00000")
        .header("content-type", "application/merge-patch+json")
        .body(serde_json::to_vec(&json!({"metadata": {}})).expect("json"))
        .expect("request");
    let _: Value = client.request(request).await.expect("rewrite answered 200");
    assert_eq!(fake.encodings(CRD), [("v1alpha1".to_owned(), 1)].into());
    // And the migrator refuses to start on it.
    let impatient = Settings {
        settle: SettleCheck {
            confirmations: 3,
            interval: Duration::from_millis(5),
            timeout: Duration::from_millis(200),
            ..SettleCheck::default()
        },
        ..settings(10)
    };
    let error = migrate::migrate(&client, CRD, &impatient, &migrate::Quiet)
        .await
        .expect_err("not settled");
    assert!(
        error.to_string().contains("not yet storing widgets as v1"),
        "{error}"
    );
    assert_eq!(
        stored_versions(&fake),
        json!(["v1alpha1", "v1"]),
        "nothing trimmed"
    );
}

/// Found by the simulation (seed 804): a settle waiting for a version to be served went on
/// polling discovery every second until its timeout (5 minutes by default) after the CRD was
/// deleted (`kubectl delete crd`, as tests/fixtures/apiserver/crd-deletion-v1.36.txt): it now
/// ends at the first discovery answer after the CRD is gone.
#[tokio::test(start_paused = true)]
async fn a_settle_ends_when_the_crd_is_deleted() {
    let fake = cluster(10);
    fake.edit_crd(CRD, |crd| crd["spec"]["versions"][1]["served"] = json!(false));
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"][0]["storage"] = json!(true);
        crd["spec"]["versions"][1]["storage"] = json!(false);
    });
    // v1 is introduced; the apiserver answering never serves it.
    fake.lock().switch_lag = 1_000_000;
    fake.edit_crd(CRD, |crd| crd["spec"]["versions"][1]["served"] = json!(true));
    let client = fake.client();
    let run = tokio::spawn(async move {
        let patient = Settings {
            mode: Mode::Preflight,
            through_version: Some("v1".into()),
            settle: SettleCheck {
                confirmations: 3,
                interval: Duration::from_secs(1),
                timeout: Duration::from_secs(3600),
                ..SettleCheck::default()
            },
            ..settings(10)
        };
        migrate::migrate(&client, CRD, &patient, &migrate::Quiet).await
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    {
        let mut state = fake.lock();
        state.start_crd_deletion(CRD);
        state.finish_crd_deletion(CRD);
    }
    let deleted = tokio::time::Instant::now();
    let error = run.await.expect("joins").expect_err("the CRD is gone");
    assert!(matches!(error, migrate::Error::CrdNotFound(_)), "{error}");
    assert!(
        deleted.elapsed() <= Duration::from_secs(2),
        "{:?}",
        deleted.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_preflight_waits_until_the_version_is_served() {
    let fake = cluster(10);
    fake.edit_crd(CRD, |crd| crd["spec"]["versions"][1]["served"] = json!(false));
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"][0]["storage"] = json!(true);
        crd["spec"]["versions"][1]["storage"] = json!(false);
    });
    // v1 is introduced; the apiserver answering serves it only 6 requests later.
    fake.lock().switch_lag = 6;
    fake.edit_crd(CRD, |crd| crd["spec"]["versions"][1]["served"] = json!(true));
    let report = migrate::migrate(
        &fake.client(),
        CRD,
        &Settings {
            mode: Mode::Preflight,
            through_version: Some("v1".into()),
            ..settings(10)
        },
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert_eq!(report.outcome, Outcome::PreflightPassed, "{}", report.summary());
    assert_eq!(report.counts.rewritten, 10);
}

/// The fingerprint of the conversion the fake CRD has now.
fn conversion_now(fake: &FakeApiserver) -> String {
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(fake.crd(CRD)).expect("crd");
    migrate::conversion_fingerprint(&crd)
}

/// A checkpoint taken part-way through a preflight of the fake's 50 objects.
async fn checkpoint_of(fake: &FakeApiserver) -> (String, Counts) {
    let first = Recorder::default();
    let _ = migrate::migrate(
        &fake.client(),
        CRD,
        &Settings {
            mode: Mode::Preflight,
            ..settings(10)
        },
        &first,
    )
    .await;
    let (Checkpoint::Continue(token), counts) = first.checkpoints.lock().expect("lock")[1].clone() else {
        panic!("a continue token")
    };
    (token, counts)
}

/// Only a change of the storage version or of the conversion restarts a run: a
/// deprecation (or a served flag) between the checkpoint and the resume does not.
#[tokio::test(start_paused = true)]
async fn a_resume_survives_a_deprecation_but_not_a_conversion_change() {
    let fake = cluster(50);
    let conversion = conversion_now(&fake);
    let started_at = resource_version(&fake);
    let (token, counts) = checkpoint_of(&fake).await;
    fake.edit_crd(CRD, |crd| crd["spec"]["versions"][0]["deprecated"] = json!(true));
    fake.lock().requests.clear();
    let resume = |token: String, conversion: String| Settings {
        resume: Some(Resume {
            continue_token: token,
            counts,
            crd_generation: Some(1),
            crd_resource_version: started_at.clone(),
            storage_version: "v1".into(),
            conversion,
        }),
        ..settings(10)
    };
    let observer = Recorder::default();
    let report = migrate::migrate(&fake.client(), CRD, &resume(token, conversion.clone()), &observer)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert!(
        observer.restarts.lock().expect("lock").is_empty(),
        "resumed, not restarted"
    );
    assert!(
        fake.metadata_lists()[0].query.contains("continue="),
        "listed from the checkpoint"
    );

    // A conversion change between the checkpoint and the resume: a fresh run.
    let fake = cluster(50);
    let started_at = resource_version(&fake);
    let (token, counts) = checkpoint_of(&fake).await;
    let before = conversion_now(&fake);
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["conversion"] = json!({"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
            "clientConfig": {"url": "https://hook.example/convert/w"}}})
    });
    fake.lock().requests.clear();
    let observer = Recorder::default();
    let resumed = Settings {
        resume: Some(Resume {
            continue_token: token,
            counts,
            crd_generation: Some(1),
            crd_resource_version: started_at,
            storage_version: "v1".into(),
            conversion: before,
        }),
        ..settings(10)
    };
    let report = migrate::migrate(&fake.client(), CRD, &resumed, &observer)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    let restarts = observer.restarts.lock().expect("lock").clone();
    assert!(
        restarts[0].contains("storage version or conversion changed"),
        "{restarts:?}"
    );
    assert!(
        !fake.metadata_lists()[0].query.contains("continue="),
        "listed from the start"
    );
    assert_eq!(
        rewrites_per_object(&fake).len(),
        50,
        "every object, not only those after the token"
    );
    assert_eq!(report.counts.listed, 50);
}

#[tokio::test(start_paused = true)]
async fn a_resumed_run_after_failures_retries_them_and_succeeds() {
    let fake = cluster(50);
    // ns1/w00013 is on the third page of ten (names sort ns0/…, ns1/…, ns2/…).
    fake.set_fault(
        "ns1",
        "w00013",
        ObjectFault::ConversionFails("webhook down".into()),
    );
    let started_at = resource_version(&fake);
    let first = Recorder::default();
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &first)
        .await
        .expect("runs");
    assert_eq!(report.outcome, Outcome::Failed);
    let checkpoints = first.checkpoints.lock().expect("lock").clone();
    assert!(!checkpoints.is_empty());
    // No checkpoint passes the failed object, and none carries a failure.
    assert!(
        checkpoints.iter().all(|(checkpoint, counts)| {
            counts.failed == 0
                && matches!(checkpoint, Checkpoint::Continue(t) if t.split_once(':').is_some_and(|(_, last)| last < "ns1/w00013"))
        }),
        "{checkpoints:?}"
    );
    let (Checkpoint::Continue(token), counts) = checkpoints.last().cloned().expect("checkpoint") else {
        panic!("a continue token")
    };

    // The webhook is fixed; the controller restarts and resumes.
    fake.lock().faults.clear();
    let resumed = Settings {
        resume: Some(Resume {
            continue_token: token,
            counts,
            crd_generation: Some(1),
            crd_resource_version: started_at,
            storage_version: "v1".into(),
            conversion: String::new(),
        }),
        ..settings(10)
    };
    let report = migrate::migrate(&fake.client(), CRD, &resumed, &migrate::Quiet)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert_eq!(report.counts.failed, 0);
    assert_eq!(report.counts.listed, 50);
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 50)].into());
    assert_eq!(stored_versions(&fake), json!(["v1"]));
}

#[tokio::test(start_paused = true)]
async fn the_total_comes_from_a_full_list() {
    let fake = cluster(1234);
    let observer = Recorder::default();
    let report = migrate::migrate(&fake.client(), CRD, &settings(100), &observer)
        .await
        .expect("runs");
    assert!(report.succeeded());
    let totals = observer.totals.lock().expect("lock").clone();
    assert!(
        !totals.is_empty() && totals.iter().all(|t| *t == Some(1234)),
        "{:?}",
        &totals[..3]
    );
    // One full list of one object (sample 30: it carries remainingItemCount), not a page.
    let counts: Vec<_> = fake
        .object_requests()
        .into_iter()
        .filter(|r| r.method == "GET" && !r.accept.contains("PartialObjectMetadataList"))
        .collect();
    assert_eq!(counts.len(), 1);
    assert!(counts[0].query.contains("limit=1"), "{}", counts[0].query);
}

#[tokio::test(start_paused = true)]
async fn a_deprecation_mid_run_still_trims_but_a_conversion_change_does_not() {
    // A CRD change that does not touch what the rewrite goes through (a deprecation, the
    // operator's own next transition) leaves every rewritten object in the storage
    // version: the run trims.
    let fake = cluster(30);
    fake.after_next_list_page(|state| {
        let mut crd = state.crds[CRD].clone();
        crd["spec"]["versions"][0]["deprecated"] = json!(true);
        state.store_crd(crd, true);
    });
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect("runs");
    assert!(
        matches!(report.outcome, Outcome::Trimmed { .. }),
        "{:?}",
        report.outcome
    );
    assert_eq!(stored_versions(&fake), json!(["v1"]));
    // A conversion change mid-run: objects rewritten before it went through the old one.
    let fake = cluster(30);
    fake.after_next_list_page(|state| {
        let mut crd = state.crds[CRD].clone();
        crd["spec"]["conversion"] = json!({"strategy": "Webhook", "webhook": {"conversionReviewVersions": ["v1"],
            "clientConfig": {"url": "https://hook.example/convert/w"}}});
        state.store_crd(crd, true);
    });
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect("runs");
    let Outcome::NotTrimmed { reason } = &report.outcome else {
        panic!("{:?}", report.outcome)
    };
    assert!(
        reason.contains("the CRD's conversion changed during the run"),
        "{reason}"
    );
    assert!(!report.succeeded());
    assert_eq!(stored_versions(&fake), json!(["v1alpha1", "v1"]));
}

#[tokio::test(start_paused = true)]
async fn a_storage_switch_mid_run_starts_over() {
    let fake = cluster(30);
    // After the second page: the first is listed while the settle check runs.
    fake.after_next_list_page(|_| {});
    fake.after_next_list_page(|state| {
        let mut crd = state.crds[CRD].clone();
        crd["spec"]["versions"][0]["storage"] = json!(true);
        crd["spec"]["versions"][1]["storage"] = json!(false);
        state.store_crd(crd, true);
    });
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect("runs");
    assert_eq!(report.target.storage_version, "v1alpha1");
    assert!(
        matches!(report.outcome, Outcome::Trimmed { .. }),
        "{:?}",
        report.outcome
    );
    assert_eq!(report.restarts, 1);
    assert_eq!(stored_versions(&fake), json!(["v1alpha1"]));
    assert_eq!(fake.encodings(CRD), [("v1alpha1".to_owned(), 30)].into());
}

#[tokio::test(start_paused = true)]
async fn a_run_resumes_from_its_checkpoint() {
    let fake = cluster(50);
    let started_at = resource_version(&fake);
    // A first run's checkpoint after two pages of ten (what the controller saved).
    let first = Recorder::default();
    let _ = migrate::migrate(
        &fake.client(),
        CRD,
        &Settings {
            mode: Mode::Preflight,
            ..settings(10)
        },
        &first,
    )
    .await;
    let (checkpoint, _) = first.checkpoints.lock().expect("lock")[1].clone();
    let Checkpoint::Continue(token) = checkpoint else {
        panic!("a continue token")
    };
    fake.lock().requests.clear();

    let resumed = Settings {
        resume: Some(Resume {
            continue_token: token.clone(),
            counts: Counts {
                listed: 20,
                rewritten: 20,
                skipped: 0,
                failed: 0,
            },
            crd_generation: Some(1),
            crd_resource_version: started_at,
            storage_version: "v1".into(),
            conversion: String::new(),
        }),
        ..settings(10)
    };
    let report = migrate::migrate(&fake.client(), CRD, &resumed, &migrate::Quiet)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert_eq!(
        report.counts,
        Counts {
            listed: 50,
            rewritten: 50,
            skipped: 0,
            failed: 0
        }
    );
    let requests = fake.object_requests();
    let lists = fake.metadata_lists();
    let first_list = lists.first().expect("a list");
    assert!(
        first_list.query.contains("continue="),
        "resumed with the token: {}",
        first_list.query
    );
    let rewrites = requests.iter().filter(|r| r.method == "PATCH").count();
    assert_eq!(rewrites, 30, "only the objects after the checkpoint");
}

#[tokio::test(start_paused = true)]
async fn concurrency_is_bounded() {
    let fake = cluster(60);
    fake.lock().latency = Duration::from_millis(20);
    let report = migrate::migrate(
        &fake.client(),
        CRD,
        &Settings {
            concurrency: 4,
            ..settings(500)
        },
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert!(report.succeeded());
    assert_eq!(fake.lock().max_in_flight, 4);
}

/// Real time: governor's rate limiter reads the system clock, not tokio's.
#[tokio::test]
async fn qps_is_a_ceiling() {
    let fake = cluster(40);
    let started = Instant::now();
    let report = migrate::migrate(
        &fake.client(),
        CRD,
        &Settings {
            qps: 40,
            ..settings(500)
        },
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert!(report.succeeded());
    // 41 requests (a list and 40 rewrites) at 40 per second, evenly spaced.
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "took {:?}",
        started.elapsed()
    );
    // Over any ten gaps, at least 8 x 25 ms: one answer the loaded fake handled late makes
    // the gap after it short, but the limiter never lets a burst through.
    let arrivals: Vec<Instant> = fake.object_requests().iter().map(|r| r.at).collect();
    let spans: Vec<Duration> = arrivals.windows(11).map(|w| w[10] - w[0]).collect();
    assert!(!spans.is_empty());
    assert!(
        spans.iter().all(|s| *s >= Duration::from_millis(200)),
        "{spans:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn preflight_reads_every_object_and_writes_nothing() {
    let fake = cluster(25);
    fake.set_fault(
        "ns0",
        "w00003",
        ObjectFault::ConversionFails("spec.size must be an integer".into()),
    );
    let report = migrate::migrate(
        &fake.client(),
        CRD,
        &Settings {
            mode: Mode::Preflight,
            ..settings(10)
        },
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert_eq!(report.outcome, Outcome::Failed);
    assert_eq!(report.failures[0].object, "ns0/w00003");
    assert!(
        fake.object_requests().iter().all(|r| r.method == "GET"),
        "nothing written"
    );
    assert!(fake.crd_writes().is_empty());
    assert_eq!(fake.encodings(CRD), [("v1alpha1".to_owned(), 25)].into());

    let clean = cluster(25);
    let report = migrate::migrate(
        &clean.client(),
        CRD,
        &Settings {
            mode: Mode::Preflight,
            ..settings(10)
        },
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert_eq!(report.outcome, Outcome::PreflightPassed);
}

#[tokio::test(start_paused = true)]
async fn nothing_to_do_and_bad_targets() {
    let fake = cluster(5);
    fake.edit_crd(CRD, |crd| crd["status"]["storedVersions"] = json!(["v1"]));
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect("runs");
    assert_eq!(report.outcome, Outcome::AlreadyMigrated);
    assert!(fake.object_requests().is_empty());

    let missing = migrate::migrate(
        &fake.client(),
        "gadgets.example.com",
        &settings(10),
        &migrate::Quiet,
    )
    .await;
    assert!(matches!(missing, Err(migrate::Error::CrdNotFound(_))));

    // The apiserver accepts an unserved storage version; reading through it would answer a
    // plain 404 for every object (apiserver-samples/15), so the migrator refuses.
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"][1]["served"] = json!(false);
        crd["status"]["storedVersions"] = json!(["v1alpha1", "v1"]);
    });
    let unserved = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet).await;
    let Err(error) = unserved else {
        panic!("must refuse")
    };
    assert!(
        error
            .to_string()
            .contains("the storage version v1 of widgets.example.com is not served"),
        "{error}"
    );
}

async fn migrate_cli(kubeconfig: &tempfile_path::Path, extra: &[&str]) -> std::process::Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"));
    command
        .arg("migrate")
        .arg(CRD)
        .arg("--kubeconfig")
        .arg(&kubeconfig.0)
        .args(extra);
    command.output().await.expect("the binary runs")
}

/// Real time: the binary runs as a child process over a real socket.
#[tokio::test]
async fn the_migrate_command_reports_and_exits_by_outcome() {
    let fake = cluster(700);
    let (kubeconfig, server) = serve_over_http(FakeApiserver::clone(&fake)).await;

    // Preflight first: reads everything, writes nothing, exit 0.
    let output = migrate_cli(&kubeconfig, &["--dry-run", "--page-size", "100"]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("every object converts (700 listed, 700 converted"),
        "{stdout}"
    );
    assert_eq!(fake.encodings(CRD), [("v1alpha1".to_owned(), 700)].into());

    // A broken object: exit 1, the object listed, storedVersions untouched.
    fake.set_fault(
        "ns2",
        "w00011",
        ObjectFault::ConversionFails("spec.size must be an integer".into()),
    );
    let output = migrate_cli(&kubeconfig, &["--page-size", "100", "--concurrency", "4"]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("failed: 700 listed, 699 rewritten, 0 skipped, 1 failed"),
        "{stdout}"
    );
    assert!(stdout.contains("  ns2/w00011: 500"), "{stdout}");
    assert!(String::from_utf8_lossy(&output.stderr).contains("error: the migration did not complete"));
    assert_eq!(stored_versions(&fake), json!(["v1alpha1", "v1"]));

    // Fixed: exit 0, trimmed.
    fake.lock().faults.clear();
    let output = migrate_cli(&kubeconfig, &["--page-size", "100"]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.contains("status.storedVersions trimmed from [v1alpha1, v1] to [v1]"),
        "{stdout}"
    );
    assert_eq!(stored_versions(&fake), json!(["v1"]));

    // A CRD that does not exist, and bad arguments: exit 2.
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"));
    let output = command
        .args(["migrate", "gadgets.example.com", "--kubeconfig"])
        .arg(&kubeconfig.0)
        .output()
        .await
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("CustomResourceDefinition gadgets.example.com not found")
    );
    let output = migrate_cli(&kubeconfig, &["--concurrency", "0"]).await;
    assert_eq!(output.status.code(), Some(2));
    server.abort();
}

#[tokio::test(start_paused = true)]
async fn the_fake_answers_discovery_and_expiry_as_recorded() {
    let fake = cluster(3);
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"][0]["storage"] = json!(true);
        crd["spec"]["versions"][1]["storage"] = json!(false);
    });
    let client = fake.client();
    let discover = || async {
        let request = http::Request::get("/apis/example.com/v1")
            .body(Vec::new())
            .expect("request");
        client.request::<Value>(request).await.expect("discovery")
    };
    // Samples 25 (v1alpha1 stored) and 26 (after the switch to v1).
    assert_eq!(
        discover().await["resources"][0]["storageVersionHash"],
        "aXSEt3iQTdQ="
    );
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"][0]["storage"] = json!(false);
        crd["spec"]["versions"][1]["storage"] = json!(true);
    });
    let document = discover().await;
    assert_eq!(document["resources"][0]["storageVersionHash"], "gIwvi5rymmg=");
    assert_eq!(document["resources"][0]["name"], "widgets");

    // Sample 27: the 410 for an expired token is a Status whose metadata.continue goes on.
    fake.lock().compact_every_pages = Some(1);
    let page = |token: Option<String>| {
        let client = client.clone();
        async move {
            let query = token.map_or_else(String::new, |t| format!("&continue={t}"));
            let request = http::Request::get(format!("/apis/example.com/v1/widgets?limit=1{query}"))
                .header(
                    "accept",
                    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
                )
                .body(Vec::new())
                .expect("request");
            let response = client
                .send(request.map(kube::client::Body::from))
                .await
                .expect("answer");
            let code = response.status().as_u16();
            let body: Value =
                serde_json::from_slice(&response.into_body().collect_bytes().await.expect("body"))
                    .expect("json");
            (code, body)
        }
    };
    let (code, first) = page(None).await;
    assert_eq!(code, 200);
    assert!(first["metadata"].get("remainingItemCount").is_none(), "sample 30");
    let (code, expired) = page(first["metadata"]["continue"].as_str().map(str::to_owned)).await;
    assert_eq!((code, expired["reason"].as_str()), (410, Some("Expired")));
    let fresh = expired["metadata"]["continue"]
        .as_str()
        .expect("a fresh token")
        .to_owned();
    let (code, next) = page(Some(fresh)).await;
    assert_eq!(code, 200, "sample 28: the fresh token goes on");
    assert_ne!(
        next["items"][0]["metadata"]["name"],
        first["items"][0]["metadata"]["name"]
    );
}

#[tokio::test(start_paused = true)]
async fn rewrites_can_go_through_the_status_subresource() {
    let fake = cluster(20);
    let through_status = Settings {
        through_status: true,
        ..settings(10)
    };
    // The storage version has no status subresource: a clear failure, nothing written.
    let error = migrate::migrate(&fake.client(), CRD, &through_status, &migrate::Quiet)
        .await
        .expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("need a status subresource, and the storage version v1"),
        "{error}"
    );
    assert!(fake.object_requests().iter().all(|r| r.method == "GET"));

    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"][1]["subresources"] = json!({"status": {}})
    });
    let report = migrate::migrate(&fake.client(), CRD, &through_status, &migrate::Quiet)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    let rewrites: Vec<_> = fake
        .object_requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(rewrites.len(), 20);
    assert!(
        rewrites.iter().all(|r| r.path.ends_with("/status")),
        "{}",
        rewrites[0].path
    );
    // Sample 31: the whole object is stored in the storage version.
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 20)].into());
    assert_eq!(stored_versions(&fake), json!(["v1"]));
}

/// An entry as a server-side apply through `version` leaves it (sample 29).
fn applied_through(version: &str, manager: &str, field: &str) -> Value {
    json!({"apiVersion": format!("example.com/{version}"), "fieldsType": "FieldsV1",
           "fieldsV1": {"f:spec": {format!("f:{field}"): {}}}, "manager": manager, "operation": "Apply",
           "time": "2026-11-23T11:19:00Z"})
}

fn cleanup(versions: Option<Vec<&str>>, conversion: Option<Value>) -> Settings {
    Settings {
        mode: Mode::CleanManagedFields,
        managed_fields: migrate::ManagedFieldsCleanup {
            versions: versions.map(|v| v.into_iter().map(str::to_owned).collect()),
            conversion: conversion.map(|c| serde_json::from_value(c).expect("conversion")),
            dry_run: false,
        },
        ..settings(10)
    }
}

#[tokio::test(start_paused = true)]
async fn a_cleanup_names_the_storage_version_and_translates_renamed_fields() {
    let fake = cluster(30);
    for i in 0..10 {
        let name = format!("w{i:05}");
        fake.set_managed_fields(
            CRD,
            &format!("ns{}", i % 3),
            &name,
            vec![applied_through("v1alpha1", "gitops", "size")],
        );
    }
    let conversion = json!({"changes": [{"from": "v1alpha1", "to": "v1", "renamed": [{"from": "spec.size", "to": "spec.replicas"}]}]});
    let report = migrate::migrate(
        &fake.client(),
        CRD,
        &cleanup(Some(vec!["v1alpha1"]), Some(conversion)),
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert_eq!(
        report.outcome,
        Outcome::ManagedFieldsCleaned,
        "{}",
        report.summary()
    );
    assert_eq!(
        (report.counts.rewritten, report.counts.skipped),
        (10, 20),
        "only the objects that needed it"
    );
    let entries = fake.managed_fields(CRD, "ns0", "w00000");
    assert_eq!(entries[0]["apiVersion"], "example.com/v1");
    assert_eq!(
        entries[0]["fieldsV1"],
        json!({"f:spec": {"f:replicas": {}}}),
        "the manager still owns the field"
    );
    assert_eq!(entries[0]["manager"], "gitops");
    // Each write was guarded by the resourceVersion it was read at.
    let patch = fake
        .object_requests()
        .into_iter()
        .find(|r| r.method == "PATCH")
        .expect("a write");
    assert_eq!(patch.content_type, "application/json-patch+json");
    assert_eq!(patch.body[0]["op"], "test");
    assert_eq!(patch.body[0]["path"], "/metadata/resourceVersion");
    assert_eq!(
        stored_versions(&fake),
        json!(["v1alpha1", "v1"]),
        "a cleanup trims nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn an_object_written_meanwhile_is_read_again() {
    let fake = cluster(3);
    fake.set_managed_fields(
        CRD,
        "ns0",
        "w00000",
        vec![applied_through("v1alpha1", "gitops", "size")],
    );
    // Written between the listing and the cleanup's patch: its resourceVersion moved on.
    fake.after_next_list_page(|state| {
        let key = (CRD.to_owned(), "ns0".to_owned(), "w00000".to_owned());
        let rv = state.objects[&key].resource_version.clone();
        state.objects.get_mut(&key).expect("object").resource_version = format!("{rv}9");
    });
    let report = migrate::migrate(
        &fake.client(),
        CRD,
        &cleanup(Some(vec!["v1alpha1"]), None),
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert_eq!(
        fake.managed_fields(CRD, "ns0", "w00000")[0]["apiVersion"],
        "example.com/v1"
    );
    let patches = fake
        .object_requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .count();
    assert_eq!(
        patches, 2,
        "the guarded patch failed once (422), then went through after a read"
    );
}

#[tokio::test(start_paused = true)]
async fn repair_fixes_objects_a_removal_already_broke() {
    let fake = cluster(5);
    fake.set_managed_fields(
        CRD,
        "ns1",
        "w00001",
        vec![applied_through("v1alpha1", "ssa-old", "size")],
    );
    // v1alpha1 removed without a cleanup (storedVersions [v1]).
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"]
            .as_array_mut()
            .expect("versions")
            .remove(0);
        crd["status"]["storedVersions"] = json!(["v1"]);
    });
    let api: kube::Api<kube::core::DynamicObject> = kube::Api::namespaced_with(
        fake.client(),
        "ns1",
        &kube::discovery::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("example.com", "v1", "Widget"),
            "widgets",
        ),
    );
    let apply = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w00001"}, "spec": {"size": 3}});
    let params = kube::api::PatchParams::apply("ssa-old");
    let broken = api
        .patch("w00001", &params, &kube::api::Patch::Apply(&apply))
        .await
        .expect_err("broken");
    let kube::Error::Api(status) = broken else {
        panic!("{broken}")
    };
    assert_eq!(status.code, 500);
    assert_eq!(
        status.message,
        "request to convert CR to an invalid group/version: example.com/v1alpha1"
    );

    // Repair: every entry naming a version the CRD no longer has.
    let report = migrate::migrate(&fake.client(), CRD, &cleanup(None, None), &migrate::Quiet)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert_eq!(report.counts.rewritten, 1);
    api.patch("w00001", &params, &kube::api::Patch::Apply(&apply))
        .await
        .expect("server-side apply works again");
}

/// Real time: the binary runs as a child process over a real socket.
#[tokio::test]
async fn the_repair_command_finds_and_fixes_broken_objects() {
    let fake = cluster(40);
    fake.set_managed_fields(
        CRD,
        "ns2",
        "w00002",
        vec![applied_through("v1alpha1", "ssa-old", "size")],
    );
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"]
            .as_array_mut()
            .expect("versions")
            .remove(0);
        crd["status"]["storedVersions"] = json!(["v1"]);
    });
    let (kubeconfig, server) = serve_over_http(FakeApiserver::clone(&fake)).await;
    let repair = |extra: &'static [&'static str]| {
        let path = kubeconfig.0.clone();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"))
                .args(["repair-managed-fields", CRD, "--kubeconfig"])
                .arg(&path)
                .args(extra)
                .output()
                .await
                .expect("the binary runs")
        }
    };
    let output = repair(&["--dry-run"]).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("dry run, nothing written") && stdout.contains("1 need a repair"),
        "{stdout}"
    );
    assert_eq!(
        fake.managed_fields(CRD, "ns2", "w00002")[0]["apiVersion"],
        "example.com/v1alpha1"
    );

    let output = repair(&[]).await;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("1 repaired"), "{stdout}");
    assert_eq!(
        fake.managed_fields(CRD, "ns2", "w00002")[0]["apiVersion"],
        "example.com/v1"
    );

    // A CRD that does not exist: exit 2.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"))
        .args(["repair-managed-fields", "gone.example.com", "--kubeconfig"])
        .arg(&kubeconfig.0)
        .output()
        .await
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    server.abort();
}

fn give_every_version_a_status_subresource(fake: &FakeApiserver) {
    fake.edit_crd(CRD, |crd| {
        for version in crd["spec"]["versions"].as_array_mut().expect("versions") {
            version["subresources"] = json!({"status": {}});
        }
    });
}

/// The message a denied `patch widgets` gets: the verb, group and resource, and the
/// ClusterRole to add.
const MISSING_PATCH: &str = "missing permission on the objects of widgets.example.com: patch widgets in API group \
example.com. Grant it with a ClusterRole labelled crdlifecycle.io/aggregate-to-migrator=true \
(`crd-lifecycle rbac widgets.example.com` prints it): \
{\"apiVersion\":\"rbac.authorization.k8s.io/v1\",\"kind\":\"ClusterRole\",\"metadata\":{\"name\":\
\"crd-lifecycle-migrator-widgets.example.com\",\"labels\":{\"crdlifecycle.io/aggregate-to-migrator\":\"true\"}},\
\"rules\":[{\"apiGroups\":[\"example.com\"],\"resources\":[\"widgets\"],\"verbs\":[\"get\",\"list\",\"patch\"]}]}";

#[tokio::test(start_paused = true)]
async fn a_missing_permission_stops_the_run_before_any_object_is_touched() {
    let fake = cluster(30);
    fake.deny("patch", "example.com", "widgets", "");
    let error = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect_err("refused");
    assert!(matches!(error, migrate::Error::MissingPermission(_)), "{error:?}");
    assert_eq!(error.to_string(), MISSING_PATCH);
    assert!(fake.object_requests().is_empty(), "no object listed or patched");
    assert_eq!(stored_versions(&fake), json!(["v1alpha1", "v1"]));
    // It asked for exactly what a rewrite needs.
    let asked: Vec<String> = fake
        .lock()
        .access_reviews
        .iter()
        .map(|(verb, ..)| verb.clone())
        .collect();
    assert_eq!(
        asked,
        ["list", "patch", "watch", "list"],
        "the objects, then the CRD by name"
    );

    // Through the status subresource, the status is what must be patchable.
    fake.allow_all();
    give_every_version_a_status_subresource(&fake);
    fake.deny("patch", "example.com", "widgets", "status");
    let through_status = Settings {
        through_status: true,
        ..settings(10)
    };
    let error = migrate::migrate(&fake.client(), CRD, &through_status, &migrate::Quiet)
        .await
        .expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("patch widgets/status in API group example.com"),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains(r#""resources":["widgets/status"],"verbs":["patch"]"#),
        "{error}"
    );

    // Granted: the same run proceeds.
    fake.allow_all();
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
}

/// Real time: the binary runs as a child process over a real socket.
#[tokio::test]
async fn the_migrate_command_exits_2_naming_a_missing_permission() {
    let fake = cluster(10);
    fake.deny("patch", "example.com", "widgets", "");
    let (kubeconfig, server) = serve_over_http(FakeApiserver::clone(&fake)).await;
    let output = migrate_cli(&kubeconfig, &[]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&format!("error: {MISSING_PATCH}")), "{stderr}");
    assert!(fake.object_requests().is_empty());
    server.abort();
}

/// With the declarative conversion the CRD's webhook serves, a preflight also converts each
/// object as the webhook does and checks it against the target version's schema: a value
/// the apiserver would reject (or a field it would prune) fails the preflight naming the
/// object and the path, before the `store` switches anything.
#[tokio::test(start_paused = true)]
async fn a_preflight_with_a_declarative_conversion_checks_the_target_schema() {
    let fake = cluster(10);
    // Stored as v1alpha1 {spec.size}; v1 calls it spec.replicas, at most 5.
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"][0]["storage"] = json!(true);
        crd["spec"]["versions"][1]["storage"] = json!(false);
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}});
        crd["spec"]["versions"][1]["schema"]["openAPIV3Schema"] = json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {"replicas": {"type": "integer", "maximum": 5}}}}});
    });
    let conversion: crd_lifecycle::api::ConversionSpec = serde_json::from_value(json!({
        "webhook": {"enabled": true},
        "changes": [{"from": "v1alpha1", "to": "v1", "renamed": [{"from": "spec.size", "to": "spec.replicas"}]}]
    }))
    .expect("conversion");
    let report = migrate::migrate(
        &fake.client(),
        CRD,
        &Settings {
            mode: Mode::Preflight,
            through_version: Some("v1".into()),
            preflight_conversion: Some(conversion),
            ..settings(10)
        },
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert_eq!(report.outcome, Outcome::Failed, "{}", report.summary());
    // Sizes 6 to 9 do not fit v1's maximum.
    assert_eq!(report.counts.failed, 4);
    let failure = report
        .failures
        .iter()
        .find(|f| f.object.ends_with("/w00006"))
        .expect("w00006 fails");
    assert_eq!(
        failure.message,
        "v1alpha1 -> v1: spec.replicas: Invalid value: 6: should be less than or equal to 5"
    );
    assert!(
        fake.object_requests().iter().all(|r| r.method == "GET"),
        "a preflight writes nothing"
    );
}

/// A 422 whose object did not change since it was read is the apiserver refusing the
/// object itself (invalid under the current schema), not a lost race: one failure, reported
/// once with the apiserver's message, after one re-read, not ~36 requests and "kept
/// changing".
#[tokio::test(start_paused = true)]
async fn a_cleanup_tells_an_invalid_object_from_a_lost_race() {
    let fake = cluster(3);
    for i in 0..3 {
        fake.set_managed_fields(
            CRD,
            &format!("ns{}", i % 3),
            &format!("w{i:05}"),
            vec![applied_through("v1alpha1", "gitops", "size")],
        );
    }
    fake.set_fault(
        "ns1",
        "w00001",
        apiserver::ObjectFault::Invalid(
            "spec.size: Invalid value: 3: must be less than or equal to 2".into(),
        ),
    );
    let report = migrate::migrate(
        &fake.client(),
        CRD,
        &cleanup(Some(vec!["v1alpha1"]), None),
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert_eq!(report.outcome, Outcome::Failed, "{}", report.summary());
    assert_eq!((report.counts.rewritten, report.counts.failed), (2, 1));
    assert_eq!(report.failures.len(), 1);
    assert_eq!(report.failures[0].object, "ns1/w00001");
    assert_eq!(
        report.failures[0].message,
        "422 Invalid: Widget \"w00001\" is invalid: spec.size: Invalid value: 3: must be less than or equal to 2"
    );
    let requests: Vec<String> = fake
        .object_requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/w00001"))
        .map(|r| r.method.clone())
        .collect();
    assert_eq!(requests, ["PATCH", "GET"], "one attempt and one re-read");
}

/// A cleanup of a version just unserved waits until the apiserver answering has stopped
/// serving it (the same settle rule as a migration's): an HA peer that has not seen the
/// unserve would still accept a server-side apply through it, naming it again after the
/// object was cleaned.
#[tokio::test(start_paused = true)]
async fn a_cleanup_waits_until_no_apiserver_serves_the_version() {
    let fake = cluster(6);
    for i in 0..6 {
        fake.set_managed_fields(
            CRD,
            &format!("ns{}", i % 3),
            &format!("w{i:05}"),
            vec![applied_through("v1alpha1", "gitops", "size")],
        );
    }
    // v1alpha1 is unserved; the apiserver answering sees that only 6 requests later.
    fake.lock().switch_lag = 6;
    fake.edit_crd(CRD, |crd| crd["spec"]["versions"][0]["served"] = json!(false));
    fake.clear_requests();
    let report = migrate::migrate(
        &fake.client(),
        CRD,
        &cleanup(Some(vec!["v1alpha1"]), None),
        &migrate::Quiet,
    )
    .await
    .expect("runs");
    assert_eq!(
        report.outcome,
        Outcome::ManagedFieldsCleaned,
        "{}",
        report.summary()
    );
    let requests = fake.requests();
    let first_write = requests
        .iter()
        .position(|r| r.method == "PATCH")
        .expect("entries rewritten");
    let absent_before: usize = requests[..first_write]
        .iter()
        .filter(|r| r.path == "/apis/example.com/v1alpha1")
        .count();
    // Discovery asked until v1alpha1 was gone for the confirmations in a row, before any
    // entry was rewritten.
    assert!(
        absent_before >= 2,
        "{absent_before} discovery requests before the first rewrite"
    );
    let last_discovery = requests
        .iter()
        .rposition(|r| r.path == "/apis/example.com/v1alpha1")
        .expect("discovery");
    assert!(last_discovery < first_write, "settled before the pass");
}

/// Without the VersionPolicy CRD the controller says exactly that (once, not at every
/// retry), is not ready, and SIGTERM stops it within 5 s whatever its watches are doing.
/// Real time: the binary runs as a child process over a real socket.
#[tokio::test]
async fn the_controller_without_its_crd_says_so_is_not_ready_and_stops_on_sigterm() {
    let fake = cluster(0);
    fake.lock().policies_unserved = true;
    let (kubeconfig, _server) = serve_over_http(FakeApiserver::clone(&fake)).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"))
        .args(["run", "--kubeconfig"])
        .arg(&kubeconfig.0)
        .arg(format!("--metrics-addr=127.0.0.1:{port}"))
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starts");
    // Not ready while the policies cannot be listed (alive all the same).
    let get = |path: &'static str| async move {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await.ok()?;
        text.split_whitespace().nth(1).map(str::to_owned)
    };
    let mut healthy = None;
    for _ in 0..100 {
        healthy = get("/healthz").await;
        if healthy.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(healthy.as_deref(), Some("200"), "alive");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        get("/readyz").await.as_deref(),
        Some("503"),
        "not ready without its CRD"
    );
    // SIGTERM: gone within 5 s.
    let pid = child.id().expect("pid").to_string();
    let sent = std::time::Instant::now();
    let killed = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("stopped within 5 s of SIGTERM")
        .expect("exit status");
    assert!(sent.elapsed() < Duration::from_secs(5));
    assert!(status.success(), "{status:?}");
    let mut stderr = String::new();
    use tokio::io::AsyncReadExt;
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .await
        .expect("stderr");
    let said = stderr.matches("the VersionPolicy CRD is not installed").count();
    assert_eq!(said, 1, "said once, not at every retry: {stderr}");
}

/// Gives the CRD a managedFields entry last changed `ago` (as the apiserver records every
/// change, sample 02).
fn last_changed(fake: &FakeApiserver, ago: jiff::SignedDuration) {
    let time = (fake.lock().now() - ago)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    fake.lock()
        .crds
        .get_mut(CRD)
        .expect("CRD")
        .pointer_mut("/metadata")
        .and_then(Value::as_object_mut)
        .expect("metadata")
        .insert(
            "managedFields".into(),
            json!([{"manager": "kubectl", "operation": "Update", "apiVersion": "apiextensions.k8s.io/v1",
                    "time": time, "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]),
        );
}

/// 30 objects migrated (and the CRD trimmed) with the CRD last changed `ago`.
async fn migrated_after_a_change(ago: jiff::SignedDuration) -> CheckedFake {
    let fake = cluster(30);
    last_changed(&fake, ago);
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect("runs");
    assert!(
        matches!(report.outcome, Outcome::Trimmed { .. }),
        "{}",
        report.summary()
    );
    fake
}

/// The settle check costs a run on a CRD that has not changed for a minute one discovery
/// request: every apiserver has had that minute to act on its last change. The trim needs
/// no second check, as the CRD did not change since the first.
#[tokio::test(start_paused = true)]
async fn a_crd_unchanged_for_a_minute_is_confirmed_with_one_answer() {
    let fake = migrated_after_a_change(jiff::SignedDuration::from_mins(10)).await;
    assert_eq!(fake.discovery_requests().len(), 1);
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 30)].into());
}

/// A CRD changed moments ago gets the whole check (answers in a row) before the first page
/// is listed. Unchanged at the trim, it is not checked again.
#[tokio::test(start_paused = true)]
async fn a_fresh_switch_is_confirmed_before_the_first_page_is_listed() {
    let fake = migrated_after_a_change(jiff::SignedDuration::from_secs(2)).await;
    let requests = fake.requests();
    let is_discovery = |r: &&apiserver::Recorded| r.path == "/apis/example.com/v1";
    assert_eq!(
        requests.iter().filter(is_discovery).count(),
        3,
        "3 in a row, none at the trim"
    );
    let last_discovery = requests
        .iter()
        .rposition(|r| r.path == "/apis/example.com/v1")
        .expect("discovery");
    let first_write = requests
        .iter()
        .position(|r| r.method == "PATCH")
        .expect("rewrites");
    let first_page = requests
        .iter()
        .position(|r| {
            r.method == "GET" && r.path == "/apis/example.com/v1/widgets" && r.query.contains("limit=10")
        })
        .expect("listed");
    assert!(
        last_discovery < first_write,
        "no write before the switch is confirmed"
    );
    // Found by the simulation: a page listed while the check ran let an object that a lagging
    // apiserver wrote meanwhile (in the old version) pass for one written since (409: skipped).
    assert!(
        last_discovery < first_page,
        "nothing is listed before the switch is confirmed"
    );
}

/// Issue 29, finding 1: during a migration from v1alpha1 to v1, the storage version flips to
/// v1alpha1 (already in `storedVersions`) and back to v1, and objects the run had already
/// rewritten are written meanwhile, so stored as v1alpha1. `storedVersions` gains nothing,
/// yet trimming it would lose them: the CRD watch saw the flip, so the run starts over and
/// rewrites them before it trims.
#[tokio::test(start_paused = true)]
async fn a_flip_away_and_back_during_a_run_is_rewritten_before_the_trim() {
    let fake = flip_on_the_third_page();
    let observer = Recorder::default();
    let report = migrate::migrate(&fake.client(), CRD, &one_at_a_time(), &observer)
        .await
        .expect("runs");
    assert!(
        matches!(report.outcome, Outcome::Trimmed { .. }),
        "{}",
        report.summary()
    );
    assert_eq!(
        fake.encodings(CRD),
        [("v1".to_owned(), 30)].into(),
        "nothing left in a trimmed version"
    );
    assert_eq!(stored_versions(&fake), json!(["v1"]));
    assert_eq!(report.restarts, 1, "{}", report.summary());
    let restarts = observer.restarts.lock().expect("lock").clone();
    assert!(
        restarts[0].contains("the storage version was v1alpha1 instead of v1 at resourceVersion"),
        "{restarts:?}"
    );
}

/// One object at a time, ten per page: when the third page is listed, every object of the
/// first page has been rewritten.
fn one_at_a_time() -> Settings {
    Settings {
        concurrency: 1,
        ..settings(10)
    }
}

/// The storage version flips to v1alpha1, the first page's objects are written (so stored
/// as v1alpha1), and it flips back to v1.
fn flip_and_write(state: &mut apiserver::State) {
    state.switch_storage(CRD, "v1alpha1");
    state.write_objects(CRD, 10);
    state.switch_storage(CRD, "v1");
}

/// 30 objects; when the third page is listed (every object of the first rewritten), the
/// storage version flips away and back while the first page's objects are written.
fn flip_on_the_third_page() -> CheckedFake {
    let fake = cluster(30);
    fake.after_next_list_page(|_| {});
    fake.after_next_list_page(|_| {});
    fake.after_next_list_page(flip_and_write);
    fake
}

/// Resumes from `resume` to a trim that leaves nothing in a trimmed version; the restarts
/// the run reported.
async fn resumed_to_the_end(fake: &FakeApiserver, resume: Resume) -> Vec<String> {
    let observer = Recorder::default();
    let resumed = Settings {
        resume: Some(resume),
        ..one_at_a_time()
    };
    let report = migrate::migrate(&fake.client(), CRD, &resumed, &observer)
        .await
        .expect("runs");
    assert!(report.succeeded(), "{}", report.summary());
    assert_eq!(
        fake.encodings(CRD),
        [("v1".to_owned(), 30)].into(),
        "nothing left in a trimmed version"
    );
    assert_eq!(stored_versions(fake), json!(["v1"]));
    observer.restarts.lock().expect("lock").clone()
}

/// A run that stops with a checkpoint after its second page (the third page's first
/// object fails), the target it started on, and the checkpoint as the controller resumes it.
async fn interrupted_after_two_pages(fake: &FakeApiserver) -> Resume {
    fake.set_fault(
        "ns2",
        "w00002",
        ObjectFault::ConversionFails("webhook down".into()),
    );
    let first = Recorder::default();
    let report = migrate::migrate(&fake.client(), CRD, &one_at_a_time(), &first)
        .await
        .expect("runs");
    assert_eq!(report.outcome, Outcome::Failed);
    fake.lock().faults.clear();
    let (Checkpoint::Continue(token), counts) = first.checkpoints.lock().expect("lock")[1].clone() else {
        panic!("a continue token")
    };
    assert_eq!(counts.rewritten, 20);
    let started = first.started.lock().expect("lock")[0].clone();
    let from = started.watched_from.expect("a rewrite watches the CRD");
    Resume {
        continue_token: token,
        counts,
        crd_generation: from.generation,
        crd_resource_version: Some(from.resource_version),
        storage_version: "v1".into(),
        conversion: started.conversion,
    }
}

/// Finding 1 across a failover: the checkpoint was taken before the flip, and the run that
/// resumes from it replays the CRD's history from where the interrupted run started. It
/// sees the flip and starts afresh, so the objects before the checkpoint are rewritten too.
#[tokio::test(start_paused = true)]
async fn a_flip_during_a_failover_starts_the_resumed_run_afresh() {
    let fake = cluster(30);
    let resume = interrupted_after_two_pages(&fake).await;
    flip_and_write(&mut fake.lock());
    fake.clear_requests();
    let restarts = resumed_to_the_end(&fake, resume).await;
    assert!(
        restarts[0]
            .contains("since the checkpoint's run started, the storage version was v1alpha1 instead of v1"),
        "{restarts:?}"
    );
    assert!(
        !fake.metadata_lists()[0].query.contains("continue="),
        "listed from the start"
    );
}

/// The history since the checkpoint is compacted away (the apiserver restarted after an
/// etcd compaction, tests/fixtures/apiserver/crd-watch-expired.txt): Kubernetes' own rule
/// decides. A CRD whose generation did not move since is resumed; one whose generation
/// moved (a flip, or any spec change: nothing tells them apart) is migrated afresh.
#[tokio::test(start_paused = true)]
async fn a_compacted_history_resumes_only_if_the_generation_did_not_move() {
    let fake = cluster(30);
    let resume = interrupted_after_two_pages(&fake).await;
    fake.lock().expire_watch_history();
    fake.clear_requests();
    let restarts = resumed_to_the_end(&fake, resume).await;
    assert!(restarts.is_empty(), "{restarts:?}");
    assert!(fake.metadata_lists()[0].query.contains("continue="), "resumed");

    let fake = cluster(30);
    let resume = interrupted_after_two_pages(&fake).await;
    {
        let mut state = fake.lock();
        flip_and_write(&mut state);
        state.expire_watch_history();
    }
    let restarts = resumed_to_the_end(&fake, resume).await;
    assert!(
        restarts[0].contains("could not be watched (410 Expired: too old resource version")
            && restarts[0].contains("its generation moved from 1 to 3"),
        "{restarts:?}"
    );
}

/// Finding 4: the run started on a CRD unchanged for ten minutes (one discovery answer),
/// and the CRD changed a moment before the trim. The trim confirms the state it acts on
/// by that state's own age: the full check (three answers in a row in these settings).
#[tokio::test(start_paused = true)]
async fn a_crd_changed_just_before_the_trim_gets_the_full_check_there() {
    let fake = cluster(30);
    last_changed(&fake, jiff::SignedDuration::from_mins(10));
    fake.after_next_list_page(|_| {});
    fake.after_next_list_page(|_| {});
    fake.after_next_list_page(|state| {
        let mut crd = state.crds[CRD].clone();
        crd["spec"]["versions"][0]["deprecated"] = json!(true);
        state.store_crd(crd, true);
    });
    let report = migrate::migrate(&fake.client(), CRD, &one_at_a_time(), &migrate::Quiet)
        .await
        .expect("runs");
    assert!(
        matches!(report.outcome, Outcome::Trimmed { .. }),
        "{}",
        report.summary()
    );
    assert_eq!(
        fake.discovery_requests().len(),
        1 + 3,
        "one answer before the writes, three at the trim"
    );
}

/// Finding 4, the 409: the trim's precondition fails because the CRD changed between the
/// read and the patch. The trim reads it again and confirms the new state, whatever it
/// confirmed before.
#[tokio::test(start_paused = true)]
async fn a_conflict_at_the_trim_confirms_the_new_state_again() {
    let fake = cluster(30);
    last_changed(&fake, jiff::SignedDuration::from_mins(10));
    fake.before_next_crd_status_patch(|state| {
        let mut crd = state.crds[CRD].clone();
        crd["spec"]["versions"][0]["deprecated"] = json!(true);
        state.store_crd(crd, true);
    });
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect("runs");
    assert!(
        matches!(report.outcome, Outcome::Trimmed { .. }),
        "{}",
        report.summary()
    );
    let trims: Vec<_> = fake
        .crd_writes()
        .into_iter()
        .filter(|r| r.path.ends_with("/status"))
        .collect();
    assert_eq!(trims.len(), 2, "a conflict, then the trim");
    let requests = fake.requests();
    let conflict = requests
        .iter()
        .position(|r| r.method == "PATCH" && r.path.ends_with("/status"))
        .expect("the first trim");
    let after_conflict = requests[conflict..]
        .iter()
        .filter(|r| r.path == "/apis/example.com/v1")
        .count();
    assert_eq!(after_conflict, 3, "the changed CRD confirmed again, in full");
}

/// Finding 7: this machine's clock is a minute ahead of the apiserver's, and the CRD
/// changed two seconds ago. Measured on one clock (the managedFields time against the
/// `date` of the answer), it is fresh: the full check, not one answer.
#[tokio::test(start_paused = true)]
async fn a_skewed_local_clock_does_not_make_a_fresh_switch_look_settled() {
    let fake = cluster(30);
    fake.lock().clock_offset = -jiff::SignedDuration::from_secs(60);
    last_changed(&fake, jiff::SignedDuration::from_secs(2));
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect("runs");
    assert!(
        matches!(report.outcome, Outcome::Trimmed { .. }),
        "{}",
        report.summary()
    );
    assert_eq!(fake.discovery_requests().len(), 3, "three answers in a row");
}

/// Finding 2, the trim after the built-in migrator: it relies on the CRD as it was when the
/// migration was created (watched from then on), not as it is at the trim. A flip since
/// refuses the trim; a deprecation since does not.
#[tokio::test(start_paused = true)]
async fn the_trim_after_a_built_in_migration_refuses_a_storage_change_since_its_creation() {
    let stored = ["v1alpha1".to_owned(), "v1".to_owned()];
    // A migration created for the CRD as it is now; `change` happens; then the trim after it.
    let trim_after = |change: fn(&FakeApiserver)| {
        let stored = stored.clone();
        async move {
            let fake = cluster(0);
            let client = fake.client();
            let created_for = migrate::GuardStart {
                resource_version: resource_version(&fake).expect("resourceVersion"),
                generation: Some(1),
                storage_version: "v1".into(),
            };
            let guard = migrate::StorageGuard::start(&client, CRD, created_for, Duration::from_secs(10));
            change(&fake);
            let conversion = conversion_now(&fake);
            let outcome = migrate::trim_after(&client, CRD, &settings(10), &guard, &stored, &conversion)
                .await
                .expect("answers");
            (outcome, stored_versions(&fake))
        }
    };
    let (outcome, after) = trim_after(|fake| {
        let mut state = fake.lock();
        state.switch_storage(CRD, "v1alpha1");
        state.switch_storage(CRD, "v1");
    })
    .await;
    let Outcome::NotTrimmed { reason } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(
        reason.contains("the storage version was v1alpha1 instead of v1 at resourceVersion")
            && reason.ends_with("since the migration was created"),
        "{reason}"
    );
    assert_eq!(after, json!(["v1alpha1", "v1"]));

    let (outcome, after) =
        trim_after(|fake| fake.edit_crd(CRD, |crd| crd["spec"]["versions"][0]["deprecated"] = json!(true)))
            .await;
    assert_eq!(
        outcome,
        Outcome::Trimmed {
            previous: stored.to_vec()
        }
    );
    assert_eq!(after, json!(["v1"]));
}
