//! Migrator tests against kube's `Client` over the in-process fake apiserver.

#[path = "../support/apiserver.rs"]
mod apiserver;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use apiserver::{FakeApiserver, ObjectFault};
use crd_lifecycle::migrate::{self, Checkpoint, Counts, Mode, Observer, Outcome, RetryPolicy, Settings};
use serde_json::{Value, json};

const CRD: &str = "widgets.example.com";

/// A CRD whose storage moved from v1alpha1 to v1 (both still listed in storedVersions)
/// with `count` objects still encoded as v1alpha1.
fn cluster(count: usize) -> FakeApiserver {
    let fake = FakeApiserver::new();
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
        ..Settings::default()
    }
}

fn stored_versions(fake: &FakeApiserver) -> Value {
    fake.crd(CRD)["status"]["storedVersions"].clone()
}

/// Records checkpoints and restarts.
#[derive(Default)]
struct Recorder {
    checkpoints: Mutex<Vec<(Checkpoint, Counts)>>,
    restarts: Mutex<Vec<String>>,
}

impl Observer for Recorder {
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

#[tokio::test]
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
    let lists: Vec<_> = requests.iter().filter(|r| r.method == "GET").collect();
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

#[tokio::test]
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

#[tokio::test]
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

#[tokio::test]
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

#[tokio::test]
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

#[tokio::test]
async fn an_expired_continue_token_restarts_the_listing() {
    let fake = cluster(30);
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

#[tokio::test]
async fn a_generation_change_mid_run_prevents_the_trim() {
    let fake = cluster(30);
    fake.after_next_list_page(|state| {
        let mut crd = state.crds[CRD].clone();
        crd["spec"]["versions"][0]["deprecated"] = json!(true);
        state.store_crd(crd, true);
    });
    let report = migrate::migrate(&fake.client(), CRD, &settings(10), &migrate::Quiet)
        .await
        .expect("runs");
    let Outcome::NotTrimmed { reason } = &report.outcome else {
        panic!("{:?}", report.outcome)
    };
    assert!(reason.contains("generation changed from 1 to 2"), "{reason}");
    assert!(!report.succeeded());
    assert_eq!(stored_versions(&fake), json!(["v1alpha1", "v1"]));
}

#[tokio::test]
async fn a_storage_switch_mid_run_starts_over() {
    let fake = cluster(30);
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

#[tokio::test]
async fn a_run_resumes_from_its_checkpoint() {
    let fake = cluster(50);
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
        resume: Some((
            token.clone(),
            Counts {
                listed: 20,
                rewritten: 20,
                skipped: 0,
                failed: 0,
            },
        )),
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
    let first_list = requests.iter().find(|r| r.method == "GET").expect("a list");
    assert!(
        first_list.query.contains("continue="),
        "resumed with the token: {}",
        first_list.query
    );
    let rewrites = requests.iter().filter(|r| r.method == "PATCH").count();
    assert_eq!(rewrites, 30, "only the objects after the checkpoint");
}

#[tokio::test]
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
    let arrivals: Vec<Instant> = fake.object_requests().iter().map(|r| r.at).collect();
    let gaps: Vec<Duration> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.iter().all(|g| *g >= Duration::from_millis(20)), "{gaps:?}");
}

#[tokio::test]
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

#[tokio::test]
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

/// Serves the fake over HTTP on loopback and writes a kubeconfig for it.
async fn serve_over_http(fake: FakeApiserver) -> (tempfile_path::Path, tokio::task::JoinHandle<()>) {
    use axum::body::{Body as AxumBody, to_bytes};
    let app = axum::Router::new().fallback(move |request: http::Request<AxumBody>| {
        let fake = fake.clone();
        async move {
            let (parts, body) = request.into_parts();
            let bytes = to_bytes(body, 64 << 20).await.unwrap_or_default();
            let response = fake
                .handle(http::Request::from_parts(
                    parts,
                    kube::client::Body::from(bytes.to_vec()),
                ))
                .await;
            let (parts, body) = response.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            http::Response::from_parts(parts, AxumBody::from(bytes))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"http://{address}\"}}\n\
         contexts:\n- name: fake\n  context: {{cluster: fake, user: fake}}\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
    );
    (tempfile_path::write(&kubeconfig), server)
}

/// A file in the temp directory, removed on drop.
mod tempfile_path {
    pub struct Path(pub std::path::PathBuf);

    impl Drop for Path {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    pub fn write(text: &str) -> Path {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path =
            std::env::temp_dir().join(format!("crd-lifecycle-test-{}-{nanos}.yaml", std::process::id()));
        std::fs::write(&path, text).expect("write kubeconfig");
        Path(path)
    }
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

#[tokio::test]
async fn the_migrate_command_reports_and_exits_by_outcome() {
    let fake = cluster(700);
    let (kubeconfig, server) = serve_over_http(fake.clone()).await;

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
