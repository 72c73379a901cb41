//! The four kstatus-compatible conditions of a policy, from what its reconcile observed:
//! `Ready` only when the policy is idle and healthy; `Reconciling` while the operator still
//! works towards it (a migration, cleanup or preflight, a wait it resolves by itself);
//! `Stalled` when it cannot go on without a human (an invalid policy, a missing approval, a
//! conflict, a failed migration); and `Blocked` with every reason that holds the policy
//! back. A dry run settles as soon as its patch is computed.

use super::Observation;
use crate::api::{MigrationPhase, VersionPolicy};
use crate::controller::conditions::{ConditionReason, ConditionState, ConditionType, StatusReason};

/// What the conditions are decided from, besides the blocks.
struct Facts<'a> {
    crd_name: &'a str,
    /// Whether the operator migrates at all (a dry run never does).
    migrations_enabled: bool,
    /// Whether the CRD is as the evaluation wants it.
    in_sync: bool,
    /// The migration the evaluation needs, in words.
    migration_work: Option<String>,
    /// The message of the last run towards the needed storage version, if it failed.
    failed_migration: Option<String>,
    /// The message of the last managedFields cleanup, if it failed and matters.
    failed_cleanup: Option<String>,
}

/// The conditions, in the order they are written: Ready, Reconciling, Stalled, Blocked.
pub(super) fn conditions(policy: &VersionPolicy, observation: &Observation<'_>) -> Vec<ConditionState> {
    let migrations_enabled = policy.spec.migration.enabled && !policy.spec.dry_run;
    let facts = Facts {
        crd_name: &policy.spec.crd_name,
        migrations_enabled,
        in_sync: match (observation.crd, observation.evaluation) {
            (Some(crd), Some(evaluation)) => evaluation.is_satisfied_by(crd),
            _ => false,
        },
        migration_work: observation
            .evaluation
            .and_then(|e| e.migration.as_ref())
            .map(|need| {
                format!(
                    "objects stored in {} must be rewritten into {} and status.storedVersions trimmed",
                    need.stale_versions.join(", "),
                    need.storage_version
                )
            }),
        failed_migration: failed_migration(policy, observation),
        failed_cleanup: failed_cleanup(policy, observation),
    };
    let blocked = blocked(observation);
    if policy.spec.dry_run && (observation.dry_run_patch.is_some() || facts.in_sync) {
        return dry_run(&facts, observation, blocked);
    }
    let stalled = stalled(&facts, observation);
    let reconciling = reconciling(&facts, observation, &stalled);
    let ready = ready(&facts, observation, &blocked, &stalled, &reconciling);
    vec![ready, reconciling, stalled, blocked]
}

/// The messages of the blocks whose reason passes `filter`, joined.
fn messages(observation: &Observation<'_>, filter: &dyn Fn(ConditionReason) -> bool) -> String {
    observation
        .blocked
        .iter()
        .filter(|(reason, _)| filter(*reason))
        .map(|(_, m)| m.as_str())
        .collect::<Vec<_>>()
        .join("; ")
}

/// `Blocked`: every reason that holds the policy back, the first one as its reason.
fn blocked(observation: &Observation<'_>) -> ConditionState {
    match observation.blocked.first() {
        Some((reason, _)) => ConditionState::new(
            ConditionType::Blocked,
            true,
            reason.as_str(),
            messages(observation, &|_| true),
        ),
        None => ConditionState::new(
            ConditionType::Blocked,
            false,
            StatusReason::NotBlocked.as_str(),
            "nothing is held back".to_owned(),
        ),
    }
}

/// The last run towards the needed storage version failed: retried later, but a human
/// must look (objects that do not convert, a missing grant).
fn failed_migration(policy: &VersionPolicy, observation: &Observation<'_>) -> Option<String> {
    let need = observation.evaluation.and_then(|e| e.migration.as_ref())?;
    policy
        .status
        .as_ref()
        .and_then(|s| s.migration.as_ref())
        .filter(|m| {
            !observation.migrating
                && m.phase == MigrationPhase::Failed
                && m.storage_version == need.storage_version
        })
        .map(|m| {
            m.message
                .clone()
                .unwrap_or_else(|| "the migration failed".to_owned())
        })
}

/// The last managedFields cleanup a removal waits for failed (after its bounded
/// retries), or one of versions already gone from the CRD (whose objects no manager can
/// server-side apply until it succeeds, though no removal waits): retried later, but a
/// human must look at the objects it names.
fn failed_cleanup(policy: &VersionPolicy, observation: &Observation<'_>) -> Option<String> {
    let removal_waits = observation
        .blocked
        .iter()
        .any(|(reason, _)| *reason == ConditionReason::AwaitingManagedFieldsCleanup);
    policy
        .status
        .as_ref()
        .and_then(|s| s.managed_fields_cleanup.as_ref())
        .filter(|c| removal_waits || !c.gone_versions.is_empty())
        .filter(|c| !observation.cleaning && c.phase == MigrationPhase::Failed)
        .map(|c| {
            let mut message = c
                .message
                .clone()
                .unwrap_or_else(|| "the managedFields cleanup failed".to_owned());
            if !c.failures.is_empty() {
                message.push_str(&format!("; {}", c.failures.join("; ")));
            }
            message
        })
}

/// `Stalled`: a block that needs a human, else a failed migration, else a failed cleanup.
fn stalled(facts: &Facts<'_>, observation: &Observation<'_>) -> ConditionState {
    let migrations_enabled = facts.migrations_enabled;
    let crd_name = facts.crd_name;
    let stalled_reason = observation
        .blocked
        .iter()
        .map(|(reason, _)| *reason)
        .find(|reason| reason.needs_a_human(migrations_enabled));
    match (stalled_reason, &facts.failed_migration) {
        (Some(reason), _) => ConditionState::new(
            ConditionType::Stalled,
            true,
            reason.as_str(),
            messages(observation, &|r| r.needs_a_human(migrations_enabled)),
        ),
        (None, Some(message)) if migrations_enabled => ConditionState::new(
            ConditionType::Stalled,
            true,
            StatusReason::MigrationFailed.as_str(),
            format!("the last migration of {crd_name} failed and is retried later: {message}"),
        ),
        (None, None) if facts.failed_cleanup.is_some() => ConditionState::new(
            ConditionType::Stalled,
            true,
            StatusReason::ManagedFieldsCleanupFailed.as_str(),
            format!(
                "the last rewrite of {crd_name}'s managedFields entries failed and is retried later: {}",
                facts.failed_cleanup.clone().unwrap_or_default()
            ),
        ),
        _ => ConditionState::new(
            ConditionType::Stalled,
            false,
            StatusReason::NotStalled.as_str(),
            "nothing needs a human".to_owned(),
        ),
    }
}

/// `Reconciling`: work the operator does by itself (a migration, a wait that resolves).
fn reconciling(facts: &Facts<'_>, observation: &Observation<'_>, stalled: &ConditionState) -> ConditionState {
    let migrations_enabled = facts.migrations_enabled;
    let crd_name = facts.crd_name;
    let waiting = observation
        .blocked
        .iter()
        .map(|(reason, _)| *reason)
        .find(|reason| reason.resolves_by_itself(migrations_enabled));
    if stalled.status {
        ConditionState::new(
            ConditionType::Reconciling,
            false,
            StatusReason::Stalled.as_str(),
            "stalled: see the Stalled condition".to_owned(),
        )
    } else if let (true, Some(work)) = (migrations_enabled, &facts.migration_work) {
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
            messages(observation, &|r| r.resolves_by_itself(migrations_enabled)),
        )
    } else if let Some(work) = &facts.migration_work {
        ConditionState::new(
            ConditionType::Reconciling,
            false,
            StatusReason::MigrationPending.as_str(),
            format!("{work}; spec.migration.enabled is false, so run `crd-lifecycle migrate {crd_name}`"),
        )
    } else if !facts.in_sync && observation.dry_run_patch.is_none() && observation.blocked.is_empty() {
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
    }
}

/// `Ready`: only when nothing holds the policy back, nothing is stalled or under way, and
/// the CRD matches the policy.
fn ready(
    facts: &Facts<'_>,
    observation: &Observation<'_>,
    blocked: &ConditionState,
    stalled: &ConditionState,
    reconciling: &ConditionState,
) -> ConditionState {
    let crd_name = facts.crd_name;
    if let Some((reason, _)) = observation.blocked.first() {
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
    } else if facts.in_sync {
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
    }
}

/// A dry run is done once its patch is computed: the operator will never act, so kstatus
/// (and `kubectl wait --for=condition=Ready`) must settle. Only an error that leaves
/// nothing to show (no patch, invalid policy, missing CRD) is not Ready.
fn dry_run(facts: &Facts<'_>, observation: &Observation<'_>, blocked: ConditionState) -> Vec<ConditionState> {
    let crd_name = facts.crd_name;
    let held = messages(observation, &|_| true);
    let message = match (&observation.dry_run_patch, held.is_empty()) {
        (Some(_), true) => {
            format!("dry run: the changes to {crd_name} in status.dryRunPatch were not applied")
        }
        (Some(_), false) => format!(
            "dry run: the changes to {crd_name} in status.dryRunPatch were not applied; a real run would also wait: {held}"
        ),
        (None, _) => format!("dry run: {crd_name} already matches the policy"),
    };
    vec![
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
    ]
}
