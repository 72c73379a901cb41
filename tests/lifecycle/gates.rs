//! Gates hold due transitions back until their condition holds, then let them proceed.

use crate::fixtures::{crd, crd_yaml, flags, policy, policy_yaml, ts};
use crd_lifecycle::api::MilestoneKind;
use crd_lifecycle::lifecycle::{
    BlockReason, CrdState, GateInputs, PreflightPass, PreflightResult, Schedule, TrafficObservation,
    WritersRead,
};

fn three_versions() -> CrdState {
    crd(&crd_yaml(&[
        ("v1alpha1", true, true),
        ("v1beta1", true, false),
        ("v1", false, false),
    ]))
}

fn schedule(versions: &str, crd: &CrdState) -> Schedule {
    let mut text = policy_yaml(versions);
    text.push_str("  migration: {enabled: false}\n");
    Schedule::new(&policy(&text).spec, crd, ts("2026-01-01T00:00:00Z")).unwrap_or_else(|e| panic!("{e}"))
}

fn approved(pairs: &[(&str, MilestoneKind)]) -> GateInputs {
    GateInputs {
        approvals: pairs.iter().map(|(v, k)| ((*v).to_owned(), *k)).collect(),
        ..GateInputs::default()
    }
}

const APPROVED_STORE: &str = "  - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    \
     store: {at: \"2026-02-01T00:00:00Z\", approval: Required}\n\
     \x20 - name: v1alpha1\n    deprecate: {at: \"2026-03-01T00:00:00Z\"}\n    unserve: {at: \"2026-04-01T00:00:00Z\"}\n";

#[test]
fn an_approval_gate_holds_the_milestone_and_what_depends_on_it() {
    let crd = three_versions();
    let schedule = schedule(APPROVED_STORE, &crd);
    let at = ts("2026-04-15T00:00:00Z");
    let evaluation = schedule.evaluate_with_gates(&crd, &[], &GateInputs::default(), at);
    // v1 is introduced but not stored; v1alpha1 stays the storage version, so its
    // unserve waits too (deprecation has no reason to wait).
    assert_eq!(flags(&evaluation), "v1alpha1:sSd v1beta1:s v1:s");
    let blocked: Vec<(BlockReason, &str, Option<MilestoneKind>)> = evaluation
        .blocked
        .iter()
        .map(|b| (b.reason, b.version.as_str(), b.milestone))
        .collect();
    assert_eq!(
        blocked,
        [
            (BlockReason::AwaitingApproval, "v1", Some(MilestoneKind::Store)),
            (
                BlockReason::AwaitingApproval,
                "v1alpha1",
                Some(MilestoneKind::Unserve)
            ),
        ]
    );
    assert!(
        evaluation.blocked[0]
            .message
            .contains("crdlifecycle.io/approve=v1.store"),
        "{}",
        evaluation.blocked[0].message
    );
    assert!(
        evaluation.blocked[1]
            .message
            .contains("stays the storage version while v1 store waits (v1 store is held)")
    );

    // Approved: everything due happens.
    let evaluation = schedule.evaluate_with_gates(&crd, &[], &approved(&[("v1", MilestoneKind::Store)]), at);
    assert_eq!(flags(&evaluation), "v1alpha1:d v1beta1:s v1:sS");
    assert!(evaluation.blocked.is_empty(), "{:?}", evaluation.blocked);
}

#[test]
fn gates_are_not_checked_again_once_applied() {
    let crd = three_versions();
    let schedule = schedule(APPROVED_STORE, &crd);
    let at = ts("2026-02-15T00:00:00Z");
    // The CRD already shows v1 as the storage version (applied earlier, approval since
    // withdrawn): nothing is rolled back.
    let stored = crd_lifecycle::lifecycle::CrdState {
        versions: crd
            .versions
            .iter()
            .cloned()
            .map(|mut v| {
                v.storage = v.name == "v1";
                v.served = true;
                v
            })
            .collect(),
        ..crd.clone()
    };
    let evaluation = schedule.evaluate_with_gates(&stored, &[], &GateInputs::default(), at);
    assert_eq!(flags(&evaluation), "v1alpha1:s v1beta1:s v1:sS");
    assert!(evaluation.blocked.is_empty());
    // Recorded in history: not gated either.
    let gates = GateInputs {
        applied: [("v1".to_owned(), MilestoneKind::Store)].into(),
        ..GateInputs::default()
    };
    let evaluation = schedule.evaluate_with_gates(&crd, &[], &gates, at);
    assert_eq!(
        flags(&evaluation),
        "v1alpha1:s v1beta1:s v1:sS",
        "drift corrected without a new approval"
    );
}

const TRAFFIC_GATED: &str = "  - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    store: {at: \"2026-02-01T00:00:00Z\"}\n\
     \x20 - name: v1beta1\n    deprecate: {at: \"2026-03-01T00:00:00Z\"}\n    \
     unserve: {at: \"2026-04-01T00:00:00Z\", requireNoTrafficFor: 24h}\n    remove: {after: 1d}\n";

#[test]
fn a_traffic_gate_waits_for_a_quiet_window() {
    let crd = three_versions();
    let schedule = schedule(TRAFFIC_GATED, &crd);
    let at = ts("2026-04-01T06:00:00Z");
    let watching = |since: &str, last: Option<&str>| GateInputs {
        traffic: [(
            "v1beta1".to_owned(),
            TrafficObservation {
                watching_since: ts(since),
                last_request: last.map(ts),
            },
        )]
        .into(),
        ..GateInputs::default()
    };

    // Not observed at all yet.
    let evaluation = schedule.evaluate_with_gates(&crd, &[], &GateInputs::default(), at);
    assert_eq!(evaluation.blocked[0].reason, BlockReason::VersionInUse);
    assert!(evaluation.version("v1beta1").is_some_and(|v| v.served));

    // A request three hours ago: the window ends 21 hours from now.
    let gates = watching("2026-03-01T00:00:00Z", Some("2026-04-01T03:00:00Z"));
    let evaluation = schedule.evaluate_with_gates(&crd, &[], &gates, at);
    assert_eq!(evaluation.blocked[0].reason, BlockReason::VersionInUse);
    let message = &evaluation.blocked[0].message;
    assert!(
        message.contains("last request seen at 2026-04-01T03:00:00Z"),
        "{message}"
    );
    assert!(message.contains("satisfied at 2026-04-02T03:00:00Z"), "{message}");
    assert_eq!(evaluation.wake_at, Some(ts("2026-04-02T03:00:00Z")));
    // The removal after it waits too.
    let later = schedule.evaluate_with_gates(&crd, &[], &gates, ts("2026-04-02T01:00:00Z"));
    assert!(later.version("v1beta1").is_some_and(|v| v.present && v.served));

    // Watching for less than the window, no request: still waiting.
    let gates = watching("2026-04-01T00:00:00Z", None);
    let evaluation = schedule.evaluate_with_gates(&crd, &[], &gates, at);
    assert_eq!(evaluation.wake_at, Some(ts("2026-04-02T00:00:00Z")));

    // Quiet for a whole day: it proceeds.
    let gates = watching("2026-03-01T00:00:00Z", Some("2026-03-31T05:00:00Z"));
    let evaluation = schedule.evaluate_with_gates(&crd, &[], &gates, at);
    assert!(evaluation.blocked.is_empty(), "{:?}", evaluation.blocked);
    assert!(evaluation.version("v1beta1").is_some_and(|v| !v.served));
}

#[test]
fn a_conversion_preflight_gates_the_store() {
    let crd = three_versions();
    let mut text = policy_yaml(
        "  - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    store: {at: \"2026-02-01T00:00:00Z\"}\n",
    );
    text.push_str("  migration: {enabled: true}\n");
    let schedule = Schedule::new(&policy(&text).spec, &crd, ts("2026-01-01T00:00:00Z")).expect("valid");
    let at = ts("2026-02-01T00:00:01Z");
    let with = |result: Option<PreflightResult>| GateInputs {
        preflight: result.map(|r| ("v1".to_owned(), r)).into_iter().collect(),
        ..GateInputs::default()
    };
    let pending = schedule.evaluate_with_gates(&crd, &[], &with(None), at);
    assert_eq!(pending.blocked[0].reason, BlockReason::AwaitingPreflight);
    assert_eq!(
        flags(&pending),
        "v1alpha1:sS v1beta1:s v1:s",
        "introduced, not stored"
    );
    let failed = schedule.evaluate_with_gates(
        &crd,
        &[],
        &with(Some(PreflightResult::Failed("w7: bad".into()))),
        at,
    );
    assert_eq!(failed.blocked[0].reason, BlockReason::ConversionPreflightFailed);
    assert!(failed.blocked[0].message.contains("w7: bad"));
    let store_at = ts("2026-02-01T00:00:00Z");
    let pass = PreflightPass {
        store_at,
        checked_at: ts("2026-01-31T23:59:50Z"),
        stands_for: jiff::SignedDuration::from_secs(20),
    };
    let passed = schedule.evaluate_with_gates(&crd, &[], &with(Some(PreflightResult::Passed(pass))), at);
    assert!(passed.blocked.is_empty());
    assert_eq!(flags(&passed), "v1alpha1:s v1beta1:s v1:sS");

    // A passed result that does not stand: the store waits, saying why.
    let waits = |pass: PreflightPass, at, why: &str| {
        let held = schedule.evaluate_with_gates(&crd, &[], &with(Some(PreflightResult::Passed(pass))), at);
        assert_eq!(held.blocked[0].reason, BlockReason::AwaitingPreflight);
        assert!(
            held.blocked[0].message.contains(why),
            "{}",
            held.blocked[0].message
        );
        assert_eq!(flags(&held), "v1alpha1:sS v1beta1:s v1:s");
    };
    // Its objects were last checked more than it stands for before now (the check before
    // the instant was missed: a restart, a late reconcile).
    waits(
        pass,
        ts("2026-02-01T00:00:11Z"),
        "checked again: they were last checked at 2026-01-31T23:59:50Z",
    );
    // Passed for another store of v1 (one at another instant): it stands for nothing here.
    let other = PreflightPass {
        store_at: ts("2026-01-20T00:00:00Z"),
        ..pass
    };
    waits(
        other,
        at,
        "ran for a store at 2026-01-20T00:00:00Z, not this one at 2026-02-01T00:00:00Z",
    );

    // Turned off: no gate.
    let mut text = policy_yaml("  - name: v1\n    store: {at: \"2026-02-01T00:00:00Z\"}\n");
    text.push_str("  migration: {enabled: true, preflight: false}\n");
    let schedule = Schedule::new(&policy(&text).spec, &crd, ts("2026-01-01T00:00:00Z")).expect("valid");
    assert!(
        schedule
            .evaluate_with_gates(&crd, &[], &GateInputs::default(), at)
            .blocked
            .is_empty()
    );
}

#[test]
fn gates_wait_only_when_due() {
    let crd = three_versions();
    let schedule = schedule(APPROVED_STORE, &crd);
    let before = schedule.evaluate_with_gates(&crd, &[], &GateInputs::default(), ts("2026-01-20T00:00:00Z"));
    assert!(before.blocked.is_empty());
    assert_eq!(
        before.next_transition().map(|t| t.at),
        Some(ts("2026-02-01T00:00:00Z")),
        "the timeline is the schedule's"
    );
}

mod deprecation_policy {
    use crate::fixtures::{crd, crd_yaml, policy, problems as problems_of, ts};

    fn problems(versions: &str) -> Vec<(String, String)> {
        let text = format!(
            "apiVersion: crdlifecycle.io/v1alpha1\nkind: VersionPolicy\nmetadata: {{name: w}}\n\
             spec:\n  crdName: widgets.example.com\n  enforce: KubernetesDeprecationPolicy\n  versions:\n{versions}"
        );
        let crd = crd(&crd_yaml(&[
            ("v1alpha1", true, true),
            ("v1beta1", true, false),
            ("v1", false, false),
        ]));
        problems_of(&policy(&text).spec, &crd, ts("2026-01-01T00:00:00Z"))
    }

    #[test]
    fn a_compliant_schedule_passes() {
        let found = problems(
            "  - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    store: {at: \"2026-02-01T00:00:00Z\"}\n\
             \x20 - name: v1beta1\n    deprecate: {at: \"2026-02-01T00:00:00Z\"}\n    unserve: {at: \"2026-11-01T00:00:00Z\"}\n\
             \x20 - name: v1alpha1\n    deprecate: {at: \"2026-02-02T00:00:00Z\"}\n    unserve: {after: 1d}\n    remove: {after: 1d}\n",
        );
        assert_eq!(found, []);
    }

    #[test]
    fn rule_3_no_deprecation_in_favour_of_a_less_stable_version() {
        // v1beta1 deprecated before v1 (the only GA) is served.
        let found = problems(
            "  - name: v1\n    introduce: {at: \"2026-03-01T00:00:00Z\"}\n    store: {at: \"2026-03-02T00:00:00Z\"}\n\
             \x20 - name: v1beta1\n    deprecate: {at: \"2026-02-01T00:00:00Z\"}\n",
        );
        assert!(
            found
                .iter()
                .any(|(p, m)| p == "spec.versions[1].deprecate" && m.contains("rule #3")),
            "{found:#?}"
        );
    }

    #[test]
    fn rule_4a_beta_served_nine_months_after_deprecation_and_ga_never_removed() {
        let found = problems(
            "  - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    store: {at: \"2026-02-01T00:00:00Z\"}\n    \
             deprecate: {at: \"2026-03-01T00:00:00Z\"}\n\
             \x20 - name: v1beta1\n    deprecate: {at: \"2026-02-01T00:00:00Z\"}\n    unserve: {at: \"2026-08-01T00:00:00Z\"}\n",
        );
        assert!(
            found.iter().any(|(p, m)| p == "spec.versions[1].unserve"
                && m.contains("rule #4a")
                && m.contains("not be unserved before 2026-11-01T00:00:00Z")),
            "{found:#?}"
        );
        let found = problems(
            "  - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    store: {at: \"2026-02-01T00:00:00Z\"}\n\
             \x20 - name: v1alpha1\n    deprecate: {at: \"2026-02-01T00:00:00Z\"}\n    unserve: {after: 1d}\n    remove: {after: 1d}\n",
        );
        assert_eq!(found, [], "alpha versions may go at once");
        let found = problems(
            "  - name: v1
    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    deprecate: {at: \"2026-02-01T00:00:00Z\"}\n    \
             unserve: {after: 1d}\n    remove: {after: 1d}\n",
        );
        assert!(
            found.iter().any(|(p, m)| p == "spec.versions[0].remove"
                && m.contains("GA version v1 may be deprecated but must not be removed")),
            "{found:#?}"
        );
    }
}

const WRITERS_GATED: &str = "  - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    store: {at: \"2026-02-01T00:00:00Z\"}\n\
     \x20 - name: v1beta1\n    deprecate: {at: \"2026-03-01T00:00:00Z\"}\n    \
     unserve: {at: \"2026-04-01T00:00:00Z\", requireNoWritersFor: 7d}\n    remove: {after: 1d}\n";

/// The writers gate holds an unserve while any field manager wrote through the version
/// within the window (managedFields), naming the managers, and wakes when the window ends.
#[test]
fn a_writers_gate_waits_until_nobody_writes_through_the_version() {
    let crd = three_versions();
    let schedule = schedule(WRITERS_GATED, &crd);
    let at = ts("2026-04-01T06:00:00Z");
    // Not read yet: held.
    let evaluation = schedule.evaluate_with_gates(&crd, &[], &GateInputs::default(), at);
    assert_eq!(evaluation.blocked[0].reason, BlockReason::VersionInUse);
    assert!(
        evaluation.blocked[0]
            .message
            .contains("managedFields are not read yet")
    );
    let gates_with = |read: WritersRead| GateInputs {
        writers: [("v1beta1".to_owned(), read)].into(),
        ..GateInputs::default()
    };
    // Being read, or unreadable: held, saying so.
    let reading =
        schedule.evaluate_with_gates(&crd, &[], &gates_with(WritersRead::Reading { objects: 1500 }), at);
    assert_eq!(
        reading.blocked[0].message,
        "v1beta1 unserve waits until no field manager has written through v1beta1 for 168h; \
         reading the objects' managedFields (1500 objects read so far)"
    );
    assert!(reading.version("v1beta1").is_some_and(|v| v.served));
    let failed = schedule.evaluate_with_gates(
        &crd,
        &[],
        &gates_with(WritersRead::Failed("403 Forbidden".into())),
        at,
    );
    assert_eq!(failed.blocked[0].reason, BlockReason::VersionInUse);
    assert!(
        failed.blocked[0]
            .message
            .contains("cannot be read (403 Forbidden)")
    );
    let writes = |list: &[(&str, &str)]| {
        gates_with(WritersRead::Read(
            list.iter().map(|(m, t)| ((*m).to_owned(), ts(t))).collect(),
        ))
    };
    let gates = writes(&[
        ("kubectl-edit", "2026-03-30T10:00:00Z"),
        ("gitops", "2026-03-28T00:00:00Z"),
        ("old-job", "2026-01-01T00:00:00Z"),
    ]);
    let evaluation = schedule.evaluate_with_gates(&crd, &[], &gates, at);
    assert_eq!(evaluation.blocked[0].reason, BlockReason::VersionInUse);
    assert_eq!(
        evaluation.blocked[0].message,
        "v1beta1 unserve waits until no field manager has written through v1beta1 for 168h: \
         kubectl-edit (last write 2026-03-30T10:00:00Z), gitops (last write 2026-03-28T00:00:00Z); \
         satisfied at 2026-04-06T10:00:00Z if nobody writes"
    );
    assert!(evaluation.version("v1beta1").is_some_and(|v| v.served));
    assert_eq!(evaluation.wake_at, Some(ts("2026-04-06T10:00:00Z")));
    // A week after the last write: unserved.
    let later = schedule.evaluate_with_gates(&crd, &[], &gates, ts("2026-04-06T10:00:00Z"));
    assert!(later.blocked.is_empty(), "{:?}", later.blocked);
    assert!(later.version("v1beta1").is_some_and(|v| !v.served));
    // Nobody ever wrote through it: unserved at once.
    let none = schedule.evaluate_with_gates(&crd, &[], &writes(&[]), at);
    assert!(none.version("v1beta1").is_some_and(|v| !v.served));
}

/// A store waits while a StorageVersionMigration of the resource is unfinished (anyone's,
/// ours too): Kubernetes' migrator would rewrite objects through an apiserver that still
/// stores the version of before, then trim it. The previous storage version keeps being
/// served and stored meanwhile; the store lands once the migration finished.
#[test]
fn a_store_waits_while_a_storage_version_migration_is_unfinished() {
    let crd = three_versions();
    let mut text = policy_yaml(
        "  - name: v1\n    introduce: {at: \"2026-01-15T00:00:00Z\"}\n    store: {at: \"2026-02-01T00:00:00Z\"}\n",
    );
    // No preflight, so that the migration is the only gate (it holds after a passed
    // preflight the same way).
    text.push_str("  migration: {enabled: true, preflight: false}\n");
    let schedule = Schedule::new(&policy(&text).spec, &crd, ts("2026-01-01T00:00:00Z")).expect("valid");
    let at = ts("2026-02-01T00:00:01Z");
    let under_way = GateInputs {
        migration_under_way: Some("StorageVersionMigration widgets-v1beta1-1 has finished".to_owned()),
        ..GateInputs::default()
    };
    let held = schedule.evaluate_with_gates(&crd, &[], &under_way, at);
    assert_eq!(held.blocked[0].reason, BlockReason::AwaitingMigration);
    assert_eq!(held.blocked[0].milestone, Some(MilestoneKind::Store));
    assert!(
        held.blocked[0]
            .message
            .contains("v1 store waits until StorageVersionMigration widgets-v1beta1-1 has finished"),
        "{}",
        held.blocked[0].message
    );
    assert_eq!(
        flags(&held),
        "v1alpha1:sS v1beta1:s v1:s",
        "introduced, not stored"
    );
    let done = schedule.evaluate_with_gates(&crd, &[], &GateInputs::default(), at);
    assert!(done.blocked.is_empty(), "{:?}", done.blocked);
    assert_eq!(flags(&done), "v1alpha1:s v1beta1:s v1:sS");
    // Only a store waits: the introduction before it is not held.
    let before = schedule.evaluate_with_gates(&crd, &[], &under_way, ts("2026-01-20T00:00:00Z"));
    assert!(before.blocked.is_empty(), "{:?}", before.blocked);
    assert_eq!(flags(&before), "v1alpha1:sS v1beta1:s v1:s");
    // A store already applied (in the history) that someone undid (a GitOps self-heal, kubectl
    // edit) is put back only after the migration too.
    let applied = GateInputs {
        applied: [("v1".to_owned(), MilestoneKind::Store)].into(),
        ..under_way.clone()
    };
    let undone = schedule.evaluate_with_gates(&crd, &[], &applied, at);
    assert_eq!(undone.blocked[0].reason, BlockReason::AwaitingMigration);
    assert_eq!(flags(&undone), "v1alpha1:sS v1beta1:s v1:s");
    let put_back = GateInputs {
        migration_under_way: None,
        ..applied
    };
    assert_eq!(
        flags(&schedule.evaluate_with_gates(&crd, &[], &put_back, at)),
        "v1alpha1:s v1beta1:s v1:sS"
    );
}
