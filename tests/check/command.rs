//! `check` and `check --fix` against the fake apiserver: the library's run, and the binary
//! over HTTP for its exit codes and outputs.

use std::sync::Mutex;
use std::time::Duration;

use crd_lifecycle::check::{self, CheckSettings, FixObserver, FixSettings, Incoming, ReadSettings, Severity};
use crd_lifecycle::migrate::{self, RetryPolicy, SettleCheck};
use serde_json::{Value, json};

use crate::apiserver::{CheckedFake, FakeApiserver};
use crate::over_http::{serve_over_http, tempfile_path};

const CRD: &str = "widgets.example.com";

fn version(name: &str, served: bool, storage: bool, schema: Value) -> Value {
    json!({"name": name, "served": served, "storage": storage, "schema": {"openAPIV3Schema": schema}})
}

fn open_schema() -> Value {
    json!({"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
}

/// A CRD as the apiserver holds it; its last change an hour ago (a managedFields time, as
/// sample 02 shows), so a migration's settle check needs one discovery answer.
fn crd(versions: Vec<Value>, stored: &[&str]) -> Value {
    let an_hour_ago = (jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1))
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD, "managedFields": [{"manager": "helm", "operation": "Update",
            "apiVersion": "apiextensions.k8s.io/v1", "time": an_hour_ago, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {}}}]},
        "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
                 "scope": "Namespaced", "versions": versions},
        "status": {"storedVersions": stored},
    })
}

/// An entry as a write through `version` by `manager` leaves it (sample 29).
fn entry(version: &str, manager: &str, time: &str) -> Value {
    json!({"apiVersion": format!("example.com/{version}"), "fieldsType": "FieldsV1",
           "fieldsV1": {"f:spec": {"f:size": {}}}, "manager": manager, "operation": "Apply", "time": time})
}

/// Flux-like: objects stored as v1beta1 (their managedFields name it: a chart applied them
/// through it), the storage version moved to v1.
fn flux_like(objects: usize) -> CheckedFake {
    let fake = CheckedFake(FakeApiserver::new());
    fake.create_crd(crd(
        vec![
            version("v1beta1", true, false, open_schema()),
            version("v1", true, true, open_schema()),
        ],
        &["v1beta1", "v1"],
    ));
    fake.add_objects(CRD, objects, 3, "v1beta1");
    for (ns, name) in fake.object_keys(CRD) {
        fake.set_managed_fields(
            CRD,
            &ns,
            &name,
            vec![entry("v1beta1", "helm", "2026-01-02T00:00:00Z")],
        );
    }
    fake
}

/// The incoming CRD with only v1 (the new release dropped v1beta1).
const INCOMING_V1: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: chart-values}
";

fn settings() -> CheckSettings {
    CheckSettings {
        read: ReadSettings {
            page_size: 7,
            max_named: 5,
            request_timeout: Duration::from_secs(10),
        },
        concurrency: 4,
        writers_window: Duration::from_secs(24 * 3600),
        replaced_managers: Vec::new(),
    }
}

fn quick_migrate() -> migrate::Settings {
    migrate::Settings {
        page_size: 7,
        retry: RetryPolicy {
            attempts: 3,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        },
        settle: SettleCheck {
            confirmations: 3,
            interval: Duration::from_millis(1),
            timeout: Duration::from_secs(5),
            ..SettleCheck::default()
        },
        ..migrate::Settings::default()
    }
}

/// Records the fix's lines.
#[derive(Default)]
struct Notes(Mutex<Vec<String>>);

impl FixObserver for Notes {
    fn migrator(&self, _crd: &str) -> Box<dyn migrate::Observer> {
        Box::new(migrate::Quiet)
    }

    fn note(&self, crd: &str, line: &str) {
        self.0.lock().expect("lock").push(format!("{crd}: {line}"));
    }
}

fn kinds(report: &check::ClusterReport) -> Vec<(Severity, &'static str)> {
    report.crds[0]
        .findings
        .iter()
        .map(|f| (f.severity, f.kind))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_flux_like_upgrade_is_rejected_then_fixed() {
    let fake = flux_like(40);
    let incoming = Incoming::parse(INCOMING_V1, "chart.yaml").expect("incoming");
    assert_eq!((incoming.crds.len(), incoming.skipped), (1, 1));
    let report = check::run(&fake.client(), None, &incoming, &settings(), None).await;
    assert_eq!(report.error, None);
    assert_eq!(report.server_version.as_deref(), Some("1.21"));
    assert_eq!(
        kinds(&report),
        [
            (Severity::Rejected, "StoredVersionMissing"),
            (Severity::Breaking, "ManagedFieldsNameDroppedVersion"),
            (Severity::Info, "VersionRemoved"),
            (Severity::Info, "ObjectsToRewrite"),
        ]
    );
    let crd = &report.crds[0];
    assert_eq!(crd.objects, Some(40));
    // The apiserver's words for v1.21, the fake's version (apiserver-samples/04).
    assert!(
        crd.findings[0].message.starts_with(
            "status.storedVersions[0]: Invalid value: \"v1beta1\": must appear in spec.versions"
        ),
        "{}",
        crd.findings[0].message
    );
    assert_eq!(crd.findings[1].objects, Some(40));
    // No object body was needed: metadata-only pages, which counted the objects too.
    let lists: Vec<_> = fake
        .object_requests()
        .into_iter()
        .filter(|r| r.method == "GET")
        .collect();
    assert!(!lists.is_empty());
    assert!(
        lists
            .iter()
            .all(|r| r.accept.contains("as=PartialObjectMetadataList")),
        "{:?}",
        lists.iter().map(|r| (&r.path, &r.accept)).collect::<Vec<_>>()
    );
    assert!(fake.crd_writes().is_empty(), "check writes nothing");

    let notes = Notes::default();
    let fix = FixSettings {
        migrate: quick_migrate(),
        observer: &notes,
    };
    let report = check::run(&fake.client(), None, &incoming, &settings(), Some(&fix)).await;
    assert_eq!(report.fixes.len(), 1);
    let fixed = &report.fixes[0];
    assert!(fixed.plan.refusals.is_empty(), "{:?}", fixed.plan.refusals);
    assert!(fixed.results.iter().all(|r| r.done), "{:?}", fixed.results);
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 40)].into());
    assert_eq!(fake.crd(CRD)["status"]["storedVersions"], json!(["v1"]));
    for (ns, name) in fake.object_keys(CRD) {
        let entries = fake.managed_fields(CRD, &ns, &name);
        assert_eq!(entries[0]["apiVersion"], "example.com/v1", "{ns}/{name}");
        assert_eq!(entries[0]["manager"], "helm");
    }
    // Checked again: nothing blocks any more.
    assert!(!report.crds[0].blocking(), "{:?}", report.crds[0].findings);
    let lines = notes.0.lock().expect("lock").clone();
    assert!(
        lines[0].starts_with("widgets.example.com: rewriting every object into v1"),
        "{lines:?}"
    );
    // The apply of the incoming CRD now passes the apiserver's rules (sample 04): v1beta1
    // removed, and server-side apply by the old manager still works (sample 29).
    fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"]
            .as_array_mut()
            .expect("versions")
            .remove(0);
    });
    let (ns, name) = fake.object_keys(CRD)[0].clone();
    let applied = fake
        .client()
        .request::<Value>(
            http::Request::patch(format!(
                "/apis/example.com/v1/namespaces/{ns}/widgets/{name}?fieldManager=helm&force=true"
            ))
            .header("content-type", "application/apply-patch+yaml")
            .body(
                serde_json::to_vec(&json!({"apiVersion": "example.com/v1", "kind": "Widget",
                                            "metadata": {"name": name}, "spec": {"size": 99}}))
                .expect("body"),
            )
            .expect("request"),
        )
        .await
        .expect("server-side apply by the old manager works");
    assert_eq!(applied["spec"]["size"], 99);
}

/// The apply of the incoming CRD as the fake answers it: a JSON Patch dropping v1beta1
/// (sample 04's request); the status code and message.
async fn apply_answer(fake: &CheckedFake) -> (u16, String) {
    let request = http::Request::patch(format!(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}"
    ))
    .header("content-type", "application/json-patch+json")
    .body(br#"[{"op": "remove", "path": "/spec/versions/0"}]"#.to_vec())
    .expect("request");
    match fake.client().request::<Value>(request).await {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(status)) => (status.code, status.message),
        Err(error) => panic!("{error}"),
    }
}

/// The JSON body of a recorded response (after its status line and headers).
fn recorded_body(text: &str) -> Value {
    let body = text
        .split_once("\n\n{")
        .map(|(_, rest)| format!("{{{rest}"))
        .expect("a recorded body");
    serde_json::from_str(&body).expect("JSON")
}

/// The fake's dry run of a CRD update answers as kube-apiserver v1.36.2 did, refused and
/// forbidden (tests/fixtures/apiserver/crd-dry-run-update-*-v1.36.txt), and writes nothing.
#[tokio::test(start_paused = true)]
async fn the_fakes_dry_run_of_a_crd_update_answers_as_recorded() {
    let recorded = [
        (
            false,
            include_str!("../fixtures/apiserver/crd-dry-run-update-rejected-v1.36.txt"),
        ),
        (
            true,
            include_str!("../fixtures/apiserver/crd-dry-run-update-forbidden-v1.36.txt"),
        ),
    ];
    for (forbidden, text) in recorded {
        let fake = flux_like(1);
        fake.lock().server_version = Some((1, 36));
        fake.lock().crd_updates_forbidden = forbidden;
        let before = fake.crd(CRD);
        let mut release = serde_json::to_value(
            Incoming::parse(INCOMING_V1, "chart.yaml").expect("incoming").crds[0]
                .crd
                .clone(),
        )
        .expect("JSON");
        release["metadata"]["resourceVersion"] = before["metadata"]["resourceVersion"].clone();
        let request = http::Request::put(format!(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD}?dryRun=All&fieldManager=crd-lifecycle-check"
        ))
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(&release).expect("body")))
        .expect("request");
        let response = fake.client().send(request).await.expect("answered");
        let code = response.status().as_u16();
        let body = response.into_body().collect_bytes().await.expect("body");
        let answer: Value = serde_json::from_slice(&body).expect("JSON");
        let recorded = recorded_body(text);
        assert_eq!(u64::from(code), recorded["code"], "forbidden: {forbidden}");
        assert_eq!(answer, recorded, "forbidden: {forbidden}");
        assert_eq!(fake.crd(CRD), before, "nothing written");
    }
}

/// Servers from 1.22 to 1.32 refuse a dropped stored version in v1.21's words (the samples'
/// README: v1.24 answers as v1.21 does; the long form came with 1.33): `check` quotes what
/// the apiserver then says, from a dry run of the update where it may update CRDs, else by
/// the server's version.
#[tokio::test(start_paused = true)]
async fn a_dropped_stored_version_is_quoted_as_the_servers_version_words_it() {
    for (server, short) in [((1, 24), true), ((1, 32), true), ((1, 36), false)] {
        for forbidden in [false, true] {
            let fake = flux_like(3);
            fake.lock().server_version = Some(server);
            fake.lock().crd_updates_forbidden = forbidden;
            let incoming = Incoming::parse(INCOMING_V1, "chart.yaml").expect("incoming");
            let report = check::run(&fake.client(), None, &incoming, &settings(), None).await;
            assert_eq!(
                report.server_version.as_deref(),
                Some(format!("{}.{}", server.0, server.1).as_str())
            );
            let missing = &report.crds[0].findings[0];
            assert_eq!(missing.kind, "StoredVersionMissing");
            let quoted = missing.message.split(" (").next().expect("words");
            assert_eq!(
                quoted.ends_with("must appear in spec.versions"),
                short,
                "{server:?}: {quoted}"
            );
            // Asked once, at the live resourceVersion, with the incoming versions; a 403 is
            // no gap in the check.
            let dry_runs = fake.crd_dry_runs();
            assert_eq!(dry_runs.len(), 1, "{server:?}");
            assert_eq!(dry_runs[0].method, "PUT");
            assert_eq!(
                dry_runs[0].body["metadata"]["resourceVersion"],
                fake.crd(CRD)["metadata"]["resourceVersion"]
            );
            assert_eq!(dry_runs[0].body["spec"]["versions"][0]["name"], "v1");
            assert!(
                report.crds[0].unchecked.is_empty(),
                "{:?}",
                report.crds[0].unchecked
            );
            assert!(fake.crd_writes().is_empty());
            let (code, message) = apply_answer(&fake).await;
            assert_eq!(code, 422);
            assert!(
                message.ends_with(quoted),
                "{server:?}: check quoted {quoted:?}, the apiserver says {message:?}"
            );
        }
    }
}

/// An hour ago, as managedFields times read.
fn an_hour_ago() -> String {
    (jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1))
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A writer through the dropped version within the window: the check breaks (exit 1), and
/// `--fix` migrates, trims and cleans all the same; the check after the fix still names the
/// writer (the cleanup rewrote its entries, it did not stop it).
#[tokio::test(start_paused = true)]
async fn a_writer_within_the_window_breaks_the_check_but_the_fix_still_migrates_and_trims() {
    let fake = flux_like(6);
    let (ns, name) = fake.object_keys(CRD)[2].clone();
    fake.set_managed_fields(
        CRD,
        &ns,
        &name,
        vec![entry("v1beta1", "legacy-controller", &an_hour_ago())],
    );
    let incoming = Incoming::parse(INCOMING_V1, "chart.yaml").expect("incoming");
    let notes = Notes::default();
    let fix = FixSettings {
        migrate: quick_migrate(),
        observer: &notes,
    };
    let report = check::run(&fake.client(), None, &incoming, &settings(), Some(&fix)).await;
    assert!(report.fixes[0].plan.refusals.is_empty(), "{:?}", report.fixes[0]);
    assert!(
        report.fixes[0].results.iter().all(|r| r.done),
        "{:?}",
        report.fixes[0].results
    );
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 6)].into());
    assert_eq!(fake.crd(CRD)["status"]["storedVersions"], json!(["v1"]));
    assert_eq!(
        fake.managed_fields(CRD, &ns, &name)[0]["apiVersion"],
        "example.com/v1",
        "cleaned"
    );
    let active = report.crds[0]
        .findings
        .iter()
        .find(|f| f.kind == "ActiveWriters")
        .expect("the writer, still named after the fix");
    assert_eq!(active.severity, Severity::Breaking);
    assert_eq!(active.managers[0].manager, "legacy-controller");
    let report = check::Report::new(1, 1, vec![report]);
    assert_eq!(report.exit_code(), 1);
    assert_eq!(report.summary.fix_failed, 0);
}

/// The same writer named as the one the release replaces: the fix succeeds and nothing
/// blocks (exit 0); the writer is reported as Info.
#[tokio::test(start_paused = true)]
async fn a_writer_the_release_replaces_lets_the_fixed_upgrade_pass() {
    let fake = flux_like(6);
    let (ns, name) = fake.object_keys(CRD)[2].clone();
    fake.set_managed_fields(
        CRD,
        &ns,
        &name,
        vec![entry("v1beta1", "widgets-operator", &an_hour_ago())],
    );
    let incoming = Incoming::parse(INCOMING_V1, "chart.yaml").expect("incoming");
    let notes = Notes::default();
    let fix = FixSettings {
        migrate: quick_migrate(),
        observer: &notes,
    };
    let settings = CheckSettings {
        replaced_managers: vec!["widgets-operator".to_owned()],
        ..settings()
    };
    let report = check::run(&fake.client(), None, &incoming, &settings, Some(&fix)).await;
    assert!(
        report.fixes[0].results.iter().all(|r| r.done),
        "{:?}",
        report.fixes[0]
    );
    assert_eq!(fake.crd(CRD)["status"]["storedVersions"], json!(["v1"]));
    assert!(!report.crds[0].blocking(), "{:?}", report.crds[0].findings);
    assert!(
        report.crds[0]
            .findings
            .iter()
            .any(|f| f.kind == "ReplacedWriters" && f.managers[0].manager == "widgets-operator"),
        "{:?}",
        report.crds[0].findings
    );
    let report = check::Report::new(1, 1, vec![report]);
    assert_eq!(report.exit_code(), 0);
}

/// v2 is stored now; the older release's CRD has only v1.
fn after_upgrade(objects: usize) -> CheckedFake {
    let fake = CheckedFake(FakeApiserver::new());
    fake.create_crd(crd(
        vec![
            version("v1", true, false, open_schema()),
            version("v2", true, true, open_schema()),
        ],
        &["v1", "v2"],
    ));
    fake.add_objects(CRD, objects, 2, "v2");
    fake
}

#[tokio::test(start_paused = true)]
async fn a_rollback_moves_the_storage_version_back_and_migrates() {
    let fake = after_upgrade(15);
    // The newer operator writes through v2 until the rollback replaces it.
    let (ns, name) = fake.object_keys(CRD)[4].clone();
    fake.set_managed_fields(CRD, &ns, &name, vec![entry("v2", "operator-v2", &an_hour_ago())]);
    let settings = || CheckSettings {
        replaced_managers: vec!["operator-v2".to_owned()],
        ..settings()
    };
    let incoming = Incoming::parse(INCOMING_V1, "old-chart.yaml").expect("incoming");
    let notes = Notes::default();
    let fix = FixSettings {
        migrate: quick_migrate(),
        observer: &notes,
    };
    // A policy governs it: refused, nothing written.
    fake.create_policy(
        json!({"apiVersion": "crdlifecycle.io/v1alpha1", "kind": "VersionPolicy",
        "metadata": {"name": "widgets"},
        "spec": {"crdName": CRD, "versions": [{"name": "v2", "store": {"at": "2026-01-01T00:00:00Z"}}]}}),
    );
    let report = check::run(&fake.client(), None, &incoming, &settings(), Some(&fix)).await;
    let refusals = &report.fixes[0].plan.refusals;
    assert!(
        refusals[0].starts_with("VersionPolicy widgets governs widgets.example.com"),
        "{refusals:?}"
    );
    assert!(fake.crd_writes().is_empty());
    fake.lock().policies.clear();

    let report = check::run(&fake.client(), None, &incoming, &settings(), None).await;
    let missing = &report.crds[0].findings[0];
    assert_eq!(
        (missing.kind, missing.version.as_deref()),
        ("StoredVersionMissing", Some("v2"))
    );
    assert!(
        missing.message.contains("which this CRD lacks"),
        "{}",
        missing.message
    );
    assert!(
        report.crds[0]
            .findings
            .iter()
            .any(|f| f.kind == "ReplacedWriters" && f.version.as_deref() == Some("v2")),
        "{:?}",
        report.crds[0].findings
    );
    // Not named: the same writer breaks the check.
    let unnamed = check::run(
        &fake.client(),
        None,
        &incoming,
        &CheckSettings {
            replaced_managers: Vec::new(),
            ..settings()
        },
        None,
    )
    .await;
    assert!(
        unnamed.crds[0]
            .findings
            .iter()
            .any(|f| f.kind == "ActiveWriters" && f.managers[0].manager == "operator-v2"),
        "{:?}",
        unnamed.crds[0].findings
    );
    let report = check::run(&fake.client(), None, &incoming, &settings(), Some(&fix)).await;
    assert!(
        report.fixes[0].results.iter().all(|r| r.done),
        "{:?}",
        report.fixes[0]
    );
    let live = fake.crd(CRD);
    assert_eq!(
        (
            live["spec"]["versions"][0]["storage"].clone(),
            live["spec"]["versions"][0]["served"].clone()
        ),
        (json!(true), json!(true))
    );
    assert_eq!(live["spec"]["versions"][1]["storage"], json!(false));
    assert_eq!(live["status"]["storedVersions"], json!(["v1"]));
    assert_eq!(fake.encodings(CRD), [("v1".to_owned(), 15)].into());
    assert!(!report.crds[0].blocking(), "{:?}", report.crds[0].findings);
    assert_eq!(check::Report::new(1, 0, vec![report.clone()]).exit_code(), 0);
    // The flip was one guarded JSON Patch (sample 03's `test` ops).
    let patch = fake
        .crd_writes()
        .into_iter()
        .find(|r| r.content_type.starts_with("application/json-patch"))
        .expect("the rollback patch");
    assert_eq!(patch.body[0]["op"], "test");
    assert_eq!(patch.body[0]["path"], "/metadata/resourceVersion");
}

#[tokio::test(start_paused = true)]
async fn a_schema_that_tightens_under_stored_objects_names_them() {
    let fake = CheckedFake(FakeApiserver::new());
    let schema = |maximum: Option<u64>| {
        let mut size = json!({"type": "integer"});
        if let Some(maximum) = maximum {
            size["maximum"] = json!(maximum);
        }
        json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {"size": size}}}})
    };
    fake.create_crd(crd(vec![version("v1", true, true, schema(None))], &["v1"]));
    // Objects with spec.size 0..29.
    fake.add_objects(CRD, 30, 3, "v1");
    let tightened = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD},
        "spec": {"group": "example.com", "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [version("v1", true, true, schema(Some(10)))]}});
    let incoming = Incoming::parse(&tightened.to_string(), "crd.json").expect("incoming");
    let notes = Notes::default();
    let fix = FixSettings {
        migrate: quick_migrate(),
        observer: &notes,
    };
    let report = check::run(&fake.client(), None, &incoming, &settings(), Some(&fix)).await;
    let invalid = &report.crds[0].findings[0];
    assert_eq!(
        (invalid.severity, invalid.kind),
        (Severity::Breaking, "ObjectsInvalid")
    );
    assert_eq!(invalid.objects, Some(19));
    assert_eq!(invalid.invalid_objects.len(), 5, "first N named");
    assert_eq!(invalid.invalid_objects[0].path, "spec.size");
    assert!(
        invalid
            .message
            .starts_with("19 of 30 objects fail this CRD's v1 schema"),
        "{}",
        invalid.message
    );
    assert!(report.fixes[0].plan.refusals[0].starts_with("objects are invalid under the incoming schema"));
    assert!(fake.crd_writes().is_empty());
    assert!(
        fake.crd_dry_runs().is_empty(),
        "no stored version is missing: no dry run"
    );
    // Bodies were needed: full pages, paged.
    let full_pages = fake
        .object_requests()
        .into_iter()
        .filter(|r| r.method == "GET" && !r.accept.contains("PartialObjectMetadata"))
        .count();
    assert_eq!(full_pages, 5, "30 objects, 7 a page");
}

fn cli(kubeconfig: &std::path::Path, files: &[&str], extra: &[&str]) -> std::process::Output {
    cli_with_env(kubeconfig, files, extra, &[])
}

fn cli_with_env(
    kubeconfig: &std::path::Path,
    files: &[&str],
    extra: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_crd-lifecycle"));
    command
        .arg("check")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("CRD_LIFECYCLE_REPLACED_MANAGERS")
        .envs(env.iter().copied());
    for file in files {
        command.args(["-f", file]);
    }
    command.args(extra).output().expect("the binary runs")
}

/// `--replaced-manager` (repeatable) and `CRD_LIFECYCLE_REPLACED_MANAGERS` (comma-separated)
/// name the writers the release replaces; an empty name is refused naming the flag (exit 2).
#[tokio::test]
async fn the_binary_takes_replaced_managers_by_flag_or_environment() {
    let fake = flux_like(4);
    let (ns, name) = fake.object_keys(CRD)[1].clone();
    fake.set_managed_fields(
        CRD,
        &ns,
        &name,
        vec![entry("v1beta1", "widgets-operator", &an_hour_ago())],
    );
    let (kubeconfig, server) = serve_over_http(FakeApiserver::clone(&fake)).await;
    let incoming = tempfile_path::write(INCOMING_V1);
    let path = incoming.0.to_str().expect("path").to_owned();
    let config = kubeconfig.0.clone();
    let run = |extra: &'static [&'static str], env: &'static [(&'static str, &'static str)]| {
        let (config, path) = (config.clone(), path.clone());
        tokio::task::spawn_blocking(move || cli_with_env(&config, &[&path], extra, env))
    };

    let output = run(&[], &[]).await.expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("\nBREAKS    widgets.example.com  ActiveWriters v1beta1 "),
        "{stdout}"
    );

    let output = run(
        &[],
        &[("CRD_LIFECYCLE_REPLACED_MANAGERS", "old-sidecar,widgets-operator")],
    )
    .await
    .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!stdout.contains("ActiveWriters"), "{stdout}");
    assert!(
        stdout.contains("\nINFO      widgets.example.com  ReplacedWriters v1beta1 "),
        "{stdout}"
    );

    let output = run(&["--fix", "--replaced-manager", "widgets-operator"], &[])
        .await
        .expect("runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("ReplacedWriters v1beta1"), "{stdout}");
    assert_eq!(fake.crd(CRD)["status"]["storedVersions"], json!(["v1"]));

    for (extra, env) in [
        (&["--replaced-manager", " "][..], &[][..]),
        (&[][..], &[("CRD_LIFECYCLE_REPLACED_MANAGERS", "a,,b")][..]),
    ] {
        let output = run(extra, env).await.expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("--replaced-manager") && stderr.contains("empty"),
            "{stderr}"
        );
    }
    server.abort();
}

/// Real time: the binary runs as a child process over a real socket.
#[tokio::test]
async fn the_binary_reports_in_every_format_and_exits_by_outcome() {
    let fake = flux_like(12);
    let (kubeconfig, server) = serve_over_http(FakeApiserver::clone(&fake)).await;
    let incoming = tempfile_path::write(INCOMING_V1);
    let path = incoming.0.to_str().expect("path").to_owned();
    let config = kubeconfig.0.clone();

    let output = tokio::task::spawn_blocking({
        let (config, path) = (config.clone(), path.clone());
        move || cli(&config, &[&path], &[])
    })
    .await
    .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    // Blocking lines first.
    let first: Vec<&str> = stdout.lines().take(2).collect();
    assert!(
        first[0].starts_with("REJECTED  widgets.example.com  StoredVersionMissing v1beta1")
            && first[0].contains("  status.storedVersions[0]: Invalid value: \"v1beta1\""),
        "{stdout}"
    );
    assert!(
        first[1].starts_with("BREAKS    widgets.example.com  ManagedFieldsNameDroppedVersion v1beta1"),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(
            "1 CRDs checked on 1 cluster (1 other documents skipped): 1 rejected, 0 breaking, 0 clean\n"
        ),
        "{stdout}"
    );

    let output = tokio::task::spawn_blocking({
        let (config, path) = (config.clone(), path.clone());
        move || cli(&config, &[&path], &["-o", "json"])
    })
    .await
    .expect("runs");
    assert_eq!(output.status.code(), Some(1));
    let json: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(json["schemaVersion"], 1);
    assert_eq!(json["summary"]["rejected"], 1);
    let crd = &json["clusters"][0]["crds"][0];
    for field in [
        "name",
        "origin",
        "live",
        "liveStorageVersion",
        "incomingStorageVersion",
        "storedVersions",
        "governedBy",
        "objects",
        "findings",
        "unchecked",
    ] {
        assert!(crd.get(field).is_some(), "{field}: {crd}");
    }
    let finding = &crd["findings"][1];
    assert_eq!(finding["kind"], "ManagedFieldsNameDroppedVersion");
    // Manager names and times as separate fields.
    assert_eq!(
        finding["managers"][0],
        json!({"manager": "helm", "version": "v1beta1", "lastWrite": "2026-01-02T00:00:00Z"})
    );
    assert_eq!(
        finding["fix"],
        json!({"action": "cleanManagedFields", "versions": ["v1beta1"]})
    );
    assert_eq!(
        crd["findings"][0]["fix"],
        json!({"action": "migrate", "into": "v1"})
    );

    let output = tokio::task::spawn_blocking({
        let (config, path) = (config.clone(), path.clone());
        move || cli(&config, &[&path], &["-o", "markdown"])
    })
    .await
    .expect("runs");
    let markdown = String::from_utf8_lossy(&output.stdout);
    assert!(
        markdown.starts_with("# crd-lifecycle check\n\n**The apiserver would refuse this upgrade.**"),
        "{markdown}"
    );
    assert!(
        markdown.contains("| `widgets.example.com` | REJECTED |"),
        "{markdown}"
    );
    assert!(
        markdown.contains("- **Rejected** StoredVersionMissing `v1beta1`: "),
        "{markdown}"
    );
    lint_markdown(&markdown);

    // --fix: progress lines per CRD on stderr (not a terminal), then clean: exit 0.
    let output = tokio::task::spawn_blocking({
        let (config, path) = (config.clone(), path.clone());
        move || cli(&config, &[&path], &["--fix"])
    })
    .await
    .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stderr.contains("check --fix widgets.example.com: rewriting every object into v1"),
        "{stderr}"
    );
    assert!(
        stdout.starts_with("FIXED  widgets.example.com  Migrate v1 "),
        "{stdout}"
    );
    assert!(
        stdout.contains("\nFIXED  widgets.example.com  CleanManagedFields v1beta1 "),
        "{stdout}"
    );
    assert_eq!(fake.crd(CRD)["status"]["storedVersions"], json!(["v1"]));

    // Several contexts, one unreachable: a section each, the summary table, exit 2.
    let text = std::fs::read_to_string(&config).expect("kubeconfig");
    let two = text.replace(
        "contexts:\n- name: fake\n  context: {cluster: fake, user: fake}\n",
        "contexts:\n- name: fake\n  context: {cluster: fake, user: fake}\n- name: gone\n  context: {cluster: gone, user: fake}\n",
    )
    .replace("clusters:\n", "clusters:\n- name: gone\n  cluster: {server: \"http://127.0.0.1:9\"}\n");
    let contexts = tempfile_path::write(&two);
    let output = tokio::task::spawn_blocking({
        let (config, path) = (contexts.0.clone(), path.clone());
        move || cli(&config, &[&path], &["--all-contexts", "--request-timeout", "5"])
    })
    .await
    .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(2), "{stdout}");
    assert!(stdout.contains("== fake (Kubernetes 1.21)"), "{stdout}");
    assert!(
        stdout.contains("== gone\nERROR  could not check this cluster: cluster unreachable"),
        "{stdout}"
    );
    assert!(
        stdout.contains("CRD                  fake  gone\nwidgets.example.com  OK    ERROR\n"),
        "{stdout}"
    );
    server.abort();
}

/// The pull-request comment passes the Markdown lint CI runs on the docs (pymarkdownlnt,
/// which .ci/run installs); where it is not installed, says so.
fn lint_markdown(markdown: &str) {
    let file = tempfile_path::write(markdown);
    let page = file.0.with_extension("md");
    std::fs::copy(&file.0, &page).expect("copy");
    let output = std::process::Command::new("python3")
        .args(["-m", "pymarkdown", "scan"])
        .arg(&page)
        .output();
    let _ = std::fs::remove_file(&page);
    match output {
        Ok(output) if String::from_utf8_lossy(&output.stderr).contains("No module named pymarkdown") => {
            eprintln!("pymarkdownlnt is not installed: the comment's Markdown lint is not checked");
        }
        Ok(output) => assert!(
            output.status.success(),
            "{}{}\n{markdown}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(error) => eprintln!("no python3 ({error}): the comment's Markdown lint is not checked"),
    }
}
