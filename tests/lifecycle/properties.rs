//! Property tests: generated valid policies and instants keep every engine invariant.

use crd_lifecycle::api::{
    Approval, DeprecateMilestone, MigrationSettings, Milestone, MilestoneKind, UnserveMilestone,
    VersionPolicySpec, VersionSchedule,
};
use crd_lifecycle::lifecycle::{
    self, BlockReason, CrdState, CrdVersion, Evaluation, GateInputs, PreflightPass, PreflightResult,
    Schedule, TrafficObservation,
};
use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use proptest::test_runner::Config;

const DAY: i64 = 86_400;
const START: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z

/// Random choices for one version; `build` turns them into a schedule that is valid by
/// construction.
#[derive(Clone, Debug)]
struct VersionChoice {
    stored: bool,
    introduce: bool,
    deprecate: bool,
    unserve: bool,
    remove: bool,
    served_in_crd: bool,
    warning: bool,
    gaps: [i64; 6],
    use_after: [bool; 5],
    /// Which milestones need an approval, and whether `unserve` has a traffic gate.
    approvals: [bool; 5],
    traffic_gate: bool,
}

fn version_choice() -> impl Strategy<Value = VersionChoice> {
    (
        any::<[bool; 7]>(),
        proptest::array::uniform6(0i64..60),
        any::<[bool; 5]>(),
        any::<[bool; 5]>(),
        any::<bool>(),
    )
        .prop_map(|(b, gaps, use_after, approvals, traffic_gate)| VersionChoice {
            approvals,
            traffic_gate,
            stored: b[0],
            introduce: b[1],
            deprecate: b[2],
            unserve: b[3],
            remove: b[4],
            served_in_crd: b[5],
            warning: b[6],
            gaps: gaps.map(|g| g * DAY / 2 + g),
            use_after,
        })
}

/// A generated case: the policy, the CRD it governs, and the instants of the schedule.
#[derive(Clone, Debug)]
struct Case {
    spec: VersionPolicySpec,
    crd: CrdState,
}

/// Builds a valid policy: stores happen in version order at distinct instants; a version
/// is only unserved once a later version has taken over storage from it; every milestone
/// of a version follows the previous one.
fn build(choices: &[VersionChoice]) -> Case {
    let names: Vec<String> = (0..choices.len()).map(|i| format!("v{}", i + 1)).collect();
    // Storage instants: version 0 is the CRD's storage version from the start.
    let mut store_at: Vec<Option<i64>> = vec![None; choices.len()];
    let mut clock = START;
    for (i, choice) in choices.iter().enumerate().skip(1) {
        if choice.stored {
            clock += choice.gaps[0] + DAY;
            store_at[i] = Some(clock);
        }
    }
    let mut versions = Vec::new();
    for (i, choice) in choices.iter().enumerate() {
        let ever_storage = i == 0 || store_at[i].is_some();
        // Storage ends when the next stored version takes over.
        let storage_ends = if ever_storage {
            store_at.iter().skip(i + 1).flatten().next().copied()
        } else {
            Some(START)
        };
        let mut instants: [Option<i64>; 5] = [None; 5];
        // Version 0 is the CRD's storage version: it cannot wait for an introduction.
        if choice.introduce && i != 0 {
            let base = store_at[i].unwrap_or(START + choice.gaps[1]);
            instants[0] = Some(base - choice.gaps[1]);
        }
        instants[1] = store_at[i];
        let mut last = instants[0].max(instants[1]).unwrap_or(START);
        if choice.deprecate {
            last += choice.gaps[2];
            instants[2] = Some(last);
        }
        // Unserving needs a deprecation and, for a storage version, a successor.
        if choice.deprecate
            && choice.unserve
            && let Some(ends) = storage_ends
        {
            last = last.max(ends) + choice.gaps[3];
            instants[3] = Some(last);
            if choice.remove {
                last += choice.gaps[4];
                instants[4] = Some(last);
            }
        }
        versions.push(schedule_entry(&names[i], choice, instants));
    }
    let crd = CrdState {
        name: "widgets.example.com".into(),
        generation: None,
        versions: names
            .iter()
            .enumerate()
            .map(|(i, name)| CrdVersion {
                name: name.clone(),
                served: i == 0 || choices[i].served_in_crd,
                storage: i == 0,
                deprecated: false,
                deprecation_warning: None,
            })
            .collect(),
        stored_versions: vec![names[0].clone()],
        managed_fields_pending: Vec::new(),
        unfinished_migration: None,
        schemas: Default::default(),
    };
    let spec = VersionPolicySpec {
        crd_name: "widgets.example.com".into(),
        suspend: false,
        dry_run: false,
        versions,
        migration: MigrationSettings::default(),
        enforce: None,
        conversion: None,
    };
    Case { spec, crd }
}

/// Writes each instant as `at`, or as `after` the previous milestone when chosen.
fn schedule_entry(name: &str, choice: &VersionChoice, instants: [Option<i64>; 5]) -> VersionSchedule {
    let mut timings: [Option<(Option<String>, Option<String>)>; 5] = Default::default();
    let mut previous: Option<i64> = None;
    for (k, instant) in instants.iter().enumerate() {
        let Some(at) = *instant else { continue };
        timings[k] = Some(match previous {
            Some(from) if choice.use_after[k] => (None, Some(format!("{}s", at - from))),
            _ => (
                Some(Timestamp::from_second(at).expect("in range").to_string()),
                None,
            ),
        });
        previous = Some(at);
    }
    let approval = |k: usize| choice.approvals[k].then_some(Approval::Required);
    let milestone = |t: &Option<(Option<String>, Option<String>)>, k: usize| {
        t.clone().map(|(at, after)| Milestone {
            at,
            after,
            approval: approval(k),
        })
    };
    VersionSchedule {
        name: name.to_owned(),
        introduce: milestone(&timings[0], 0),
        store: milestone(&timings[1], 1),
        deprecate: timings[2].clone().map(|(at, after)| DeprecateMilestone {
            approval: approval(2),
            at,
            after,
            warning: choice.warning.then(|| format!("{name} is deprecated")),
        }),
        unserve: timings[3].clone().map(|(at, after)| UnserveMilestone {
            at,
            after,
            approval: approval(3),
            require_no_traffic_for: choice.traffic_gate.then(|| "1h".to_owned()),
            require_no_writers_for: choice.traffic_gate.then(|| "2h".to_owned()),
        }),
        remove: milestone(&timings[4], 4),
    }
}

/// A case, instants to evaluate it at (around every milestone and at random), and which
/// versions `status.storedVersions` lists.
fn case_with_instants() -> impl Strategy<Value = (Case, Vec<Timestamp>, Vec<bool>)> {
    proptest::collection::vec(version_choice(), 1..=4).prop_flat_map(|choices| {
        let case = build(&choices);
        let count = choices.len();
        (
            Just(case),
            proptest::collection::vec(-10 * DAY..400 * DAY, 1..8),
            proptest::collection::vec(any::<bool>(), count),
        )
            .prop_map(|(case, offsets, stored)| {
                let schedule = Schedule::new(&case.spec, &case.crd, Timestamp::MIN).ok();
                let mut instants: Vec<Timestamp> = offsets
                    .iter()
                    .map(|o| Timestamp::from_second(START + o).expect("in range"))
                    .collect();
                for transition in schedule.iter().flat_map(Schedule::transitions) {
                    for delta in [-1, 0, 1] {
                        instants.push(transition.at + SignedDuration::from_secs(delta));
                    }
                }
                instants.sort();
                instants.dedup();
                (case, instants, stored)
            })
    })
}

fn stored_versions(case: &Case, evaluation_storage: Option<&str>, pick: &[bool]) -> Vec<String> {
    let mut stored: Vec<String> = case
        .crd
        .versions
        .iter()
        .zip(pick)
        .filter(|(_, p)| **p)
        .map(|(v, _)| v.name.clone())
        .collect();
    // The apiserver always lists the current storage version.
    if let Some(storage) = evaluation_storage
        && !stored.iter().any(|s| s == storage)
    {
        stored.push(storage.to_owned());
    }
    stored
}

fn evaluate(schedule: &Schedule, crd: &CrdState, at: Timestamp) -> Evaluation {
    schedule.evaluate(crd, &[], at)
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=N runs more.
    #![proptest_config(Config::default())]

    #[test]
    fn generated_policies_are_valid((case, _, _) in case_with_instants()) {
        let result = Schedule::new(&case.spec, &case.crd, Timestamp::MIN);
        prop_assert!(result.is_ok(), "{:?}\n{:#?}", result.err(), case.spec);
    }

    /// Never remove a version that objects' managedFields may still name.
    #[test]
    fn no_version_named_in_managed_fields_is_removed(
        (case, instants, pick) in case_with_instants(),
        pending in proptest::collection::vec(any::<bool>(), 4),
    ) {
        let schedule = Schedule::new(&case.spec, &case.crd, Timestamp::MIN).expect("valid by construction");
        let named: Vec<String> = case.crd.versions.iter().zip(&pending).filter(|(_, p)| **p).map(|(v, _)| v.name.clone()).collect();
        for at in instants {
            let probe = evaluate(&schedule, &case.crd, at);
            let crd = CrdState {
                stored_versions: stored_versions(&case, probe.storage_version(), &pick),
                managed_fields_pending: named.clone(),
                ..case.crd.clone()
            };
            let evaluation = evaluate(&schedule, &crd, at);
            for name in &named {
                prop_assert!(evaluation.version(name).is_some_and(|v| v.present), "{} removed while named in managedFields at {}", name, at);
            }
            // A removal held for it says so.
            for blocked in evaluation.blocked.iter().filter(|b| b.reason == BlockReason::AwaitingManagedFieldsCleanup) {
                prop_assert!(named.contains(&blocked.version));
            }
        }
    }

    /// Never remove a version while another migrator's migration of the objects runs
    /// (Kubernetes' migrator may have trimmed storedVersions before rewriting them).
    #[test]
    fn no_version_is_removed_while_another_migration_runs((case, instants, pick) in case_with_instants()) {
        let schedule = Schedule::new(&case.spec, &case.crd, Timestamp::MIN).expect("valid by construction");
        for at in instants {
            let probe = evaluate(&schedule, &case.crd, at);
            let crd = CrdState {
                stored_versions: stored_versions(&case, probe.storage_version(), &pick),
                unfinished_migration: Some("StorageVersionMigration m has finished".into()),
                ..case.crd.clone()
            };
            let evaluation = evaluate(&schedule, &crd, at);
            for version in &crd.versions {
                prop_assert!(
                    evaluation.version(&version.name).is_some_and(|v| v.present),
                    "{} removed at {} while a migration runs", version.name, at
                );
            }
        }
    }

    #[test]
    fn invariants_hold_at_every_instant((case, instants, pick) in case_with_instants()) {
        let schedule = Schedule::new(&case.spec, &case.crd, Timestamp::MIN).expect("valid by construction");
        let mut was_served = vec![false; case.crd.versions.len()];
        let mut was_removed = vec![false; case.crd.versions.len()];
        for at in instants {
            // The CRD as it was just before: stored versions include the storage version of
            // the previous state, as the apiserver keeps them.
            let probe = evaluate(&schedule, &case.crd, at);
            let crd = CrdState { stored_versions: stored_versions(&case, probe.storage_version(), &pick), ..case.crd.clone() };
            let evaluation = evaluate(&schedule, &crd, at);

            // Exactly one storage version, and it is served.
            let storage: Vec<_> = evaluation.versions.iter().filter(|v| v.present && v.storage).collect();
            prop_assert_eq!(storage.len(), 1, "at {}: {:?}", at, evaluation.versions);
            prop_assert!(storage[0].served, "storage not served at {}: {:?}", at, evaluation.versions);
            // Some version is served.
            prop_assert!(evaluation.versions.iter().any(|v| v.present && v.served));
            // Nothing in storedVersions is removed.
            for name in &crd.stored_versions {
                prop_assert!(evaluation.version(name).is_some_and(|v| v.present), "{} removed while stored at {}", name, at);
            }
            // A valid policy never needs the unsafe-state brake.
            prop_assert!(!evaluation.blocked.iter().any(|b| b.reason == BlockReason::UnsafeState), "{:?}", evaluation.blocked);
            for (i, version) in evaluation.versions.iter().enumerate() {
                // Unserve never precedes deprecate: a version that was served and is not any
                // more is deprecated.
                if was_served[i] && !version.served && version.governed && version.present {
                    prop_assert!(version.deprecated, "{} unserved before deprecated at {}", version.name, at);
                }
                // Removal follows unserving, and is final.
                if !version.present {
                    let scheduled = schedule.version(&version.name).expect("only governed versions are removed");
                    prop_assert!(scheduled.reached(crd_lifecycle::api::MilestoneKind::Unserve, at));
                    was_removed[i] = true;
                } else {
                    prop_assert!(!was_removed[i], "{} came back at {}", version.name, at);
                }
                was_served[i] |= version.served;
            }
            // Deterministic: the same input gives the same output.
            prop_assert_eq!(&evaluate(&schedule, &crd, at), &evaluation);
        }
    }

    #[test]
    fn rendering_is_deterministic_and_idempotent((case, instants, _) in case_with_instants()) {
        let schedule = Schedule::new(&case.spec, &case.crd, Timestamp::MIN).expect("valid by construction");
        let manifest = crd_manifest(&case.crd);
        for at in instants {
            let evaluation = evaluate(&schedule, &case.crd, at);
            let rendered = lifecycle::render_crd(&manifest, &evaluation);
            prop_assert_eq!(&lifecycle::render_crd(&manifest, &evaluation), &rendered);
            prop_assert_eq!(&lifecycle::render_crd(&rendered, &evaluation), &rendered);
            // What was rendered reads back as exactly the desired flags.
            let (typed, _) = crd_lifecycle::manifest::parse_crd(&rendered.to_string(), "rendered").expect("a valid CRD");
            let reread = CrdState::from_crd(&typed);
            let present: Vec<_> = evaluation.versions.iter().filter(|v| v.present).collect();
            prop_assert_eq!(reread.versions.len(), present.len());
            for desired in present {
                let current = reread.version(&desired.name).expect("rendered");
                prop_assert!(desired.matches(current), "{:?} vs {:?}", desired, current);
            }
        }
    }
}

/// Deprecation warnings anywhere near the apiserver's limits: ASCII, multi-byte text, format
/// characters, other spaces, controls, characters newer than Unicode 13, empty strings.
fn warning_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,300}",
        "[a-zé❄雪 \u{a0}\u{200d}\u{ad}\u{feff}\u{2003}\t😀\u{1fae0}]{0,140}",
        ".{0,90}",
        Just(String::new()),
    ]
}

/// The apiserver's recorded deprecationWarning rules (samples 22-24), written out again here
/// rather than taken from the crate, as an independent oracle.
fn apiserver_accepts_warning(text: &str) -> bool {
    let printable = regex::Regex::new(r"^[\p{L}\p{M}\p{N}\p{P}\p{S} ]*$").expect("pattern");
    let unicode_13 = regex::Regex::new(r"^\p{Age:13.0}*$").expect("pattern");
    !text.is_empty() && text.len() <= 256 && printable.is_match(text) && unicode_13.is_match(text)
}

proptest! {
    #![proptest_config(Config::default())]

    /// No valid policy renders a CRD the apiserver rejects: whatever the warnings, either
    /// the policy is refused naming each bad warning's field, or every CRD it renders at
    /// every instant passes the apiserver's recorded rules.
    #[test]
    fn no_valid_policy_renders_a_crd_the_apiserver_rejects(
        (case, instants, pick) in case_with_instants(),
        warnings in proptest::collection::vec(warning_text(), 4),
    ) {
        let mut spec = case.spec.clone();
        let mut expected_bad = Vec::new();
        for (i, (version, warning)) in spec.versions.iter_mut().zip(&warnings).enumerate() {
            if let Some(deprecate) = version.deprecate.as_mut() {
                deprecate.warning = Some(warning.clone());
                if !apiserver_accepts_warning(warning) {
                    expected_bad.push(format!("spec.versions[{i}].deprecate.warning"));
                }
            }
        }
        match Schedule::new(&spec, &case.crd, Timestamp::MIN) {
            Err(lifecycle::Error::InvalidPolicy(errors)) => {
                let paths: Vec<String> = errors.iter().map(|e| e.path.clone()).collect();
                prop_assert!(!expected_bad.is_empty(), "a valid policy refused: {:?}", errors);
                for path in &expected_bad {
                    prop_assert!(paths.contains(path), "{} not named in {:?}", path, paths);
                }
            }
            Ok(schedule) => {
                prop_assert!(expected_bad.is_empty(), "accepted warnings the apiserver rejects: {:?}", expected_bad);
                let manifest = crd_manifest(&case.crd);
                for at in instants {
                    let probe = evaluate(&schedule, &case.crd, at);
                    let crd = CrdState { stored_versions: stored_versions(&case, probe.storage_version(), &pick), ..case.crd.clone() };
                    let evaluation = evaluate(&schedule, &crd, at);
                    let mut current = manifest.clone();
                    current["status"]["storedVersions"] = serde_json::json!(crd.stored_versions);
                    let rendered = lifecycle::render_crd(&current, &evaluation);
                    let (typed, _) = crd_lifecycle::manifest::parse_crd(&rendered.to_string(), "rendered").expect("a valid CRD");
                    let violations = lifecycle::apiserver_rules::violations(&typed);
                    prop_assert!(violations.is_empty(), "at {}: {:?}", at, violations);
                }
            }
        }
    }
}

/// Random gate inputs for the versions `v1`..`vN`: some approvals, preflight results,
/// traffic observations and, now and then, a StorageVersionMigration under way.
fn gate_inputs(versions: usize) -> impl Strategy<Value = GateInputs> {
    (
        proptest::collection::vec(any::<bool>(), versions * 5),
        proptest::collection::vec(0u8..4, versions),
        proptest::collection::vec(
            proptest::option::of((0i64..400 * DAY, proptest::option::of(0i64..400 * DAY))),
            versions,
        ),
        proptest::bool::weighted(0.2),
    )
        .prop_map(move |(approved, preflight, traffic, migrating)| {
            let name = |i: usize| format!("v{}", i + 1);
            GateInputs {
                policy_name: "widgets".into(),
                approvals: approved
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| **a)
                    .map(|(i, _)| (name(i / 5), MilestoneKind::ALL[i % 5]))
                    .collect(),
                applied: Default::default(),
                writers: Default::default(),
                migration_under_way: migrating.then(|| "StorageVersionMigration m has finished".to_owned()),
                preflight: preflight
                    .iter()
                    .enumerate()
                    .filter_map(|(i, p)| {
                        let result = match p {
                            0 => return None,
                            1 => PreflightResult::Running,
                            // For the store it ran for, just checked: see `standing`.
                            2 => PreflightResult::Passed(PreflightPass {
                                store_at: Timestamp::MIN,
                                checked_at: Timestamp::MIN,
                                stands_for: jiff::SignedDuration::ZERO,
                            }),
                            _ => PreflightResult::Failed("w1: bad".into()),
                        };
                        Some((name(i), result))
                    })
                    .collect(),
                traffic: traffic
                    .iter()
                    .enumerate()
                    .filter_map(|(i, t)| {
                        let (since, last) = (*t)?;
                        let at = |offset: i64| Timestamp::from_second(START + offset).expect("in range");
                        Some((
                            name(i),
                            TrafficObservation {
                                watching_since: at(since),
                                last_request: last.map(at),
                            },
                        ))
                    })
                    .collect(),
            }
        })
}

/// The gate inputs with every passed preflight standing at `at`: for its version's store,
/// checked at `at`.
fn standing(gates: &GateInputs, schedule: &Schedule, at: Timestamp) -> GateInputs {
    let mut gates = gates.clone();
    for (version, result) in &mut gates.preflight {
        if let PreflightResult::Passed(pass) = result {
            pass.store_at = schedule
                .version(version)
                .and_then(|v| v.at(MilestoneKind::Store))
                .unwrap_or(at);
            pass.checked_at = at;
        }
    }
    gates
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=N runs more.
    #![proptest_config(Config::default())]

    /// Whatever the gates hold back, the CRD never breaks an invariant.
    #[test]
    fn gates_keep_every_invariant(
        (case, instants, pick, gates) in case_with_instants()
            .prop_flat_map(|(case, instants, pick)| {
                let count = case.crd.versions.len();
                (Just(case), Just(instants), Just(pick), gate_inputs(count))
            })
    ) {
        let schedule = Schedule::new(&case.spec, &case.crd, Timestamp::MIN).expect("valid by construction");
        for at in instants {
            let probe = evaluate(&schedule, &case.crd, at);
            let crd = CrdState { stored_versions: stored_versions(&case, probe.storage_version(), &pick), ..case.crd.clone() };
            let evaluation = schedule.evaluate_with_gates(&crd, &[], &standing(&gates, &schedule, at), at);
            let storage: Vec<_> = evaluation.versions.iter().filter(|v| v.present && v.storage).collect();
            prop_assert_eq!(storage.len(), 1, "at {}: {:?}", at, evaluation.versions);
            prop_assert!(storage[0].served, "storage not served at {}: {:?} {:?}", at, evaluation.versions, evaluation.blocked);
            for name in &crd.stored_versions {
                prop_assert!(evaluation.version(name).is_some_and(|v| v.present), "{} removed while stored", name);
            }
            prop_assert!(
                !evaluation.blocked.iter().any(|b| b.reason == BlockReason::UnsafeState),
                "at {}: {:?}", at, evaluation.blocked
            );
            // A held transition never happens: a version whose unserve is held stays served.
            for blocked in &evaluation.blocked {
                if blocked.milestone == Some(MilestoneKind::Unserve) {
                    let version = evaluation.version(&blocked.version).expect("present");
                    prop_assert!(version.present && version.served, "{} unserved while held", blocked.version);
                }
            }
        }
    }
}

fn crd_manifest(crd: &CrdState) -> serde_json::Value {
    let versions: Vec<serde_json::Value> = crd
        .versions
        .iter()
        .map(|v| {
            serde_json::json!({
                "name": v.name, "served": v.served, "storage": v.storage,
                "schema": {"openAPIV3Schema": {"type": "object"}}
            })
        })
        .collect();
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd.name},
        "spec": {"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"}, "scope": "Namespaced", "versions": versions},
        "status": {"storedVersions": crd.stored_versions},
    })
}
