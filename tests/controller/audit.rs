//! `audit` and `adopt` against the fake apiserver, with managedFields entries shaped as
//! apiserver-samples/29 records them.

use serde_json::{Value, json};

use super::{CRD, Harness};
use crate::apiserver::ListFault;
use crd_lifecycle::audit::{self, AuditFormat, AuditSettings};

/// An entry as a write through `version` by `manager` leaves it (sample 29).
fn entry(version: &str, manager: &str, operation: &str, time: &str) -> Value {
    json!({"apiVersion": format!("example.com/{version}"), "fieldsType": "FieldsV1",
           "fieldsV1": {"f:spec": {"f:size": {}}}, "manager": manager, "operation": operation, "time": time})
}

#[tokio::test]
async fn audit_reports_each_kind_of_problem_with_objects_and_managers() {
    let h = Harness::with_example_and_objects(8);
    // v1alpha1 unserved but still listed in storedVersions; v1beta1 deprecated and served.
    h.fake.edit_crd(CRD, |crd| {
        crd["spec"]["versions"][0]["served"] = json!(false);
        crd["spec"]["versions"][0]["storage"] = json!(false);
        crd["spec"]["versions"][0]["deprecated"] = json!(true);
        crd["spec"]["versions"][1]["storage"] = json!(true);
        crd["spec"]["versions"][1]["deprecated"] = json!(true);
        crd["status"]["storedVersions"] = json!(["v1alpha1", "v1beta1"]);
    });
    let keys = h.fake.object_keys(CRD);
    for (i, (ns, name)) in keys.iter().enumerate() {
        let mut entries = vec![entry("v1beta1", "kubectl-edit", "Update", "2026-11-20T08:00:00Z")];
        if i < 3 {
            entries.push(entry("v1alpha1", "gitops", "Apply", "2026-01-02T00:00:00Z"));
        }
        h.fake.set_managed_fields(CRD, ns, name, entries);
    }
    let audits = audit::run(&h.fake.client(), &AuditSettings::default())
        .await
        .expect("audits");
    let widgets = audits.iter().find(|a| a.name == CRD).expect("audited");
    assert_eq!(widgets.objects, 8);
    assert_eq!(widgets.governed_by.as_deref(), Some("widgets"));
    assert_eq!(widgets.storage_version.as_deref(), Some("v1beta1"));
    let json: Value = serde_json::from_str(&audit::render(&audits, AuditFormat::Json)).expect("json");
    let problems = json["crds"][0]["problems"].as_array().expect("problems").clone();
    let by_kind = |kind: &str| problems.iter().find(|p| p["kind"] == kind).cloned().expect(kind);
    assert_eq!(by_kind("StaleStoredVersions")["version"], "v1alpha1");
    let unserved = by_kind("ManagedFieldsNameUnservedVersion");
    assert_eq!(
        (unserved["version"].clone(), unserved["objects"].clone()),
        (json!("v1alpha1"), json!(3))
    );
    // Each manager and its last write as separate fields.
    assert_eq!(
        unserved["managers"],
        json!([{"manager": "gitops", "lastWrite": "2026-01-02T00:00:00Z", "objects": 3}])
    );
    let writers = by_kind("WriterOnDeprecatedVersion");
    assert_eq!(writers["version"], "v1beta1");
    assert_eq!(
        writers["managers"],
        json!([{"manager": "kubectl-edit", "lastWrite": "2026-11-20T08:00:00Z", "objects": 8}])
    );
    assert!(
        writers["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("kubectl-edit (2026-11-20T08:00:00Z)")),
        "{writers}"
    );
    for field in [
        "name",
        "storageVersion",
        "storedVersions",
        "objects",
        "governedBy",
    ] {
        assert!(json["crds"][0].get(field).is_some(), "{field}");
    }
    let table = audit::render(&audits, AuditFormat::Table);
    assert!(table.starts_with("1 CRDs audited, 1 with problems\n"), "{table}");
    assert!(
        table.contains("widgets.example.com  v1beta1  v1alpha1,v1beta1  8        widgets"),
        "{table}"
    );
    // A named CRD that does not exist is an error (exit 2).
    let missing = audit::run(
        &h.fake.client(),
        &AuditSettings {
            crds: vec!["nope.example.com".into()],
            ..AuditSettings::default()
        },
    )
    .await
    .expect_err("missing");
    assert_eq!(
        missing.to_string(),
        "CustomResourceDefinition nope.example.com not found"
    );
}

#[tokio::test]
async fn a_clean_crd_has_no_problems() {
    let h = Harness::with_example_and_objects(4);
    let audits = audit::run(&h.fake.client(), &AuditSettings::default())
        .await
        .expect("audits");
    assert!(audits.iter().all(|a| a.problems.is_empty()), "{audits:?}");
    assert_eq!(
        audit::render(&audits, AuditFormat::Table),
        "1 CRDs audited, 0 with problems\n"
    );
}

/// A continue token that expires in the middle of an audit (an etcd compaction between two
/// pages) is followed with the fresh token the 410 carries (samples 27, 28): every object is
/// counted, nothing is listed twice, and the audit finds no problem (exit 0).
#[tokio::test]
async fn an_audit_follows_the_fresh_token_of_an_expired_continue_token() {
    let h = Harness::with_example_and_objects(10);
    h.fake
        .after_next_list_page(|state| state.expire_continue_tokens());
    let settings = AuditSettings {
        page_size: 3,
        ..AuditSettings::default()
    };
    let audits = audit::run(&h.fake.client(), &settings).await.expect("audits");
    let widgets = audits.iter().find(|a| a.name == CRD).expect("audited");
    assert!(widgets.problems.is_empty(), "{:?}", widgets.problems);
    assert_eq!(widgets.objects, 10);
    // Pages of 3, 3, 3 and 1, and the one request the 410 answered; only the first
    // started from the beginning.
    let lists = h.fake.metadata_lists();
    assert_eq!(lists.len(), 5, "{lists:?}");
    assert_eq!(
        lists.iter().filter(|r| !r.query.contains("continue=")).count(),
        1,
        "listed again from the start"
    );
}

/// The writes of 5,000 objects with 10 managedFields entries each fold, page by page, into
/// one record per version and manager (2 versions x 5 managers), with counts and last write
/// times: not 50,000 entries.
#[tokio::test]
async fn writes_fold_per_version_and_manager_as_pages_arrive() {
    let h = Harness::with_example_and_objects(5_000);
    for (i, (ns, name)) in h.fake.object_keys(CRD).iter().enumerate() {
        let day = 1 + i % 28;
        let entries = (0..10)
            .map(|k| {
                let version = if k % 2 == 0 { "v1alpha1" } else { "v1beta1" };
                entry(
                    version,
                    &format!("manager-{}", k / 2),
                    "Update",
                    &format!("2026-02-{day:02}T00:00:00Z"),
                )
            })
            .collect();
        h.fake.set_managed_fields(CRD, ns, name, entries);
    }
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(h.fake.crd(CRD)).expect("crd");
    let progress = std::sync::atomic::AtomicU64::new(0);
    let writes = audit::read_writes(
        &h.fake.client(),
        &crd,
        &crd_lifecycle::migrate::ListSettings::default(),
        Some(&progress),
    )
    .await
    .expect("read");
    assert_eq!(writes.objects, 5_000);
    assert_eq!(progress.load(std::sync::atomic::Ordering::Relaxed), 5_000);
    // Ten pages of 500, each folded as it arrived.
    assert_eq!(h.fake.metadata_lists().len(), 10);
    let shape: Vec<(&str, usize)> = writes
        .versions
        .iter()
        .map(|(version, through)| (version.as_str(), through.managers.len()))
        .collect();
    assert_eq!(shape, [("v1alpha1", 5), ("v1beta1", 5)]);
    for through in writes.versions.values() {
        assert_eq!(through.objects, 5_000);
        for manager in through.managers.values() {
            assert_eq!(
                *manager,
                audit::ManagerWrites {
                    objects: 5_000,
                    last_write: Some("2026-02-28T00:00:00Z".parse().expect("time")),
                }
            );
        }
    }
}

/// Adopts the live CRD part-way through a life (v1alpha1 deprecated and unserved, v1beta1
/// deprecated, v1 stored) whose `status.storedVersions` is `stored`, and applies the policy
/// printed: `plan` renders the live CRD's flags, and the controller patches no CRD, writes
/// no object, trims nothing and reports Ready.
async fn adopt_and_apply(h: &mut Harness, stored: Value) -> crd_lifecycle::adopt::Adopted {
    h.fake.edit_crd(CRD, |crd| {
        crd["metadata"]["creationTimestamp"] = json!("2025-06-01T10:00:00Z");
        crd["spec"]["versions"][0] = json!({"name": "v1alpha1", "served": false, "storage": false, "deprecated": true,
            "schema": crd["spec"]["versions"][0]["schema"].clone()});
        crd["spec"]["versions"][1]["deprecated"] = json!(true);
        crd["spec"]["versions"][1]["deprecationWarning"] = json!("example.com/v1beta1 Widget is deprecated");
        crd["spec"]["versions"][2]["served"] = json!(true);
        crd["spec"]["versions"][2]["storage"] = json!(true);
        crd["status"]["storedVersions"] = stored.clone();
    });
    let live: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(h.fake.crd(CRD)).expect("crd");
    let before = h.flags();
    let adopted = crd_lifecycle::adopt::adopt(
        &live,
        "widgets",
        "2026-11-23T00:00:00Z".parse().expect("now"),
        Some(h.fake.object_keys(CRD).len() as u64),
    );
    let text = &adopted.policy;
    let policy = crd_lifecycle::manifest::parse_policy(text, "adopted.yaml").expect("a valid policy");
    // plan: the CRD rendered now is the live one.
    let settings = crd_lifecycle::plan::PlanSettings {
        policy: String::new(),
        crd: String::new(),
        at: "2026-11-23T00:00:00Z".parse().expect("now"),
        stored_versions: serde_json::from_value(stored.clone()).expect("versions"),
        output: crd_lifecycle::plan::OutputFormat::Yaml,
    };
    let plan = crd_lifecycle::plan::Plan::new(
        &policy,
        crd_lifecycle::lifecycle::CrdState::from_crd(&live),
        &settings,
    )
    .expect("plans");
    assert!(
        plan.evaluation
            .is_satisfied_by(&crd_lifecycle::lifecycle::CrdState::from_crd(&live)),
        "{text}"
    );
    // The controller: no patch, no rewrite, no trim, Ready.
    let mut value: Value = serde_json::to_value(&policy).expect("json");
    value["metadata"]["name"] = json!("widgets");
    h.add_policy(value, "2026-11-23T00:00:00Z");
    h.at("2026-11-23T00:00:00Z");
    h.reconcile("widgets").await;
    // Time for any background run to start and work.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    h.reconcile("widgets").await;
    assert!(
        h.fake.crd_writes().is_empty(),
        "no patch: {:?}",
        h.fake.crd_writes()
    );
    let writes: Vec<String> = h
        .fake
        .object_requests()
        .iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(writes.is_empty(), "objects written: {writes:?}");
    assert_eq!(h.flags(), before);
    assert_eq!(h.stored_versions(), stored);
    assert_eq!(
        h.condition("widgets", "Ready").0,
        "True",
        "{:#}",
        h.status("widgets")
    );
    adopted
}

/// A CRD with nothing left to migrate: the adopted policy keeps the migration on (for the
/// stores to come), and applying it changes nothing.
#[tokio::test(start_paused = true)]
async fn an_adopted_policy_changes_nothing() {
    let mut h = Harness::with_example_and_objects(4);
    let adopted = adopt_and_apply(&mut h, json!(["v1"])).await;
    assert!(
        adopted.policy.contains("\n  migration: {enabled: true}\n"),
        "{}",
        adopted.policy
    );
    assert_eq!(adopted.note, None);
}

/// A CRD whose `storedVersions` still lists v1alpha1: with the migration on, applying the
/// policy would rewrite every object and trim. The policy printed has it off, and both the
/// YAML comment and the note on stderr say what turning it on does.
#[tokio::test(start_paused = true)]
async fn an_adopted_policy_of_a_stale_crd_migrates_nothing_until_asked() {
    let mut h = Harness::with_example_and_objects(4);
    let adopted = adopt_and_apply(&mut h, json!(["v1alpha1", "v1"])).await;
    let text = &adopted.policy;
    assert!(
        text.contains(
            "  # The migration is off: status.storedVersions lists v1alpha1 besides the storage\n  \
             # version v1, so with `migration: {enabled: true}` the controller would rewrite 4 objects into v1 \
             and trim status.storedVersions from [v1alpha1, v1] to [v1].\n"
        ) && text.contains("\n  migration: {enabled: false}\n"),
        "{text}"
    );
    assert!(
        text.contains("# next: remove it once a migration trims it from status.storedVersions (turn `migration` on, below)"),
        "{text}"
    );
    let note = adopted.note.expect("a note for stderr");
    assert!(note.contains("applying it changes nothing"), "{note}");
    assert!(
        note.contains("the controller would rewrite 4 objects into v1 and trim status.storedVersions from [v1alpha1, v1] to [v1]"),
        "{note}"
    );
    assert!(
        text.contains("so applying this policy changes nothing."),
        "{text}"
    );
    assert_eq!(
        h.condition("widgets", "Reconciling").1,
        "MigrationPending",
        "{:#}",
        h.status("widgets")
    );
}

/// Reconciles until the writers gate's read (a background task) has ended: while it runs,
/// the unserve waits and says it is reading the objects.
async fn reconcile_through_writers_read(h: &mut Harness, name: &str) {
    for _ in 0..500 {
        h.reconcile(name).await;
        if !h
            .condition(name, "Blocked")
            .2
            .contains("reading the objects' managedFields")
        {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the writers gate's read did not end");
}

/// The example with a writers gate of a week on v1alpha1's unserve (due on 2026-05-30) and
/// no removal (whose managedFields cleanup would list the objects too), and `objects`
/// widgets.
fn writers_gated(objects: usize, page_size: u32) -> Harness {
    let mut h = Harness::with_example_and_objects(objects);
    h.edit_policy("widgets", |p| {
        p["spec"]["versions"][0]["unserve"]["requireNoWritersFor"] = json!("7d");
        p["spec"]["versions"][0]
            .as_object_mut()
            .map(|v| v.remove("remove"));
        p["spec"]["migration"] = json!({"enabled": false, "preflight": false, "pageSize": page_size});
    });
    h
}

/// The writers gate in the controller: managedFields read from the objects hold the unserve
/// while a manager wrote through the version within the window, naming it; works with no
/// access to the apiserver's metrics. The objects are read in the background once the gate
/// is due, and the result is reused by later reconciles while it stands: here until the
/// window of the last write ends (a newer write could only hold the gate longer), then
/// read again before the unserve.
#[tokio::test(start_paused = true)]
async fn the_writers_gate_reads_managed_fields() {
    let mut h = writers_gated(6, 500);
    let keys = h.fake.object_keys(CRD);
    h.fake.set_managed_fields(
        CRD,
        &keys[0].0,
        &keys[0].1,
        vec![entry(
            "v1alpha1",
            "legacy-writer",
            "Update",
            "2026-05-28T12:00:00Z",
        )],
    );
    // Before the unserve is due, reconciles do not read the objects for the gate.
    h.at("2026-05-29T00:00:00Z");
    h.reconcile("widgets").await;
    assert!(
        h.fake.object_requests().is_empty(),
        "objects listed before the gate is due: {:?}",
        h.fake
            .object_requests()
            .iter()
            .map(|r| &r.path)
            .collect::<Vec<_>>()
    );
    // v1alpha1's unserve is due on 2026-05-30 (90 days after its deprecation).
    h.at("2026-05-31T00:00:00Z");
    reconcile_through_writers_read(&mut h, "widgets").await;
    assert_eq!(h.fake.metadata_lists().len(), 1, "one read, one page");
    let (blocked, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(
        (blocked.as_str(), reason.as_str()),
        ("True", "VersionInUse"),
        "{message}"
    );
    assert!(
        message.contains("legacy-writer (last write 2026-05-28T12:00:00Z)")
            && message.contains("satisfied at 2026-06-04T12:00:00Z"),
        "{message}"
    );
    assert!(h.flags().starts_with("v1alpha1:sd"), "{}", h.flags());
    // The reconciles its own status writes cause, and one a day later, reuse the result.
    for _ in 0..3 {
        h.reconcile("widgets").await;
    }
    h.at("2026-06-01T00:00:00Z");
    h.reconcile("widgets").await;
    assert_eq!(h.fake.metadata_lists().len(), 1, "listed again");
    assert!(h.flags().starts_with("v1alpha1:sd"), "{}", h.flags());
    // A week after the last write: read again, then unserved.
    h.at("2026-06-04T12:00:01Z");
    reconcile_through_writers_read(&mut h, "widgets").await;
    assert_eq!(h.fake.metadata_lists().len(), 2);
    assert!(h.flags().starts_with("v1alpha1:d"), "{}", h.flags());
}

/// A read under way holds the unserve, saying how far it got; once it ends with no writer
/// within the window, the next reconcile unserves the version.
#[tokio::test(start_paused = true)]
async fn the_writers_gate_holds_while_its_read_runs() {
    let mut h = writers_gated(8, 3);
    // Each list page takes a second.
    h.fake.lock().latency = std::time::Duration::from_secs(1);
    h.at("2026-05-31T00:00:00Z");
    h.reconcile("widgets").await;
    let (_, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(reason, "VersionInUse", "{message}");
    assert!(
        message.contains(
            "v1alpha1 unserve waits until no field manager has written through v1alpha1 for 168h; reading the objects' managedFields (0 objects read so far)"
        ),
        "{message}"
    );
    assert!(h.flags().starts_with("v1alpha1:sd"), "{}", h.flags());
    // One page of three in.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    h.reconcile("widgets").await;
    let message = h.condition("widgets", "Blocked").2;
    assert!(message.contains("(3 objects read so far)"), "{message}");
    assert!(h.flags().starts_with("v1alpha1:sd"), "{}", h.flags());
    // The read ends: nobody wrote through v1alpha1.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    h.reconcile("widgets").await;
    assert!(h.flags().starts_with("v1alpha1:d"), "{}", h.flags());
    assert_eq!(h.fake.metadata_lists().len(), 3, "one read of three pages");
}

/// A read that fails (here the apiserver keeps answering 503) holds the unserve and says
/// why; a minute later the next reconcile reads again.
#[tokio::test(start_paused = true)]
async fn a_failed_writers_read_holds_the_gate_and_is_tried_again() {
    let mut h = writers_gated(4, 500);
    // The test context retries a page 3 times.
    h.fake
        .lock()
        .list_faults
        .extend((0..3).map(|_| ListFault::Status {
            code: 503,
            retry_after: None,
        }));
    h.at("2026-05-31T00:00:00Z");
    reconcile_through_writers_read(&mut h, "widgets").await;
    let (_, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(reason, "VersionInUse", "{message}");
    assert!(
        message.contains("the objects' managedFields cannot be read (listing widgets.example.com through v1alpha1 failed: 503"),
        "{message}"
    );
    assert!(h.flags().starts_with("v1alpha1:sd"), "{}", h.flags());
    // Not again at once.
    h.reconcile("widgets").await;
    assert_eq!(h.fake.metadata_lists().len(), 3);
    tokio::time::sleep(std::time::Duration::from_secs(60)).await;
    reconcile_through_writers_read(&mut h, "widgets").await;
    assert_eq!(h.fake.metadata_lists().len(), 4);
    assert!(h.flags().starts_with("v1alpha1:d"), "{}", h.flags());
}

/// A continue token that expires in the middle of the writers gate's read is followed with
/// the fresh token (samples 27, 28): the writer on a page after it is found, and nothing is
/// listed from the start again.
#[tokio::test(start_paused = true)]
async fn the_writers_gate_follows_an_expired_continue_token() {
    let mut h = writers_gated(510, 500);
    let keys = h.fake.object_keys(CRD);
    let (ns, name) = keys.last().expect("objects");
    h.fake.set_managed_fields(
        CRD,
        ns,
        name,
        vec![entry("v1alpha1", "late-writer", "Update", "2026-05-30T06:00:00Z")],
    );
    h.fake
        .after_next_list_page(|state| state.expire_continue_tokens());
    h.at("2026-05-31T00:00:00Z");
    reconcile_through_writers_read(&mut h, "widgets").await;
    let (_, reason, message) = h.condition("widgets", "Blocked");
    assert_eq!(reason, "VersionInUse", "{message}");
    assert!(
        message.contains("late-writer (last write 2026-05-30T06:00:00Z)"),
        "{message}"
    );
    let lists = h.fake.metadata_lists();
    assert_eq!(lists.len(), 3, "2 pages and the expired one");
    assert_eq!(lists.iter().filter(|r| !r.query.contains("continue=")).count(), 1);
}
