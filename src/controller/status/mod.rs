//! Building `VersionPolicy.status` from what a reconcile observed and did (pure), its
//! conditions ([`kstatus`]), and the server-side apply every status writer shares.

mod kstatus;
mod observation;

pub use observation::Observation;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use serde_json::json;

use crate::api::{
    HistoryEntry, MilestoneKind, NextTransition, VersionPhase, VersionPolicy, VersionPolicyStatus,
    VersionStatus,
};
use crate::controller::conditions::ConditionType;
use crate::lifecycle::{CrdState, Evaluation, phase_of_flags};
use kstatus::conditions;

/// How many applied transitions `status.history` keeps.
pub const HISTORY_LIMIT: usize = 32;

/// The status to write. Condition transition times and history are carried over from the
/// previous status, so that an unchanged situation produces an identical status (and
/// writing it is a no-op that triggers no further reconcile). `migration` is left out: the
/// migration task owns it (its own field manager).
pub fn build_status(
    policy: &VersionPolicy,
    observation: &Observation<'_>,
    now: Timestamp,
) -> VersionPolicyStatus {
    let previous = policy.status.clone().unwrap_or_default();
    let generation = policy.metadata.generation;
    // Only ever grows, whatever the cache: what the apiserver has, plus what the cache has.
    let mut history = merge_history(&observation.recorded_history, &previous.history);
    history.extend(observation.applied.iter().map(|t| {
        let approval = observation
            .approved
            .contains(&(t.version.clone(), t.milestone))
            .then(|| observation.approver.clone())
            .flatten();
        HistoryEntry {
            version: t.version.clone(),
            milestone: t.milestone,
            scheduled_at: Time(t.at),
            applied_at: Time(now),
            approved_by: approval.as_ref().map(|(who, _)| who.clone()),
            approved_at: approval.map(|(_, when)| when),
        }
    }));
    if history.len() > HISTORY_LIMIT {
        history.drain(..history.len() - HISTORY_LIMIT);
    }

    let versions = observation
        .crd
        .map(|crd| version_statuses(crd, observation.evaluation, &history))
        .unwrap_or_default();
    let storage_version = observation
        .crd
        .and_then(|crd| crd.storage_version().map(str::to_owned));
    let next_transition = observation
        .evaluation
        .and_then(Evaluation::next_transition)
        .map(|t| NextTransition {
            version: t.version.clone(),
            milestone: t.milestone,
            at: Time(t.at),
            summary: format!("{} {} {}", t.version, t.milestone, t.at),
        });

    // Transition times carried over from the conditions as written last: from a cache that
    // lags behind that write, every condition would look new and move its time (a status
    // that changes at every reconcile).
    let previous_conditions = observation
        .recorded_conditions
        .as_deref()
        .unwrap_or(&previous.conditions);
    let conditions = conditions(policy, observation)
        .into_iter()
        .map(|c| c.condition(previous_conditions, generation, now))
        .collect();

    VersionPolicyStatus {
        observed_generation: generation,
        conditions,
        storage_version,
        versions,
        next_transition,
        history,
        dry_run_patch: observation.dry_run_patch.map(str::to_owned),
        // Written by the migration, cleanup and preflight tasks under their own field manager.
        migration: None,
        managed_fields_cleanup: None,
        preflights: Vec::new(),
        preflight: None,
        traffic: observation.traffic.to_vec(),
    }
}

/// The state a status puts its policy in, for `crd_lifecycle_policy_state`: Stalled,
/// Reconciling, Ready, Suspended, or else NotReady (a dry run, a CRD not matching yet).
pub fn policy_state(status: &VersionPolicyStatus) -> &'static str {
    let is = |type_: ConditionType| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_.as_str())
            .map(|c| (c.status == "True", c.reason.as_str()))
    };
    match (
        is(ConditionType::Stalled),
        is(ConditionType::Reconciling),
        is(ConditionType::Ready),
    ) {
        (Some((true, _)), _, _) => "Stalled",
        (_, Some((true, _)), _) => "Reconciling",
        (_, _, Some((true, _))) => "Ready",
        (_, _, Some((false, "Suspended"))) => "Suspended",
        _ => "NotReady",
    }
}

/// Every entry of either history once, oldest first; where both have an entry (same version,
/// milestone and instant), the one that records an approver.
pub fn merge_history(recorded: &[HistoryEntry], cached: &[HistoryEntry]) -> Vec<HistoryEntry> {
    let key = |e: &HistoryEntry| (e.version.clone(), e.milestone, e.applied_at.0);
    let mut merged: Vec<HistoryEntry> = recorded.to_vec();
    for entry in cached {
        match merged.iter_mut().find(|m| key(m) == key(entry)) {
            Some(known) if known.approved_by.is_none() && entry.approved_by.is_some() => {
                *known = entry.clone()
            }
            Some(_) => {}
            None => merged.push(entry.clone()),
        }
    }
    // Stable: entries applied at the same instant keep their order.
    merged.sort_by_key(|e| e.applied_at.0);
    merged
}

fn version_statuses(
    crd: &CrdState,
    evaluation: Option<&Evaluation>,
    history: &[HistoryEntry],
) -> Vec<VersionStatus> {
    let last_change = |name: &str| {
        history
            .iter()
            .rev()
            .find(|h| h.version == name)
            .map(|h| h.applied_at.clone())
    };
    let mut statuses: Vec<VersionStatus> = crd
        .versions
        .iter()
        .map(|current| {
            let desired = evaluation.and_then(|e| e.version(&current.name));
            // The engine's phase when the CRD carries what it decided; otherwise (dry run,
            // held back) what the flags themselves say.
            let phase = match desired {
                Some(d) if d.matches(current) => d.phase,
                _ => phase_of_flags(current.served, current.storage, current.deprecated),
            };
            VersionStatus {
                name: current.name.clone(),
                phase,
                served: current.served,
                storage: current.storage,
                deprecated: current.deprecated,
                last_transition_time: last_change(&current.name),
            }
        })
        .collect();
    // Governed versions whose removal is done and that are gone from the CRD.
    if let Some(evaluation) = evaluation {
        let removed = evaluation.timeline.iter().filter(|t| {
            t.milestone == MilestoneKind::Remove && t.at <= evaluation.at && crd.version(&t.version).is_none()
        });
        for removed in removed {
            statuses.push(VersionStatus {
                name: removed.version.clone(),
                phase: VersionPhase::Removed,
                served: false,
                storage: false,
                deprecated: false,
                last_transition_time: last_change(&removed.version),
            });
        }
    }
    statuses
}

/// Server-side applies these status fields of a VersionPolicy as `manager` (each writer of
/// status has its own manager, so that none takes another's fields); returns the policy's
/// resourceVersion after it. Responses are decoded leniently, so that writing the status of
/// a policy that does not decode works too.
pub async fn apply_status(
    client: &Client,
    name: &str,
    manager: &str,
    status: serde_json::Value,
) -> Result<Option<String>, kube::Error> {
    let api: Api<DeserializeGuard<VersionPolicy>> = Api::all(client.clone());
    let patch = json!({
        "apiVersion": "crdlifecycle.io/v1alpha1",
        "kind": "VersionPolicy",
        "status": status,
    });
    let applied = api
        .patch_status(name, &PatchParams::apply(manager).force(), &Patch::Apply(&patch))
        .await?;
    Ok(applied.meta().resource_version.clone())
}

/// The policy as the apiserver has it now, past the cache; `None` when it is gone or cannot
/// be decoded.
pub async fn read_policy(client: &Client, name: &str) -> Result<Option<VersionPolicy>, kube::Error> {
    let api: Api<DeserializeGuard<VersionPolicy>> = Api::all(client.clone());
    Ok(api.get_opt(name).await?.and_then(|guard| guard.0.ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(version: &str, at: &str, approved_by: Option<&str>) -> HistoryEntry {
        let at: Timestamp = at.parse().expect("instant");
        HistoryEntry {
            version: version.into(),
            milestone: MilestoneKind::Store,
            scheduled_at: Time(at),
            applied_at: Time(at),
            approved_by: approved_by.map(str::to_owned),
            approved_at: None,
        }
    }

    #[test]
    fn merged_history_loses_nothing() {
        let a = entry("v1beta1", "2026-01-05T00:00:00Z", None);
        let b = entry("v1", "2026-02-01T00:00:00Z", Some("alice"));
        // The apiserver has both; a stale cache has only the first, without the approver.
        assert_eq!(
            merge_history(&[a.clone(), b.clone()], std::slice::from_ref(&a)),
            [a.clone(), b.clone()]
        );
        // The cache knows one the apiserver's copy lacks: both, in order.
        assert_eq!(
            merge_history(std::slice::from_ref(&b), std::slice::from_ref(&a)),
            [a.clone(), b.clone()]
        );
        // The same entry: the copy with the approver wins.
        let unapproved = entry("v1", "2026-02-01T00:00:00Z", None);
        assert_eq!(merge_history(&[unapproved], std::slice::from_ref(&b)), [b]);
    }
}
