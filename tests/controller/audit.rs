//! `audit` and `adopt` against the fake apiserver, with managedFields entries shaped as
//! apiserver-samples/29 records them.

use serde_json::{Value, json};

use super::{CRD, Harness};
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
    assert_eq!(unserved["managers"], json!(["gitops"]));
    let writers = by_kind("WriterOnDeprecatedVersion");
    assert_eq!(writers["version"], "v1beta1");
    assert_eq!(
        writers["managers"],
        json!(["kubectl-edit (2026-11-20T08:00:00Z)"])
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

/// The adopted policy, applied, changes nothing: `plan` renders the live CRD's flags, and
/// the controller makes no patch and reports Ready.
#[tokio::test(start_paused = true)]
async fn an_adopted_policy_changes_nothing() {
    let mut h = Harness::with_example_and_objects(4);
    // The live CRD part-way through a life: v1alpha1 deprecated and unserved, v1beta1
    // deprecated, v1 stored; nothing left to migrate.
    h.fake.edit_crd(CRD, |crd| {
        crd["metadata"]["creationTimestamp"] = json!("2025-06-01T10:00:00Z");
        crd["spec"]["versions"][0] = json!({"name": "v1alpha1", "served": false, "storage": false, "deprecated": true,
            "schema": crd["spec"]["versions"][0]["schema"].clone()});
        crd["spec"]["versions"][1]["deprecated"] = json!(true);
        crd["spec"]["versions"][1]["deprecationWarning"] = json!("example.com/v1beta1 Widget is deprecated");
        crd["spec"]["versions"][2]["served"] = json!(true);
        crd["spec"]["versions"][2]["storage"] = json!(true);
        crd["status"]["storedVersions"] = json!(["v1"]);
    });
    let live: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(h.fake.crd(CRD)).expect("crd");
    let before = h.flags();
    let text = crd_lifecycle::adopt::adopt(&live, "widgets", "2026-11-23T00:00:00Z".parse().expect("now"));
    let policy = crd_lifecycle::manifest::parse_policy(&text, "adopted.yaml").expect("a valid policy");
    // plan: the CRD rendered now is the live one.
    let settings = crd_lifecycle::plan::PlanSettings {
        policy: String::new(),
        crd: String::new(),
        at: "2026-11-23T00:00:00Z".parse().expect("now"),
        stored_versions: Some(vec!["v1".into()]),
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
    // The controller: no patch, Ready.
    let mut value: Value = serde_json::to_value(&policy).expect("json");
    value["metadata"]["name"] = json!("widgets");
    h.add_policy(value, "2026-11-23T00:00:00Z");
    h.at("2026-11-23T00:00:00Z");
    h.reconcile("widgets").await;
    assert!(
        h.fake.crd_writes().is_empty(),
        "no patch: {:?}",
        h.fake.crd_writes()
    );
    assert_eq!(h.flags(), before);
    assert_eq!(
        h.condition("widgets", "Ready").0,
        "True",
        "{:#}",
        h.status("widgets")
    );
}

/// The writers gate in the controller: managedFields read from the objects hold the unserve
/// while a manager wrote through the version within the window, naming it; works with no
/// access to the apiserver's metrics.
#[tokio::test(start_paused = true)]
async fn the_writers_gate_reads_managed_fields() {
    let mut h = Harness::with_example_and_objects(6);
    h.edit_policy("widgets", |p| {
        p["spec"]["versions"][0]["unserve"]["requireNoWritersFor"] = json!("7d");
        p["spec"]["migration"] = json!({"enabled": false, "preflight": false});
    });
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
    h.reconcile("widgets").await;
    assert!(
        !h.fake.object_requests().is_empty(),
        "the gate reads the objects once due"
    );
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
    // A week after the last write: unserved.
    h.at("2026-06-04T12:00:01Z");
    h.reconcile("widgets").await;
    assert!(h.flags().starts_with("v1alpha1:d"), "{}", h.flags());
}
