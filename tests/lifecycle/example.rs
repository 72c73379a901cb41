//! The bundled example (`examples/widgets/`) at instants before, at and after every milestone.

use crd_lifecycle::api::{MilestoneKind, VersionPhase};
use crd_lifecycle::lifecycle::{self, BlockReason, CompletedMigration, CrdState};
use crd_lifecycle::plan::{OutputFormat, Plan, PlanSettings};
use jiff::{SignedDuration, Timestamp};

use crate::fixtures::{EXAMPLE_CRD, EXAMPLE_POLICY, crd, flags, policy, ts};

fn plan_at(at: Timestamp, stored_versions: Option<&[&str]>) -> Plan {
    let args = PlanSettings {
        policy: "policy.yaml".into(),
        crd: "crd.yaml".into(),
        at,
        output: OutputFormat::Yaml,
        stored_versions: stored_versions.map(|s| s.iter().map(|v| (*v).to_owned()).collect()),
    };
    Plan::new(&policy(EXAMPLE_POLICY), crd(EXAMPLE_CRD), &args).unwrap_or_else(|e| panic!("{e}"))
}

/// (milestone instant, state just before it, state from it on). State strings: see
/// `fixtures::flags` (`s` served, `S` storage, `d` deprecated).
const TIMELINE: &[(&str, &str, &str)] = &[
    (
        "2026-01-05T00:00:00Z",
        "v1alpha1:sS v1beta1:s v1:-",
        "v1alpha1:s v1beta1:sS v1:-",
    ),
    (
        "2026-01-15T00:00:00Z",
        "v1alpha1:s v1beta1:sS v1:-",
        "v1alpha1:s v1beta1:sS v1:s",
    ),
    (
        "2026-02-01T00:00:00Z",
        "v1alpha1:s v1beta1:sS v1:s",
        "v1alpha1:s v1beta1:s v1:sS",
    ),
    (
        "2026-03-01T00:00:00Z",
        "v1alpha1:s v1beta1:s v1:sS",
        "v1alpha1:sd v1beta1:s v1:sS",
    ),
    (
        "2026-04-01T00:00:00Z",
        "v1alpha1:sd v1beta1:s v1:sS",
        "v1alpha1:sd v1beta1:sd v1:sS",
    ),
    (
        "2026-05-30T00:00:00Z",
        "v1alpha1:sd v1beta1:sd v1:sS",
        "v1alpha1:d v1beta1:sd v1:sS",
    ),
    (
        "2026-06-29T00:00:00Z",
        "v1alpha1:d v1beta1:sd v1:sS",
        "v1beta1:sd v1:sS",
    ),
    ("2026-07-30T00:00:00Z", "v1beta1:sd v1:sS", "v1beta1:d v1:sS"),
    ("2026-08-29T00:00:00Z", "v1beta1:d v1:sS", "v1:sS"),
];

#[test]
fn flags_before_at_and_after_every_milestone() {
    for (instant, before, from) in TIMELINE {
        let at = ts(instant);
        let just_before = at - SignedDuration::from_secs(1);
        assert_eq!(
            flags(&plan_at(just_before, None).evaluation),
            *before,
            "1s before {instant}"
        );
        assert_eq!(flags(&plan_at(at, None).evaluation), *from, "at {instant}");
        assert_eq!(
            flags(&plan_at(at + SignedDuration::from_hours(1), None).evaluation),
            *from,
            "1h after {instant}"
        );
    }
    assert_eq!(
        flags(&plan_at(ts("2025-06-01T00:00:00Z"), None).evaluation),
        "v1alpha1:sS v1beta1:s v1:-"
    );
    assert_eq!(
        flags(&plan_at(ts("2030-01-01T00:00:00Z"), None).evaluation),
        "v1:sS"
    );
}

#[test]
fn timeline_resolves_after_durations() {
    let plan = plan_at(ts("2026-01-01T00:00:00Z"), None);
    let timeline: Vec<String> = plan.evaluation.timeline.iter().map(|t| t.to_string()).collect();
    assert_eq!(
        timeline,
        [
            "v1beta1 store 2026-01-05T00:00:00Z",
            "v1 introduce 2026-01-15T00:00:00Z",
            "v1 store 2026-02-01T00:00:00Z",
            "v1alpha1 deprecate 2026-03-01T00:00:00Z",
            "v1beta1 deprecate 2026-04-01T00:00:00Z",
            "v1alpha1 unserve 2026-05-30T00:00:00Z",
            "v1alpha1 remove 2026-06-29T00:00:00Z",
            "v1beta1 unserve 2026-07-30T00:00:00Z",
            "v1beta1 remove 2026-08-29T00:00:00Z",
        ]
    );
}

#[test]
fn next_transition_is_the_first_one_after_the_instant() {
    for (i, (instant, _, _)) in TIMELINE.iter().enumerate() {
        let plan = plan_at(ts(instant), None);
        let next = plan.evaluation.next_transition().map(|t| t.at.to_string());
        assert_eq!(next.as_deref(), TIMELINE.get(i + 1).map(|t| t.0), "at {instant}");
        let before = plan_at(ts(instant) - SignedDuration::from_secs(1), None);
        assert_eq!(
            before.evaluation.next_transition().map(|t| t.at),
            Some(ts(instant))
        );
    }
}

#[test]
fn deprecation_warnings_follow_deprecation() {
    let before = plan_at(ts("2026-02-28T00:00:00Z"), None);
    assert_eq!(
        before
            .evaluation
            .version("v1alpha1")
            .and_then(|v| v.deprecation_warning.clone()),
        None
    );
    let after = plan_at(ts("2026-03-02T00:00:00Z"), None);
    let v1alpha1 = after.evaluation.version("v1alpha1").expect("present");
    assert_eq!(
        v1alpha1.deprecation_warning.as_deref(),
        Some("example.com/v1alpha1 Widget is deprecated; use example.com/v1")
    );
    assert_eq!(v1alpha1.phase, VersionPhase::Deprecated);
}

#[test]
fn phases_along_the_way() {
    let phases = |at: &str| -> Vec<VersionPhase> {
        plan_at(ts(at), None)
            .evaluation
            .versions
            .iter()
            .map(|v| v.phase)
            .collect()
    };
    use VersionPhase::*;
    assert_eq!(phases("2026-01-01T00:00:00Z"), [Stored, Served, Pending]);
    assert_eq!(phases("2026-01-20T00:00:00Z"), [Served, Stored, Served]);
    assert_eq!(phases("2026-06-01T00:00:00Z"), [Unserved, Deprecated, Stored]);
    assert_eq!(phases("2026-07-01T00:00:00Z"), [Removed, Deprecated, Stored]);
}

#[test]
fn removal_is_held_while_the_version_is_in_stored_versions() {
    let at = ts("2026-07-01T00:00:00Z");
    let plan = plan_at(at, Some(&["v1alpha1", "v1"]));
    assert_eq!(
        flags(&plan.evaluation),
        "v1alpha1:d v1beta1:sd v1:sS",
        "v1alpha1 stays, unserved"
    );
    let blocked = &plan.evaluation.blocked;
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(blocked[0].reason, BlockReason::AwaitingMigration);
    assert_eq!(blocked[0].version, "v1alpha1");
    assert_eq!(blocked[0].milestone, Some(MilestoneKind::Remove));
    assert!(
        blocked[0]
            .message
            .contains("status.storedVersions still lists it"),
        "{}",
        blocked[0].message
    );
    let need = plan.evaluation.migration.as_ref().expect("migration needed");
    assert_eq!(need.storage_version, "v1");
    assert_eq!(need.stale_versions, ["v1alpha1"]);
}

#[test]
fn a_completed_migration_is_mentioned_while_the_trim_is_pending() {
    let policy = policy(EXAMPLE_POLICY);
    let crd = CrdState {
        stored_versions: vec!["v1alpha1".into(), "v1".into()],
        ..crd(EXAMPLE_CRD)
    };
    let migrations = [CompletedMigration {
        storage_version: "v1".into(),
        finished_at: ts("2026-06-30T00:00:00Z"),
    }];
    let evaluation =
        lifecycle::evaluate(&policy.spec, &crd, &migrations, ts("2026-07-01T00:00:00Z")).expect("valid");
    let message = &evaluation.blocked[0].message;
    assert!(
        message.contains("a migration to v1 finished at 2026-06-30T00:00:00Z"),
        "{message}"
    );
}

#[test]
fn pending_transitions_name_what_applying_will_do() {
    // The CRD as the example ships it, evaluated after v1 is introduced and stored.
    let crd = crd(EXAMPLE_CRD);
    let evaluation = lifecycle::evaluate(
        &policy(EXAMPLE_POLICY).spec,
        &crd,
        &[],
        ts("2026-02-10T00:00:00Z"),
    )
    .expect("valid");
    let pending: Vec<String> = evaluation
        .pending_transitions(&crd)
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(
        pending,
        [
            "v1 introduce 2026-01-15T00:00:00Z",
            "v1 store 2026-02-01T00:00:00Z"
        ]
    );
    assert!(!evaluation.is_satisfied_by(&crd));
}

#[test]
fn rendered_yaml_is_a_manifest_with_the_flags_and_is_stable() {
    let at = ts("2026-07-01T00:00:00Z");
    let plan = plan_at(at, None);
    let (_, value) = crd_lifecycle::manifest::parse_crd(EXAMPLE_CRD, "crd.yaml").expect("example CRD");
    let rendered = lifecycle::as_manifest(lifecycle::render_crd(&value, &plan.evaluation));
    let yaml = serde_saphyr::to_string(&rendered).expect("yaml");
    let reread = crd(&yaml);
    assert_eq!(reread.version_names(), "v1beta1, v1");
    assert!(
        reread
            .version("v1")
            .is_some_and(|v| v.served && v.storage && !v.deprecated)
    );
    let v1beta1 = reread.version("v1beta1").expect("v1beta1");
    assert!(v1beta1.served && v1beta1.deprecated && !v1beta1.storage);
    // The schema and everything else is carried over untouched.
    assert_eq!(
        rendered.pointer("/spec/versions/1/schema"),
        value.pointer("/spec/versions/2/schema")
    );
    // Rendering the rendered manifest again changes nothing.
    let again = lifecycle::as_manifest(lifecycle::render_crd(&rendered, &plan.evaluation));
    assert_eq!(again, rendered);
}

#[test]
fn ungoverned_versions_keep_their_flags_but_lose_storage() {
    let crd = crd(&crate::fixtures::crd_yaml(&[
        ("v1alpha1", true, true),
        ("v1beta1", false, false),
        ("v1", true, false),
    ]));
    let policy = policy(&crate::fixtures::policy_yaml(
        "  - name: v1\n    store: {at: \"2026-02-01T00:00:00Z\"}\n",
    ));
    let before = crate::fixtures::evaluate(&policy, &crd, ts("2026-01-01T00:00:00Z")).expect("valid");
    assert_eq!(flags(&before), "v1alpha1:sS v1beta1:- v1:s");
    let after = crate::fixtures::evaluate(&policy, &crd, ts("2026-02-01T00:00:00Z")).expect("valid");
    assert_eq!(flags(&after), "v1alpha1:s v1beta1:- v1:sS");
    assert!(
        after
            .versions
            .iter()
            .filter(|v| v.name != "v1")
            .all(|v| !v.governed)
    );
}

#[test]
fn drifted_flags_are_put_back() {
    // Someone re-applied an old CRD: v1alpha1 is served and stored again, v1 unserved.
    let drifted = crd(&crate::fixtures::crd_yaml(&[
        ("v1alpha1", true, true),
        ("v1beta1", true, false),
        ("v1", false, false),
    ]));
    let evaluation = lifecycle::evaluate(
        &policy(EXAMPLE_POLICY).spec,
        &drifted,
        &[],
        ts("2026-06-01T00:00:00Z"),
    )
    .expect("valid");
    assert_eq!(flags(&evaluation), "v1alpha1:d v1beta1:sd v1:sS");
    assert!(!evaluation.is_satisfied_by(&drifted));
}

#[test]
fn a_crd_without_a_storage_version_is_left_alone_as_unsafe() {
    let crd = crd(&crate::fixtures::crd_yaml(&[
        ("v1alpha1", true, false),
        ("v1", true, false),
    ]));
    let policy = policy(&crate::fixtures::policy_yaml(
        "  - name: v1alpha1\n    deprecate: {at: \"2026-01-01T00:00:00Z\"}\n  - name: v1\n    store: {at: \"2026-02-01T00:00:00Z\"}\n",
    ));
    let evaluation = crate::fixtures::evaluate(&policy, &crd, ts("2026-01-10T00:00:00Z")).expect("valid");
    assert_eq!(flags(&evaluation), "v1alpha1:s v1:s", "nothing changes");
    assert_eq!(evaluation.blocked.len(), 1);
    assert_eq!(evaluation.blocked[0].reason, BlockReason::UnsafeState);
    assert!(
        evaluation.blocked[0].message.contains("0 storage versions"),
        "{}",
        evaluation.blocked[0].message
    );
    // Once the policy's own store is due the CRD gets exactly one storage version.
    let later = crate::fixtures::evaluate(&policy, &crd, ts("2026-02-10T00:00:00Z")).expect("valid");
    assert_eq!(flags(&later), "v1alpha1:sd v1:sS");
    assert!(later.blocked.is_empty());
}
