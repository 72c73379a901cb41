//! Every validation rule, each error naming its field path.

use crd_lifecycle::lifecycle::{self, CrdState, Schedule};
use jiff::Timestamp;

use crate::fixtures::{self, crd, crd_yaml, policy, policy_yaml, ts};

fn three_versions() -> CrdState {
    crd(&crd_yaml(&[
        ("v1alpha1", true, true),
        ("v1beta1", true, false),
        ("v1", false, false),
    ]))
}

/// The `(path, message)` of every problem the policy has against the CRD at `now`.
fn problems_at(versions: &str, crd: &CrdState, now: Timestamp) -> Vec<(String, String)> {
    fixtures::problems(&policy(&policy_yaml(versions)).spec, crd, now)
}

fn problems(versions: &str) -> Vec<(String, String)> {
    problems_at(versions, &three_versions(), ts("2026-01-01T00:00:00Z"))
}

#[track_caller]
fn assert_problem(found: &[(String, String)], path: &str, fragment: &str) {
    assert!(
        found.iter().any(|(p, m)| p == path && m.contains(fragment)),
        "expected {path}: …{fragment}… in {found:#?}"
    );
}

const V1_STORED: &str = "  - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    store: {at: \"2026-02-01T00:00:00Z\"}\n";

#[test]
fn the_example_is_valid() {
    assert_eq!(problems(V1_STORED), []);
}

#[test]
fn milestones_out_of_order() {
    let found = problems(&format!(
        "  - name: v1alpha1\n    deprecate: {{at: \"2026-03-01T00:00:00Z\"}}\n    unserve: {{at: \"2026-02-15T00:00:00Z\"}}\n{V1_STORED}"
    ));
    assert_problem(&found, "spec.versions[0].unserve", "is before deprecate");
    let found = problems(
        "  - name: v1\n    introduce: {at: \"2026-03-01T00:00:00Z\"}\n    store: {at: \"2026-02-01T00:00:00Z\"}\n",
    );
    assert_problem(&found, "spec.versions[0].store", "is before introduce");
}

#[test]
fn two_versions_stored_at_the_same_instant() {
    let found = problems(&format!(
        "  - name: v1beta1\n    store: {{at: \"2026-02-01T00:00:00Z\"}}\n{V1_STORED}"
    ));
    assert_problem(
        &found,
        "spec.versions[1].store",
        "would both become the storage version",
    );
}

#[test]
fn unserve_needs_deprecate_and_remove_needs_unserve() {
    let found = problems(&format!(
        "  - name: v1alpha1\n    unserve: {{at: \"2026-03-01T00:00:00Z\"}}\n{V1_STORED}"
    ));
    assert_problem(
        &found,
        "spec.versions[0].unserve",
        "must be deprecated before it is unserved",
    );
    let found = problems(&format!(
        "  - name: v1alpha1\n    deprecate: {{at: \"2026-03-01T00:00:00Z\"}}\n    remove: {{at: \"2026-04-01T00:00:00Z\"}}\n{V1_STORED}"
    ));
    assert_problem(
        &found,
        "spec.versions[0].remove",
        "must be unserved before it is removed",
    );
}

#[test]
fn the_storage_version_must_stay_served() {
    // v1beta1 becomes the storage version, then is unserved before v1 takes over.
    let found = problems(
        "  - name: v1beta1\n    store: {at: \"2026-01-05T00:00:00Z\"}\n    deprecate: {at: \"2026-01-06T00:00:00Z\"}\n    \
         unserve: {at: \"2026-01-10T00:00:00Z\"}\n  - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    \
         store: {at: \"2026-02-01T00:00:00Z\"}\n",
    );
    assert_problem(
        &found,
        "spec.versions[0].unserve",
        "while it is still the storage version",
    );
    assert_problem(
        &found,
        "spec.versions[0].unserve",
        "the next storage version, v1, is only stored at 2026-02-01",
    );
}

#[test]
fn the_crds_own_storage_version_must_stay_served_until_replaced() {
    // v1alpha1 is the CRD's storage version and nothing else is ever stored.
    let found = problems(
        "  - name: v1alpha1\n    deprecate: {at: \"2026-03-01T00:00:00Z\"}\n    unserve: {at: \"2026-04-01T00:00:00Z\"}\n",
    );
    assert_problem(&found, "spec.versions[0].unserve", "no later version is stored");
}

#[test]
fn the_storage_version_cannot_be_removed() {
    let found = problems(&format!(
        "  - name: v1alpha1\n    deprecate: {{at: \"2026-01-02T00:00:00Z\"}}\n    unserve: {{at: \"2026-01-03T00:00:00Z\"}}\n    \
         remove: {{at: \"2026-01-04T00:00:00Z\"}}\n{V1_STORED}"
    ));
    assert_problem(
        &found,
        "spec.versions[0].unserve",
        "while it is still the storage version",
    );
    assert_problem(
        &found,
        "spec.versions[0].remove",
        "while it is still the storage version",
    );
}

#[test]
fn the_storage_version_cannot_wait_for_its_introduction() {
    let found = problems("  - name: v1alpha1\n    introduce: {at: \"2026-03-01T00:00:00Z\"}\n");
    assert_problem(
        &found,
        "spec.versions[0].introduce",
        "would not be served until it is introduced",
    );
}

#[test]
fn some_version_must_always_be_served() {
    // The storage version (not governed) is not served by the CRD itself; v1 is the only
    // served one and the policy unserves it.
    let crd = crd(&crd_yaml(&[("v1alpha1", false, true), ("v1", true, false)]));
    let found = problems_at(
        "  - name: v1\n    deprecate: {at: \"2026-03-01T00:00:00Z\"}\n    unserve: {at: \"2026-04-01T00:00:00Z\"}\n",
        &crd,
        ts("2026-01-01T00:00:00Z"),
    );
    assert_problem(
        &found,
        "spec.versions[0].unserve",
        "no version of widgets.example.com would be served at 2026-04-01",
    );
}

#[test]
fn governed_versions_must_exist_unless_already_removed() {
    let removed_v0 = "  - name: v0\n    deprecate: {at: \"2025-01-01T00:00:00Z\"}\n    unserve: {after: 1d}\n    remove: {after: 1d}\n";
    assert_eq!(
        problems(&format!("{removed_v0}{V1_STORED}")),
        [],
        "v0's removal is due: its absence is fine"
    );
    let found = problems_at(
        &format!("{removed_v0}{V1_STORED}"),
        &three_versions(),
        ts("2025-01-02T12:00:00Z"),
    );
    assert_problem(
        &found,
        "spec.versions[0].name",
        "version v0 is not in CRD widgets.example.com",
    );
    let found = problems(&format!(
        "  - name: v2\n    introduce: {{at: \"2026-05-01T00:00:00Z\"}}\n{V1_STORED}"
    ));
    assert_problem(
        &found,
        "spec.versions[0].name",
        "its versions: v1alpha1, v1beta1, v1",
    );
}

#[test]
fn after_needs_an_earlier_milestone() {
    let found = problems(&format!(
        "  - name: v1beta1\n    deprecate: {{after: 30d}}\n{V1_STORED}"
    ));
    assert_problem(
        &found,
        "spec.versions[0].deprecate.after",
        "deprecate is its first",
    );
}

#[test]
fn after_counts_from_the_previous_milestone_that_is_set() {
    let policy = policy(&policy_yaml(
        "  - name: v1alpha1\n    deprecate: {at: \"2026-03-01T00:00:00Z\"}\n    unserve: {after: 1d12h}\n    remove: {after: 90m}\n\
         \x20 - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    store: {after: 30s}\n",
    ));
    let schedule = Schedule::new(&policy.spec, &three_versions(), ts("2026-01-01T00:00:00Z")).expect("valid");
    let timeline: Vec<String> = schedule.transitions().iter().map(|t| t.to_string()).collect();
    assert_eq!(
        timeline,
        [
            "v1 introduce 2026-01-15T00:00:00Z",
            "v1 store 2026-01-15T00:00:30Z",
            "v1alpha1 deprecate 2026-03-01T00:00:00Z",
            "v1alpha1 unserve 2026-03-02T12:00:00Z",
            "v1alpha1 remove 2026-03-02T13:30:00Z",
        ]
    );
}

#[test]
fn unparsable_instants_and_durations() {
    let found = problems(&format!(
        "  - name: v1alpha1\n    deprecate: {{at: \"March 1st\"}}\n    unserve: {{after: 3d}}\n{V1_STORED}"
    ));
    assert_problem(
        &found,
        "spec.versions[0].deprecate.at",
        "invalid RFC 3339 instant \"March 1st\"",
    );
    // The unserve counts from a broken deprecate: reported once, at the deprecate.
    assert_eq!(found.len(), 1, "{found:#?}");
    let found = problems(&format!(
        "  - name: v1alpha1\n    deprecate: {{at: \"2026-03-01T00:00:00Z\"}}\n    unserve: {{after: 3w}}\n{V1_STORED}"
    ));
    assert_problem(
        &found,
        "spec.versions[0].unserve.after",
        "invalid duration \"3w\"",
    );
}

#[test]
fn exactly_one_of_at_and_after() {
    let found = problems(&format!(
        "  - name: v1alpha1\n    deprecate: {{at: \"2026-03-01T00:00:00Z\", after: 1d}}\n    unserve: {{}}\n{V1_STORED}"
    ));
    assert_problem(&found, "spec.versions[0].deprecate", "not both");
    assert_problem(
        &found,
        "spec.versions[0].unserve",
        "exactly one of `at` or `after` must be set",
    );
}

#[test]
fn warnings_names_and_lists() {
    let long = "w".repeat(257);
    let found = problems(&format!(
        "  - name: v1alpha1\n    deprecate: {{at: \"2026-03-01T00:00:00Z\", warning: \"{long}\"}}\n  - name: V1\n  - name: v1alpha1\n"
    ));
    assert_problem(&found, "spec.versions[0].deprecate.warning", "is 257 bytes long");
    assert_problem(&found, "spec.versions[1].name", "is not a version name");
    assert_problem(
        &found,
        "spec.versions[2].name",
        "listed twice (also spec.versions[0])",
    );
    let empty = policy(
        "apiVersion: crdlifecycle.io/v1alpha1\nkind: VersionPolicy\nmetadata: {name: x}\nspec: {crdName: widgets, versions: []}\n",
    );
    let Err(lifecycle::Error::InvalidPolicy(errors)) =
        Schedule::new(&empty.spec, &three_versions(), ts("2026-01-01T00:00:00Z"))
    else {
        panic!("empty policy accepted")
    };
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["spec.crdName", "spec.versions"]);
}

#[test]
fn every_problem_is_reported_together() {
    let found = problems(
        "  - name: v1alpha1\n    unserve: {at: \"2026-03-01T00:00:00Z\"}\n  - name: v9\n    store: {at: \"2026-02-01T00:00:00Z\"}\n\
         \x20 - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    store: {at: \"2026-02-01T00:00:00Z\"}\n    remove: {after: soon}\n",
    );
    assert_problem(&found, "spec.versions[0].unserve", "must be deprecated");
    assert_problem(&found, "spec.versions[1].name", "version v9 is not in CRD");
    assert_problem(
        &found,
        "spec.versions[2].store",
        "would both become the storage version",
    );
    assert_problem(
        &found,
        "spec.versions[2].remove.after",
        "invalid duration \"soon\"",
    );
    assert_problem(
        &found,
        "spec.versions[2].remove",
        "must be unserved before it is removed",
    );
}

#[test]
fn a_live_crd_already_switched_by_the_policy_is_valid() {
    // The policy already made v1 the storage version; before its introduction v1 was not
    // the storage version, so its `introduce` is no problem.
    let switched = crd(&crd_yaml(&[
        ("v1alpha1", true, false),
        ("v1beta1", true, false),
        ("v1", true, true),
    ]));
    assert_eq!(problems_at(V1_STORED, &switched, ts("2026-03-01T00:00:00Z")), []);
    // But the CRD's original storage version, not stored by the policy, still counts.
    let found = problems_at(
        "  - name: v1alpha1\n    deprecate: {at: \"2026-01-02T00:00:00Z\"}\n    unserve: {at: \"2026-01-03T00:00:00Z\"}\n",
        &three_versions(),
        ts("2026-03-01T00:00:00Z"),
    );
    assert_problem(
        &found,
        "spec.versions[0].unserve",
        "while it is still the storage version",
    );
}

/// Found by the simulation (tests/simulation): once the example's last removal landed, the
/// CRD has v1 alone, and v1 is introduced after the first store. The versions the policy
/// removed were served before v1 was: the policy stays valid (it used to turn
/// `InvalidPolicy` at the next reconcile, "no version would be served").
#[test]
fn a_policy_stays_valid_after_its_removals_landed() {
    let example = policy(include_str!("../../examples/widgets/policy.yaml"));
    let only_v1 = crd(&crd_yaml(&[("v1", true, true)]));
    let after_everything = ts("2026-09-01T00:00:00Z");
    let found = fixtures::problems(&example.spec, &only_v1, after_everything);
    assert_eq!(
        found,
        [],
        "the example's policy against its CRD after its last removal"
    );
    // Before a version's removal is due, its absence from the CRD is still a problem.
    let found = fixtures::problems(&example.spec, &only_v1, ts("2026-06-01T00:00:00Z"));
    assert_problem(&found, "spec.versions[0].name", "its removal is not due");
}
