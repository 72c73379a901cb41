//! Building `VersionPolicy.status` from what a reconcile observed and did (pure).

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use serde_json::json;

use super::conditions::{ConditionReason, ConditionState, ConditionType, StatusReason};
pub use super::observation::Observation;
use crate::api::{
    HistoryEntry, MilestoneKind, NextTransition, VersionPhase, VersionPolicy, VersionPolicyStatus,
    VersionStatus,
};
use crate::lifecycle::{CrdState, Evaluation, phase_of_flags};

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

/// The conditions a reconcile writes, from what it observed.
/// The conditions, kstatus-compatible: `Ready` only when the policy is idle and healthy;
/// `Reconciling` while the operator still works towards it (a migration, cleanup or
/// preflight, a wait it resolves by itself); `Stalled` when it cannot go on without a human
/// (an invalid policy, a missing approval, a conflict, a failed migration); and `Blocked`
/// with every reason that holds the policy back.
fn conditions(policy: &VersionPolicy, observation: &Observation<'_>) -> Vec<ConditionState> {
    let crd_name = &policy.spec.crd_name;
    // A dry run never migrates: nothing is pending on the operator.
    let migrations_enabled = policy.spec.migration.enabled && !policy.spec.dry_run;
    let messages = |filter: &dyn Fn(ConditionReason) -> bool| {
        observation
            .blocked
            .iter()
            .filter(|(reason, _)| filter(*reason))
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    };
    let blocked = match observation.blocked.first() {
        Some((reason, _)) => {
            ConditionState::new(ConditionType::Blocked, true, reason.as_str(), messages(&|_| true))
        }
        None => ConditionState::new(
            ConditionType::Blocked,
            false,
            StatusReason::NotBlocked.as_str(),
            "nothing is held back".to_owned(),
        ),
    };
    let in_sync = match (observation.crd, observation.evaluation) {
        (Some(crd), Some(evaluation)) => evaluation.is_satisfied_by(crd),
        _ => false,
    };
    let migration = observation.evaluation.and_then(|e| e.migration.as_ref());
    let migration_work = migration.map(|need| {
        format!(
            "objects stored in {} must be rewritten into {} and status.storedVersions trimmed",
            need.stale_versions.join(", "),
            need.storage_version
        )
    });
    // The last run towards the needed storage version failed: retried later, but a human
    // must look (objects that do not convert, a missing grant).
    let failed_migration = migration.and_then(|need| {
        policy
            .status
            .as_ref()
            .and_then(|s| s.migration.as_ref())
            .filter(|m| {
                !observation.migrating
                    && m.phase == crate::api::MigrationPhase::Failed
                    && m.storage_version == need.storage_version
            })
            .map(|m| {
                m.message
                    .clone()
                    .unwrap_or_else(|| "the migration failed".to_owned())
            })
    });

    // The last managedFields cleanup a removal waits for failed (after its bounded
    // retries), or one of versions already gone from the CRD (whose objects no manager can
    // server-side apply until it succeeds, though no removal waits): retried later, but a
    // human must look at the objects it names.
    let removal_waits = observation
        .blocked
        .iter()
        .any(|(reason, _)| *reason == ConditionReason::AwaitingManagedFieldsCleanup);
    let failed_cleanup = policy
        .status
        .as_ref()
        .and_then(|s| s.managed_fields_cleanup.as_ref())
        .filter(|c| removal_waits || !c.gone_versions.is_empty())
        .filter(|c| !observation.cleaning && c.phase == crate::api::MigrationPhase::Failed)
        .map(|c| {
            let mut message = c
                .message
                .clone()
                .unwrap_or_else(|| "the managedFields cleanup failed".to_owned());
            if !c.failures.is_empty() {
                message.push_str(&format!("; {}", c.failures.join("; ")));
            }
            message
        });

    let stalled_reason = observation
        .blocked
        .iter()
        .map(|(reason, _)| *reason)
        .find(|reason| reason.needs_a_human(migrations_enabled));
    let stalled = match (stalled_reason, &failed_migration) {
        (Some(reason), _) => ConditionState::new(
            ConditionType::Stalled,
            true,
            reason.as_str(),
            messages(&|r| r.needs_a_human(migrations_enabled)),
        ),
        (None, Some(message)) if migrations_enabled => ConditionState::new(
            ConditionType::Stalled,
            true,
            StatusReason::MigrationFailed.as_str(),
            format!("the last migration of {crd_name} failed and is retried later: {message}"),
        ),
        (None, None) if failed_cleanup.is_some() => ConditionState::new(
            ConditionType::Stalled,
            true,
            StatusReason::ManagedFieldsCleanupFailed.as_str(),
            format!(
                "the last rewrite of {crd_name}'s managedFields entries failed and is retried later: {}",
                failed_cleanup.clone().unwrap_or_default()
            ),
        ),
        _ => ConditionState::new(
            ConditionType::Stalled,
            false,
            StatusReason::NotStalled.as_str(),
            "nothing needs a human".to_owned(),
        ),
    };

    let waiting = observation
        .blocked
        .iter()
        .map(|(reason, _)| *reason)
        .find(|reason| reason.resolves_by_itself(migrations_enabled));
    let reconciling = if stalled.status {
        ConditionState::new(
            ConditionType::Reconciling,
            false,
            StatusReason::Stalled.as_str(),
            "stalled: see the Stalled condition".to_owned(),
        )
    } else if let (true, Some(work)) = (migrations_enabled, &migration_work) {
        let reason = if observation.migrating {
            StatusReason::Migrating.as_str()
        } else {
            StatusReason::MigrationPending.as_str()
        };
        ConditionState::new(ConditionType::Reconciling, true, reason, work.clone())
    } else if let Some(reason) = waiting {
        ConditionState::new(
            ConditionType::Reconciling,
            true,
            reason.as_str(),
            messages(&|r| r.resolves_by_itself(migrations_enabled)),
        )
    } else if let Some(work) = &migration_work {
        ConditionState::new(
            ConditionType::Reconciling,
            false,
            StatusReason::MigrationPending.as_str(),
            format!("{work}; spec.migration.enabled is false, so run `crd-lifecycle migrate {crd_name}`"),
        )
    } else if !in_sync && observation.dry_run_patch.is_none() && observation.blocked.is_empty() {
        ConditionState::new(
            ConditionType::Reconciling,
            true,
            StatusReason::Pending.as_str(),
            format!("{crd_name} does not match the policy yet"),
        )
    } else {
        ConditionState::new(
            ConditionType::Reconciling,
            false,
            StatusReason::Idle.as_str(),
            "no transition or migration under way".to_owned(),
        )
    };

    let ready = if let Some((reason, _)) = observation.blocked.first() {
        ConditionState::new(
            ConditionType::Ready,
            false,
            reason.as_str(),
            format!("{crd_name} is held back: {}", blocked.message),
        )
    } else if stalled.status || reconciling.status {
        let (reason, message) = if stalled.status {
            (&stalled.reason, &stalled.message)
        } else {
            (&reconciling.reason, &reconciling.message)
        };
        ConditionState::new(ConditionType::Ready, false, reason, message.clone())
    } else if in_sync {
        ConditionState::new(
            ConditionType::Ready,
            true,
            StatusReason::UpToDate.as_str(),
            format!("{crd_name} matches the policy"),
        )
    } else if observation.dry_run_patch.is_some() {
        ConditionState::new(
            ConditionType::Ready,
            false,
            StatusReason::DryRun.as_str(),
            format!("dry run: the changes to {crd_name} in status.dryRunPatch were not applied"),
        )
    } else {
        ConditionState::new(
            ConditionType::Ready,
            false,
            StatusReason::Pending.as_str(),
            format!("{crd_name} does not match the policy yet"),
        )
    };
    // A dry run is done once its patch is computed: the operator will never act, so kstatus
    // (and `kubectl wait --for=condition=Ready`) must settle. Only an error that leaves
    // nothing to show (no patch, invalid policy, missing CRD) is not Ready.
    if policy.spec.dry_run && (observation.dry_run_patch.is_some() || in_sync) {
        let held = messages(&|_| true);
        let message = match (&observation.dry_run_patch, held.is_empty()) {
            (Some(_), true) => {
                format!("dry run: the changes to {crd_name} in status.dryRunPatch were not applied")
            }
            (Some(_), false) => format!(
                "dry run: the changes to {crd_name} in status.dryRunPatch were not applied; a real run would also wait: {held}"
            ),
            (None, _) => format!("dry run: {crd_name} already matches the policy"),
        };
        return vec![
            ConditionState::new(ConditionType::Ready, true, StatusReason::DryRun.as_str(), message),
            ConditionState::new(
                ConditionType::Reconciling,
                false,
                StatusReason::DryRun.as_str(),
                "dry run: the operator changes nothing".to_owned(),
            ),
            ConditionState::new(
                ConditionType::Stalled,
                false,
                StatusReason::NotStalled.as_str(),
                "nothing needs a human".to_owned(),
            ),
            blocked,
        ];
    }
    vec![ready, reconciling, stalled, blocked]
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
