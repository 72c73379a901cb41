//! The conditions kstatus (Flux, `kubectl wait`, Argo CD health checks) reads: `Ready` only
//! when idle and healthy, `Reconciling` while the operator works, `Stalled` when a human must
//! act. Built from plain observations: no client.

use crd_lifecycle::api::VersionPolicy;
use crd_lifecycle::controller::conditions::ConditionReason;
use crd_lifecycle::controller::status::{Observation, build_status, policy_state};
use crd_lifecycle::lifecycle::{CrdState, Schedule};
use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::{EXAMPLE_CRD, EXAMPLE_POLICY};

fn policy() -> VersionPolicy {
    serde_json::from_value(super::yaml(EXAMPLE_POLICY)).expect("policy")
}

fn crd() -> CrdState {
    let crd: CustomResourceDefinition = serde_json::from_value(super::yaml(EXAMPLE_CRD)).expect("CRD");
    CrdState::from_crd(&crd)
}

fn status(blocked: &[ConditionReason]) -> crd_lifecycle::api::VersionPolicyStatus {
    let policy = policy();
    let crd = crd();
    let now: Timestamp = "2025-12-01T00:00:00Z".parse().expect("instant");
    let schedule = Schedule::new(&policy.spec, &crd, now).expect("valid");
    let evaluation = schedule.evaluate(&crd, &[], now);
    let observation = Observation {
        crd: Some(&crd),
        evaluation: Some(&evaluation),
        blocked: blocked
            .iter()
            .map(|r| (*r, format!("{} message", r.as_str())))
            .collect(),
        ..Observation::default()
    };
    build_status(&policy, &observation, now)
}

/// `(type, status, reason)` of the four conditions, in order.
fn conditions(blocked: &[ConditionReason]) -> Vec<(String, String, String)> {
    status(blocked)
        .conditions
        .into_iter()
        .map(|c| (c.type_, c.status, c.reason))
        .collect()
}

fn condition(conditions: &[(String, String, String)], type_: &str) -> (String, String) {
    conditions
        .iter()
        .find(|(t, _, _)| t == type_)
        .map(|(_, s, r)| (s.clone(), r.clone()))
        .unwrap_or_else(|| panic!("no {type_} in {conditions:?}"))
}

#[test]
fn idle_and_healthy_is_ready_and_nothing_else() {
    let found = conditions(&[]);
    let types: Vec<&str> = found.iter().map(|(t, _, _)| t.as_str()).collect();
    assert_eq!(types, ["Ready", "Reconciling", "Stalled", "Blocked"]);
    assert_eq!(condition(&found, "Ready"), ("True".into(), "UpToDate".into()));
    assert_eq!(condition(&found, "Reconciling"), ("False".into(), "Idle".into()));
    assert_eq!(
        condition(&found, "Stalled"),
        ("False".into(), "NotStalled".into())
    );
    assert_eq!(
        condition(&found, "Blocked"),
        ("False".into(), "NotBlocked".into())
    );
}

#[test]
fn a_block_only_a_human_can_lift_is_stalled() {
    for reason in [
        ConditionReason::CrdNotFound,
        ConditionReason::InvalidPolicy,
        ConditionReason::Conflict,
        ConditionReason::UnsafeState,
        ConditionReason::AwaitingApproval,
        ConditionReason::ConversionPreflightFailed,
        ConditionReason::WebhookNotConfigured,
    ] {
        let found = conditions(&[reason]);
        let name = reason.as_str().to_owned();
        assert_eq!(
            condition(&found, "Stalled"),
            ("True".into(), name.clone()),
            "{name}"
        );
        assert_eq!(condition(&found, "Reconciling").0, "False", "{name}");
        assert_eq!(condition(&found, "Ready"), ("False".into(), name.clone()));
        assert_eq!(condition(&found, "Blocked"), ("True".into(), name));
    }
}

#[test]
fn a_block_the_operator_lifts_by_itself_is_reconciling() {
    for reason in [
        ConditionReason::AwaitingMigration,
        ConditionReason::VersionInUse,
        ConditionReason::AwaitingPreflight,
        ConditionReason::ReleasingCrd,
        ConditionReason::AwaitingManagedFieldsCleanup,
    ] {
        let found = conditions(&[reason]);
        let name = reason.as_str().to_owned();
        assert_eq!(
            condition(&found, "Reconciling"),
            ("True".into(), name.clone()),
            "{name}"
        );
        assert_eq!(condition(&found, "Stalled").0, "False", "{name}");
        assert_eq!(condition(&found, "Ready"), ("False".into(), name));
    }
}

#[test]
fn stalled_wins_over_reconciling_and_suspended_is_neither() {
    let found = conditions(&[
        ConditionReason::AwaitingPreflight,
        ConditionReason::AwaitingApproval,
    ]);
    assert_eq!(
        condition(&found, "Stalled"),
        ("True".into(), "AwaitingApproval".into())
    );
    assert_eq!(condition(&found, "Reconciling").0, "False");
    // Ready and Blocked name the first (most important) reason.
    assert_eq!(
        condition(&found, "Ready"),
        ("False".into(), "AwaitingPreflight".into())
    );

    let found = conditions(&[ConditionReason::Suspended]);
    assert_eq!(condition(&found, "Stalled").0, "False");
    assert_eq!(condition(&found, "Reconciling").0, "False");
    assert_eq!(condition(&found, "Ready"), ("False".into(), "Suspended".into()));
}

#[test]
fn the_state_metric_follows_the_conditions() {
    assert_eq!(policy_state(&status(&[])), "Ready");
    assert_eq!(
        policy_state(&status(&[ConditionReason::AwaitingApproval])),
        "Stalled"
    );
    assert_eq!(
        policy_state(&status(&[ConditionReason::VersionInUse])),
        "Reconciling"
    );
    assert_eq!(policy_state(&status(&[ConditionReason::Suspended])), "Suspended");
}
