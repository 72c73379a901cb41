//! The findings and fix plans of `check`, on plain data (no cluster).

use std::time::Duration;

use crd_lifecycle::audit::{Entry, Writes};
use crd_lifecycle::check::{
    self, FixStep, Governing, Judgement, ObjectProblem, Observed, Severity, Validated,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Value, json};

const NAME: &str = "widgets.example.com";

fn open_schema() -> Value {
    json!({"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
}

fn schema(fields: &[(&str, &str)]) -> Value {
    let properties: serde_json::Map<String, Value> = fields
        .iter()
        .map(|(name, kind)| ((*name).to_owned(), json!({"type": kind})))
        .collect();
    json!({"type": "object", "properties": {"spec": {"type": "object", "properties": properties}}})
}

/// A CRD with `(name, served, storage, schema)` versions and `storedVersions`.
fn crd(versions: &[(&str, bool, bool, Value)], stored: &[&str]) -> CustomResourceDefinition {
    let versions: Vec<Value> = versions
        .iter()
        .map(|(name, served, storage, schema)| {
            json!({"name": name, "served": served, "storage": storage, "schema": {"openAPIV3Schema": schema}})
        })
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": NAME, "resourceVersion": "7"},
        "spec": {"group": "example.com", "scope": "Namespaced", "versions": versions,
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"}},
        "status": {"storedVersions": stored},
    }))
    .expect("a CRD")
}

fn judgement() -> Judgement {
    Judgement {
        now: "2026-11-25T12:00:00Z".parse().expect("now"),
        writers_window: Duration::from_secs(24 * 3600),
        server: Some((1, 36)),
        replaced_managers: Vec::new(),
    }
}

fn writes(entries: &[(&str, &str, &str)]) -> Writes {
    let mut summary = Writes::default();
    for (manager, version, time) in entries {
        summary.add(&[Entry {
            manager: (*manager).to_owned(),
            version: (*version).to_owned(),
            time: Some(time.parse().expect("time")),
        }]);
    }
    summary
}

fn kinds(check: &check::CrdCheck) -> Vec<(Severity, &'static str, String)> {
    check
        .findings
        .iter()
        .map(|f| (f.severity, f.kind, f.version.clone().unwrap_or_default()))
        .collect()
}

/// Flux-like: objects stored as v1beta1, storage moved to v1, the incoming CRD drops
/// v1beta1.
fn flux_like() -> (CustomResourceDefinition, CustomResourceDefinition) {
    let live = crd(
        &[
            ("v1beta1", true, false, open_schema()),
            ("v1", true, true, open_schema()),
        ],
        &["v1beta1", "v1"],
    );
    let incoming = crd(&[("v1", true, true, open_schema())], &[]);
    (live, incoming)
}

#[test]
fn a_dropped_stored_version_is_rejected_in_the_apiservers_words_and_migrated_by_the_fix() {
    let (live, incoming) = flux_like();
    let observed = Observed {
        live: Some(live),
        objects: Some(143),
        managed_fields: Some(writes(&[
            ("helm", "v1beta1", "2026-10-01T00:00:00Z"),
            ("helm", "v1beta1", "2026-10-02T00:00:00Z"),
            ("flux", "v1", "2026-11-25T11:00:00Z"),
        ])),
        ..Observed::default()
    };
    let result = check::check(&incoming, "chart.yaml#3", &observed, &judgement());
    assert_eq!(
        kinds(&result),
        [
            (Severity::Rejected, "StoredVersionMissing", "v1beta1".to_owned()),
            (
                Severity::Breaking,
                "ManagedFieldsNameDroppedVersion",
                "v1beta1".to_owned()
            ),
            (Severity::Info, "VersionRemoved", "v1beta1".to_owned()),
            (Severity::Info, "ObjectsToRewrite", "v1".to_owned()),
        ]
    );
    // The apiserver's own wording (kube-apiserver v1.36.2, tests/fixtures/apiserver).
    assert!(
        result.findings[0].message.starts_with(
            "status.storedVersions[0]: Invalid value: \"v1beta1\": missing from spec.versions; v1beta1 was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in v1beta1 and removes v1beta1 from status.storedVersions"
        ),
        "{}",
        result.findings[0].message
    );
    assert_eq!(
        result.findings[0].fix,
        Some(FixStep::Migrate { into: "v1".into() })
    );
    assert_eq!(result.findings[1].objects, Some(2));
    assert_eq!(result.findings[1].managers[0].manager, "helm");
    assert_eq!(
        result.findings[1].managers[0].last_write,
        Some("2026-10-02T00:00:00Z".parse().expect("time"))
    );
    assert!(
        result.findings[3]
            .message
            .contains("143 objects to rewrite into v1: time unknown")
    );
    assert!(result.blocking());
    let plan = check::plan_fix(&result, &observed);
    assert_eq!(plan.refusals, Vec::<String>::new());
    assert_eq!(
        plan.steps,
        [
            FixStep::Migrate { into: "v1".into() },
            FixStep::CleanManagedFields {
                versions: vec!["v1beta1".into()]
            }
        ]
    );
    // Kubernetes 1.21 says it differently (apiserver-samples/04).
    let old = check::check(
        &incoming,
        "chart.yaml",
        &observed,
        &Judgement {
            server: Some((1, 21)),
            ..judgement()
        },
    );
    assert!(
        old.findings[0].message.starts_with(
            "status.storedVersions[0]: Invalid value: \"v1beta1\": must appear in spec.versions ("
        ),
        "{}",
        old.findings[0].message
    );
    // Where a dry run asked the apiserver, its words, whatever its version says.
    let asked = Observed {
        dry_run: Some(vec![
            check::Cause {
                field: "spec.versions[0].name".into(),
                message: "Invalid value: \"x\": elsewhere".into(),
            },
            check::Cause {
                field: "status.storedVersions[0]".into(),
                message: "Invalid value: \"v1beta1\": must appear in spec.versions".into(),
            },
        ]),
        ..observed.clone()
    };
    let words = check::check(&incoming, "chart.yaml", &asked, &judgement());
    assert!(
        words.findings[0].message.starts_with(
            "status.storedVersions[0]: Invalid value: \"v1beta1\": must appear in spec.versions ("
        ),
        "{}",
        words.findings[0].message
    );
    // A dry run that refused nothing about it leaves the version's words.
    let accepted = Observed {
        dry_run: Some(Vec::new()),
        ..observed.clone()
    };
    let words = check::check(&incoming, "chart.yaml", &accepted, &judgement());
    assert!(
        words.findings[0].message.contains("missing from spec.versions;"),
        "{}",
        words.findings[0].message
    );
    // So do 1.22 to 1.32: the long form came with 1.33 (kubernetes/kubernetes PR 128746;
    // apiserver-samples/README: v1.24 answers as v1.21 does).
    for (server, short) in [((1, 24), true), ((1, 32), true), ((1, 33), false)] {
        let checked = check::check(
            &incoming,
            "chart.yaml",
            &observed,
            &Judgement {
                server: Some(server),
                ..judgement()
            },
        );
        assert_eq!(
            checked.findings[0]
                .message
                .contains("\"v1beta1\": must appear in spec.versions ("),
            short,
            "{server:?}: {}",
            checked.findings[0].message
        );
    }
}

/// A writer through the dropped version within the window breaks the check, but its writes
/// are stored in the storage version: `--fix` migrates, trims and cleans all the same.
#[test]
fn a_writer_within_the_window_breaks_but_the_fix_migrates_trims_and_cleans() {
    let (live, incoming) = flux_like();
    let observed = Observed {
        live: Some(live),
        objects: Some(3),
        managed_fields: Some(writes(&[
            ("legacy-controller", "v1beta1", "2026-11-25T09:30:00Z"),
            ("kubectl-edit", "v1beta1", "2026-11-01T00:00:00Z"),
        ])),
        governed_by: Some(Governing {
            name: "widgets".into(),
            suspended: false,
            rate: Some(50.0),
            migrating: false,
            conversion: None,
        }),
        ..Observed::default()
    };
    let result = check::check(&incoming, "crd.yaml", &observed, &judgement());
    let active = result
        .findings
        .iter()
        .find(|f| f.kind == "ActiveWriters")
        .expect("active writers");
    assert_eq!(active.severity, Severity::Breaking);
    assert_eq!(
        active.managers.len(),
        1,
        "only the one within 24h: {:?}",
        active.managers
    );
    assert!(
        active
            .message
            .contains("legacy-controller (last write 2026-11-25T09:30:00Z)")
            && active.message.contains("--replaced-manager"),
        "{}",
        active.message
    );
    assert_eq!(active.fix, None);
    let removed = result
        .findings
        .iter()
        .find(|f| f.kind == "VersionRemoved")
        .expect("removed");
    assert!(removed.message.contains("kubectl-edit"), "{}", removed.message);
    let rewrite = result
        .findings
        .iter()
        .find(|f| f.kind == "ObjectsToRewrite")
        .expect("rewrite");
    assert!(
        rewrite
            .message
            .contains("about 0s at the last measured migration rate (50 objects/s, VersionPolicy widgets)"),
        "{}",
        rewrite.message
    );
    let plan = check::plan_fix(&result, &observed);
    assert_eq!(plan.refusals, Vec::<String>::new());
    assert_eq!(
        plan.steps,
        [
            FixStep::Migrate { into: "v1".into() },
            FixStep::CleanManagedFields {
                versions: vec!["v1beta1".into()]
            }
        ]
    );
}

/// A writer the release replaces (`--replaced-manager`: the old operator, writing through the
/// old version until the upgrade replaces it) is no active writer: Info, not breaking.
/// Anyone else's writer still breaks the check.
#[test]
fn a_writer_the_release_replaces_does_not_break_it_anyone_elses_does() {
    let (live, incoming) = flux_like();
    let observed = Observed {
        live: Some(live),
        objects: Some(3),
        managed_fields: Some(writes(&[
            ("widgets-operator", "v1beta1", "2026-11-25T11:59:59Z"),
            ("legacy-controller", "v1beta1", "2026-11-25T09:30:00Z"),
        ])),
        ..Observed::default()
    };
    let replaced = |names: &[&str]| Judgement {
        replaced_managers: names.iter().map(|n| (*n).to_owned()).collect(),
        ..judgement()
    };
    let result = check::check(&incoming, "crd.yaml", &observed, &replaced(&["widgets-operator"]));
    let active = result
        .findings
        .iter()
        .find(|f| f.kind == "ActiveWriters")
        .expect("the other writer");
    let names: Vec<&str> = active.managers.iter().map(|m| m.manager.as_str()).collect();
    assert_eq!(names, ["legacy-controller"]);
    let replacing = result
        .findings
        .iter()
        .find(|f| f.kind == "ReplacedWriters")
        .expect("the replaced writer");
    assert_eq!(replacing.severity, Severity::Info);
    assert_eq!(replacing.version.as_deref(), Some("v1beta1"));
    let names: Vec<&str> = replacing.managers.iter().map(|m| m.manager.as_str()).collect();
    assert_eq!(names, ["widgets-operator"]);
    assert!(
        replacing
            .message
            .contains("widgets-operator (last write 2026-11-25T11:59:59Z)")
            && replacing
                .message
                .contains("repair-managed-fields widgets.example.com"),
        "{}",
        replacing.message
    );
    // Both named: nothing about writers blocks; what does is what --fix does.
    let result = check::check(
        &incoming,
        "crd.yaml",
        &observed,
        &replaced(&["widgets-operator", "legacy-controller"]),
    );
    assert!(
        result.findings.iter().all(|f| f.kind != "ActiveWriters"),
        "{:?}",
        result.findings
    );
    assert!(
        result
            .findings
            .iter()
            .filter(|f| f.severity != Severity::Info)
            .all(|f| f.fix.is_some()),
        "{:?}",
        result.findings
    );
    // After the fix (storedVersions trimmed, managedFields cleaned), its check again keeps
    // the writers the fix could not stop: only their entries were rewritten.
    let before = check::check(&incoming, "crd.yaml", &observed, &replaced(&["widgets-operator"]));
    let fixed = Observed {
        live: Some(crd(
            &[
                ("v1beta1", true, false, open_schema()),
                ("v1", true, true, open_schema()),
            ],
            &["v1"],
        )),
        objects: Some(3),
        managed_fields: Some(writes(&[
            ("widgets-operator", "v1", "2026-11-25T11:59:59Z"),
            ("legacy-controller", "v1", "2026-11-25T09:30:00Z"),
        ])),
        ..Observed::default()
    };
    let mut after = check::check(&incoming, "crd.yaml", &fixed, &replaced(&["widgets-operator"]));
    assert!(!after.blocking(), "{:?}", after.findings);
    check::keep_writers(&before, &mut after);
    assert_eq!(
        kinds(&after)
            .into_iter()
            .filter(|(_, kind, _)| kind.ends_with("Writers"))
            .collect::<Vec<_>>(),
        [
            (Severity::Breaking, "ActiveWriters", "v1beta1".to_owned()),
            (Severity::Info, "ReplacedWriters", "v1beta1".to_owned()),
        ]
    );
    assert!(after.blocking());
    assert_eq!(after.findings[0].severity, Severity::Breaking, "sorted");
    // Kept once: a second pass adds nothing.
    let kept = after.findings.len();
    check::keep_writers(&before, &mut after);
    assert_eq!(after.findings.len(), kept);
}

#[test]
fn a_rollback_moves_the_storage_version_back_unless_a_policy_governs() {
    // v2 stored now; the older release's CRD has only v1.
    let live = crd(
        &[
            ("v1", true, false, open_schema()),
            ("v2", true, true, open_schema()),
        ],
        &["v1", "v2"],
    );
    let incoming = crd(&[("v1", true, true, open_schema())], &[]);
    let mut observed = Observed {
        live: Some(live),
        objects: Some(10),
        managed_fields: Some(Writes::default()),
        ..Observed::default()
    };
    let result = check::check(&incoming, "old.yaml", &observed, &judgement());
    let missing = &result.findings[0];
    assert_eq!(
        (missing.kind, missing.version.as_deref()),
        ("StoredVersionMissing", Some("v2"))
    );
    assert!(
        missing
            .message
            .contains("objects are stored as v2, the live storage version, which this CRD lacks"),
        "{}",
        missing.message
    );
    assert_eq!(
        missing.fix,
        Some(FixStep::Rollback {
            from: "v2".into(),
            to: "v1".into()
        })
    );
    assert_eq!(
        check::plan_fix(&result, &observed).steps,
        [
            FixStep::Rollback {
                from: "v2".into(),
                to: "v1".into()
            },
            FixStep::Migrate { into: "v1".into() }
        ]
    );
    // A policy would flip it forward again: refused, saying how to suspend it.
    observed.governed_by = Some(Governing {
        name: "widgets".into(),
        suspended: false,
        rate: None,
        migrating: false,
        conversion: None,
    });
    let plan = check::plan_fix(
        &check::check(&incoming, "old.yaml", &observed, &judgement()),
        &observed,
    );
    assert!(plan.steps.is_empty());
    assert!(
        plan.refusals[0].contains("VersionPolicy widgets governs widgets.example.com")
            && plan.refusals[0].contains("\"suspend\":true"),
        "{:?}",
        plan.refusals
    );
    // Suspended: done.
    observed.governed_by.as_mut().expect("policy").suspended = true;
    let plan = check::plan_fix(
        &check::check(&incoming, "old.yaml", &observed, &judgement()),
        &observed,
    );
    assert_eq!(plan.steps.len(), 2, "{plan:?}");
}

#[test]
fn a_drop_that_needs_a_conversion_the_cluster_lacks_is_refused() {
    let live = crd(
        &[
            (
                "v1alpha1",
                true,
                false,
                schema(&[("size", "integer"), ("legacyMode", "boolean")]),
            ),
            ("v1", true, true, schema(&[("size", "integer")])),
        ],
        &["v1alpha1", "v1"],
    );
    let incoming = crd(&[("v1", true, true, schema(&[("size", "integer")]))], &[]);
    let observed = Observed {
        live: Some(live),
        objects: Some(1),
        managed_fields: Some(Writes::default()),
        ..Observed::default()
    };
    let result = check::check(&incoming, "crd.yaml", &observed, &judgement());
    let plan = check::plan_fix(&result, &observed);
    assert!(plan.steps.is_empty());
    assert!(
        plan.refusals.iter().any(
            |r| r.contains("objects stored as v1alpha1 must be rewritten into v1")
                && r.contains("spec.legacyMode")
        ),
        "{:?}",
        plan.refusals
    );
}

#[test]
fn a_storage_switch_without_conversion_names_the_pruned_fields() {
    let live = crd(
        &[
            (
                "v1",
                true,
                true,
                schema(&[("size", "integer"), ("color", "string"), ("port", "string")]),
            ),
            (
                "v2",
                true,
                false,
                schema(&[("size", "integer"), ("port", "integer")]),
            ),
        ],
        &["v1"],
    );
    let incoming = crd(
        &[
            (
                "v1",
                true,
                false,
                schema(&[("size", "integer"), ("color", "string"), ("port", "string")]),
            ),
            (
                "v2",
                true,
                true,
                schema(&[("size", "integer"), ("port", "integer")]),
            ),
        ],
        &[],
    );
    let observed = Observed {
        live: Some(live),
        objects: Some(5),
        ..Observed::default()
    };
    let result = check::check(&incoming, "crd.yaml", &observed, &judgement());
    let pruned = result
        .findings
        .iter()
        .find(|f| f.kind == "StorageSwitchPrunesFields")
        .expect("pruned");
    assert_eq!(pruned.severity, Severity::Breaking);
    assert_eq!(pruned.fields, ["spec.color", "spec.port (string → integer)"]);
    assert!(result.findings.iter().any(|f| f.kind == "StorageSwitch"));
    // The fix cannot help: the chart must add a conversion.
    let plan = check::plan_fix(&result, &observed);
    assert!(plan.refusals[0].starts_with("StorageSwitchPrunesFields cannot be fixed on the cluster"));
}

#[test]
fn invalid_crds_new_crds_and_invalid_objects() {
    // Two storage versions: the apiserver's rule (sample 05).
    let incoming = crd(
        &[
            ("v1", true, true, open_schema()),
            ("v2", true, true, open_schema()),
        ],
        &[],
    );
    let result = check::check(&incoming, "crd.yaml", &Observed::default(), &judgement());
    assert_eq!(
        kinds(&result),
        [
            (Severity::Rejected, "StorageVersionCount", String::new()),
            (Severity::Info, "NewCrd", String::new()),
        ]
    );
    assert!(!result.live);
    // A new CRD alone is clean.
    let incoming = crd(&[("v1", true, true, open_schema())], &[]);
    let result = check::check(&incoming, "crd.yaml", &Observed::default(), &judgement());
    assert!(!result.blocking());
    // Objects that fail the incoming schema: breaking, named, and the fix refuses.
    let live = crd(&[("v1", true, true, open_schema())], &["v1"]);
    let observed = Observed {
        live: Some(live),
        validated: Some(Validated {
            version: "v1".into(),
            checked: 40,
            invalid: 3,
            first: vec![ObjectProblem {
                object: "ns1/w00007".into(),
                path: "spec.replicas".into(),
                message: "Invalid value: 900: should be less than or equal to 10".into(),
            }],
        }),
        ..Observed::default()
    };
    let result = check::check(&incoming, "crd.yaml", &observed, &judgement());
    assert_eq!(
        kinds(&result),
        [(Severity::Breaking, "ObjectsInvalid", "v1".to_owned())]
    );
    assert!(
        result.findings[0]
            .message
            .starts_with("3 of 40 objects fail this CRD's v1 schema")
    );
    assert!(
        result.findings[0]
            .message
            .contains("ns1/w00007 spec.replicas: Invalid value: 900")
    );
    let plan = check::plan_fix(&result, &observed);
    assert!(plan.refusals[0].starts_with("objects are invalid under the incoming schema"));
}

#[test]
fn lost_fields_respect_open_subtrees() {
    let from = schema(&[("a", "string"), ("b", "integer")]);
    let to = json!({"type": "object", "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}});
    assert!(check::lost_without_conversion(&from, &to).is_empty());
    let to = json!({"type": "object", "properties": {}});
    assert_eq!(check::lost_without_conversion(&from, &to), ["spec"]);
    assert_eq!(check::human_duration(4000.0), "1h 06m");
    assert_eq!(check::human_duration(75.0), "1m 15s");
}

/// A StorageVersionMigration as `kubectl get -o json` shows it.
fn migration(name: &str, conditions: Value) -> crd_lifecycle::migrate::builtin::Migration {
    crd_lifecycle::migrate::builtin::Migration::from_json(&json!({
        "metadata": {"name": name, "creationTimestamp": "2026-11-25T10:00:00Z"},
        "spec": {"resource": {"group": "example.com", "resource": "widgets"}},
        "status": {"conditions": conditions},
    }))
}

/// Kubernetes trims storedVersions as a failed migration ends, with objects still stored
/// in the trimmed version (tests/fixtures/svm-failed-trims-stored-versions.txt): the
/// stored-versions rule passes, but dropping the version loses them.
#[test]
fn a_removal_after_a_failed_or_unfinished_storage_version_migration_breaks_and_is_not_fixed() {
    let live = crd(
        &[
            ("v1beta1", true, false, open_schema()),
            ("v1", true, true, open_schema()),
        ],
        &["v1"],
    );
    let incoming = crd(&[("v1", true, true, open_schema())], &[]);
    let failed = migration(
        "widgets-to-v1",
        json!([{"type": "Running", "status": "False", "reason": "MigrationCompleted"},
               {"type": "Failed", "status": "True", "message": "migration encountered unhandled error: denied"}]),
    );
    let observed = Observed {
        live: Some(live.clone()),
        objects: Some(3),
        migrations: vec![failed],
        ..Observed::default()
    };
    let result = check::check(&incoming, "chart.yaml#0", &observed, &judgement());
    let finding = result
        .findings
        .iter()
        .find(|f| f.kind == "StorageVersionMigrationHoldsRemoval")
        .unwrap_or_else(|| panic!("{:#?}", result.findings));
    assert_eq!(finding.severity, Severity::Breaking);
    assert!(
        finding
            .message
            .contains("v1beta1 disappears while StorageVersionMigration widgets-to-v1")
            && finding
                .message
                .contains("it failed (migration encountered unhandled error: denied)")
            && finding
                .message
                .contains(r#"'{"status":{"storedVersions":["v1beta1","v1"]}}'"#),
        "{}",
        finding.message
    );
    assert!(result.blocking());
    let plan = check::plan_fix(&result, &observed);
    assert!(plan.steps.is_empty(), "{plan:?}");
    assert!(
        plan.refusals
            .iter()
            .any(|r| r.contains("does not trim what Kubernetes' migrator may have trimmed early")),
        "{plan:?}"
    );

    // Succeeded, its end processed: nothing held.
    let observed = Observed {
        migrations: vec![migration(
            "widgets-to-v1",
            json!([{"type": "Running", "status": "False"}, {"type": "Succeeded", "status": "True"}]),
        )],
        ..observed
    };
    let result = check::check(&incoming, "chart.yaml#0", &observed, &judgement());
    assert!(!result.blocking(), "{:#?}", result.findings);
}

/// `check --fix` never migrates while a StorageVersionMigration of the resource runs.
#[test]
fn the_fix_waits_for_an_unfinished_storage_version_migration() {
    let (live, incoming) = flux_like();
    let observed = Observed {
        live: Some(live),
        objects: Some(3),
        managed_fields: Some(writes(&[])),
        migrations: vec![migration(
            "someone-elses",
            json!([{"type": "Running", "status": "True", "reason": "MigrationRunning"}]),
        )],
        ..Observed::default()
    };
    let result = check::check(&incoming, "chart.yaml#3", &observed, &judgement());
    let plan = check::plan_fix(&result, &observed);
    assert!(
        plan.refusals.iter().any(|r| r
            .contains("StorageVersionMigration someone-elses of widgets.example.com is unfinished")),
        "{plan:?}"
    );
}
