//! What the controller feeds the engine's gates: approvals from the policy's annotation
//! (and who set it, from managedFields), applied transitions from the history, observed
//! traffic, and conversion preflight results.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use std::collections::BTreeMap;

use crate::api::{MigrationPhase, TrafficStatus, VersionPolicy, VersionPolicyStatus};
use crate::controller::jobs::preflight;
use crate::controller::traffic::TrafficMonitor;
use crate::controller::writers_gate::{WritersGateReads, WritersReport};
use crate::lifecycle::{APPROVE_ANNOTATION, GateInputs, PreflightResult, parse_approvals, parse_duration};

/// The gate inputs of a policy, the traffic part of its status, and the approval
/// entries that could not be read.
pub struct Gates {
    pub inputs: GateInputs,
    pub traffic: Vec<TrafficStatus>,
    pub invalid_approvals: Vec<String>,
}

pub fn gates(policy: &VersionPolicy, crd: &CustomResourceDefinition, traffic: &TrafficMonitor) -> Gates {
    let annotation = policy
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(APPROVE_ANNOTATION))
        .map(String::as_str)
        .unwrap_or_default();
    let (approvals, invalid_approvals) = parse_approvals(annotation);
    let status = policy.status.clone().unwrap_or_default();
    let applied = status
        .history
        .iter()
        .map(|h| (h.version.clone(), h.milestone))
        .collect();
    let preflight = preflight_results(&status, crd);

    let mut observed = std::collections::BTreeMap::new();
    let mut traffic_status = Vec::new();
    for version in &policy.spec.versions {
        let Some(window) = version
            .unserve
            .as_ref()
            .and_then(|u| u.require_no_traffic_for.as_deref())
            .and_then(|w| parse_duration(w).ok())
        else {
            continue;
        };
        let key = (
            crd.spec.group.clone(),
            version.name.clone(),
            crd.spec.names.plural.clone(),
        );
        let observation = traffic.observation(&key);
        if let Some(observation) = observation {
            observed.insert(version.name.clone(), observation);
        }
        traffic_status.push(TrafficStatus {
            version: version.name.clone(),
            observed_since: observation.map(|o| Time(o.watching_since)),
            last_request_at: observation.and_then(|o| o.last_request).map(Time),
            window_satisfied_at: observation.map(|o| Time(o.quiet_since() + window)),
            message: observation.is_none().then(|| {
                traffic
                    .last_error()
                    .unwrap_or_else(|| "waiting for the first sample of the apiserver's /metrics".to_owned())
            }),
        });
    }
    Gates {
        inputs: GateInputs {
            policy_name: policy.metadata.name.clone().unwrap_or_default(),
            approvals,
            applied,
            traffic: observed,
            preflight,
            // Read by `writers` (it needs the objects), where a writers gate waits.
            writers: Default::default(),
            // Asked by the reconcile where a store is due (a list of the resource's
            // StorageVersionMigrations).
            migration_under_way: None,
        },
        traffic: traffic_status,
        invalid_approvals,
    }
}

/// What the store gates see of the recorded conversion preflights (`status.preflights`, and
/// the single `status.preflight` of an earlier release for its version): each result
/// checked against what the CRD has now (`preflight::fingerprints`); one checked against
/// something else stands for nothing, so the store waits for the preflight to run again. A
/// passed one carries the store it ran for and when its objects were last checked: the
/// engine counts it only for that store and only shortly after the check
/// (`PreflightPass::stands`). A passed result of an earlier release, which did not record
/// the schemas it checked against, counts for nothing either (its preflight runs again);
/// its running or failed one is shown while its conversion is unchanged.
pub fn preflight_results(
    status: &VersionPolicyStatus,
    crd: &CustomResourceDefinition,
) -> BTreeMap<String, PreflightResult> {
    let fingerprints = preflight::fingerprints(crd);
    let conversion = crate::migrate::conversion_fingerprint(crd);
    let versions = status
        .preflights
        .iter()
        .chain(status.preflight.as_ref())
        .map(|p| p.version.as_str());
    let mut results = BTreeMap::new();
    for version in versions {
        let Some(recorded) = preflight::recorded(Some(status), version) else {
            continue;
        };
        let current = match &recorded.fingerprint {
            Some(fingerprint) => fingerprints.get(version) == Some(fingerprint),
            None => {
                recorded.phase != MigrationPhase::Succeeded
                    && recorded.conversion.as_ref().is_none_or(|c| *c == conversion)
            }
        };
        if !current {
            continue;
        }
        let result = match recorded.phase {
            MigrationPhase::Running => PreflightResult::Running,
            MigrationPhase::Succeeded => match preflight::pass(recorded) {
                Some(pass) => PreflightResult::Passed(pass),
                None => continue,
            },
            MigrationPhase::Failed => PreflightResult::Failed(
                recorded
                    .message
                    .clone()
                    .unwrap_or_else(|| recorded.failures.join("; ")),
            ),
        };
        results.insert(version.to_owned(), result);
    }
    results
}

/// For each governed version whose `unserve` has a writers gate, is due at `now` and is
/// still served: what is known of the field managers' writes through it, from the objects'
/// managedFields. `reads` reads them in the background (`spec.migration.pageSize` objects a
/// page), only while such a gate is due (from its instant, not at every reconcile before),
/// and keeps the result while it stands; a
/// version whose read is under way or failed holds its gate, and `WritersReport::recheck_at` says
/// when to look again.
pub fn writers(
    reads: &WritersGateReads,
    policy: &VersionPolicy,
    crd: &CustomResourceDefinition,
    now: jiff::Timestamp,
) -> WritersReport {
    // An invalid schedule is reported by the evaluation; nothing to read for it.
    let due: Vec<(String, jiff::SignedDuration)> =
        crate::lifecycle::Schedule::new(&policy.spec, &crate::lifecycle::CrdState::from_crd(crd), now)
            .map(|schedule| {
                schedule
                    .versions
                    .iter()
                    .filter(|v| v.reached(crate::api::MilestoneKind::Unserve, now))
                    .filter_map(|v| Some((v.name.clone(), v.no_writers_for?)))
                    .collect()
            })
            .unwrap_or_default();
    let gated: Vec<(String, jiff::SignedDuration)> = due
        .into_iter()
        .filter(|(v, _)| crd.spec.versions.iter().any(|c| c.name == *v && c.served))
        .collect();
    reads.writers(crd, &gated, policy.spec.migration.page_size, now)
}

/// Who set the approval annotation, and when: the field manager that owns it in
/// managedFields (the API does not record the user).
pub fn approver(policy: &VersionPolicy) -> Option<(String, Time)> {
    let pointer = format!(
        "/f:metadata/f:annotations/f:{}",
        APPROVE_ANNOTATION.replace('/', "~1")
    );
    policy
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| {
            entry
                .fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer(&pointer).is_some())
        })
        .filter_map(|entry| Some((entry.manager.clone()?, entry.time.clone()?)))
        .max_by_key(|(_, time)| time.0)
}
