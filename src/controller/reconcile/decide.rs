//! The `decide` step of a reconcile, pure: from the policy, its CRD, the gate inputs and the
//! conversion the webhook wants, what the CRD must become (the guarded patch), what is held
//! and why. No client: tested on plain data.

use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use serde_json::Value;

use crate::api::{MigrationPhase, MilestoneKind, VersionPolicy};
use crate::controller::conditions::ConditionReason;
use crate::controller::patch::{add_conversion, crd_patch, restore_conversion};
use crate::conversion::RecordedConversion;
use crate::lifecycle::{CompletedMigration, CrdState, Evaluation, GateInputs, Schedule, Transition};

/// What the policy's `spec.conversion.webhook` asks of the CRD's `spec.conversion`.
#[derive(Clone, Debug, PartialEq)]
pub enum WebhookConversion {
    /// The webhook is off (or there is no `spec.conversion`): give back what the CRD had.
    NotWanted,
    /// This `spec.conversion`, pointing at the webhook.
    Desired(Value),
    /// Wanted, but the webhook's certificate is not loaded yet.
    CertificateNotReady,
    /// Wanted, but this controller serves no webhook.
    NoWebhook,
}

/// What one reconcile must do.
#[derive(Debug)]
pub struct Decision {
    /// The CRD as the engine saw it.
    pub state: CrdState,
    /// The engine's evaluation (`None` for an invalid policy).
    pub evaluation: Option<Evaluation>,
    /// Everything that holds the policy back, most important first.
    pub blocked: Vec<(ConditionReason, String)>,
    /// The guarded JSON Patch to send (empty: the CRD is as it must be).
    pub ops: Vec<Value>,
    /// The transitions the patch applies.
    pub pending: Vec<Transition>,
    /// The milestones that need an approval.
    pub approved: Vec<(String, MilestoneKind)>,
    /// Whether the patch points `spec.conversion` at the webhook.
    pub conversion_changed: bool,
    /// Whether the patch gives the CRD back its conversion from before the webhook.
    pub conversion_restored: bool,
}

/// Decides, for `policy` and its `crd` at `now`. `unfinished_migration`: another migrator's
/// migration of the CRD's objects still under way (its name, or why that is unknown), which
/// holds every removal (`CrdState::unfinished_migration`).
pub fn decide(
    policy: &VersionPolicy,
    crd: &CustomResourceDefinition,
    gates: &GateInputs,
    webhook: &WebhookConversion,
    now: Timestamp,
    unfinished_migration: Option<String>,
) -> Decision {
    let mut state = CrdState::from_crd(crd);
    state.managed_fields_pending = managed_fields_pending(policy, &state);
    state.unfinished_migration = unfinished_migration;
    let mut decision = Decision {
        state,
        evaluation: None,
        blocked: Vec::new(),
        ops: Vec::new(),
        pending: Vec::new(),
        approved: Vec::new(),
        conversion_changed: false,
        conversion_restored: false,
    };
    let schedule = match Schedule::new(&policy.spec, &decision.state, now) {
        Ok(schedule) => schedule,
        Err(error) => {
            decision.blocked.push((
                ConditionReason::InvalidPolicy,
                error.to_string().replace('\n', " "),
            ));
            return decision;
        }
    };
    let evaluation = schedule.evaluate_with_gates(&decision.state, &completed_migrations(policy), gates, now);
    decision.approved = approvals_needed(&schedule);
    decision.blocked.extend(
        evaluation
            .blocked
            .iter()
            .map(|b| (ConditionReason::from(b.reason), b.message.clone())),
    );
    let mut ops = crd_patch(crd, &evaluation);
    // Keep spec.conversion pointed at this operator's webhook, and the conversion it relies
    // on recorded on the CRD, in the same guarded patch.
    match (webhook, policy.spec.conversion.as_ref()) {
        (WebhookConversion::Desired(desired), Some(conversion)) => {
            let record = RecordedConversion {
                policy: policy.name_any(),
                conversion: conversion.clone(),
            };
            decision.conversion_changed = add_conversion(&mut ops, crd, desired, &record);
        }
        (WebhookConversion::CertificateNotReady, _) => decision.blocked.push((
            ConditionReason::WebhookNotConfigured,
            "the conversion webhook's certificate is not ready yet; spec.conversion is left as it is".to_owned(),
        )),
        (WebhookConversion::NoWebhook, _) => decision.blocked.push((
            ConditionReason::WebhookNotConfigured,
            "spec.conversion.webhook.enabled is true but this controller serves no conversion webhook \
             (run it with --webhook-port and --webhook-service or --webhook-url); spec.conversion is left as it is"
                .to_owned(),
        )),
        // The webhook was turned off (or spec.conversion removed): the CRD gets back the
        // conversion it had before.
        _ => decision.conversion_restored = restore_conversion(&mut ops, crd, &policy.name_any()),
    }
    decision.pending = evaluation
        .pending_transitions(&decision.state)
        .into_iter()
        .cloned()
        .collect();
    decision.ops = ops;
    decision.evaluation = Some(evaluation);
    decision
}

/// The milestones of `schedule` that need an approval (`Decision::approved`).
fn approvals_needed(schedule: &Schedule) -> Vec<(String, MilestoneKind)> {
    schedule
        .versions
        .iter()
        .flat_map(|v| {
            MilestoneKind::ALL
                .into_iter()
                .filter(|k| v.needs_approval(*k))
                .map(|k| (v.name.clone(), k))
        })
        .collect()
}

/// The versions (other than the storage version) whose managedFields entries no cleanup has
/// rewritten yet. Served ones count too: a version unserved and removed at the same instant
/// is unserved first, and removed only after the cleanup. A cleanup counts only for the CRD
/// generation it started at: any spec change since may have served a version again (a GitOps
/// tool re-applying an older CRD), and clients may have named it again meanwhile.
pub fn managed_fields_pending(policy: &VersionPolicy, crd: &CrdState) -> Vec<String> {
    let cleaned = cleaned_at_generation(policy, crd);
    crd.versions
        .iter()
        .filter(|v| !v.storage && !cleaned.contains(&v.name))
        .map(|v| v.name.clone())
        .collect()
}

/// The versions whose managedFields entries the policy's last cleanup rewrote, if it
/// succeeded at the CRD's generation now.
pub fn cleaned_at_generation(policy: &VersionPolicy, crd: &CrdState) -> Vec<String> {
    policy
        .status
        .as_ref()
        .and_then(|s| s.managed_fields_cleanup.as_ref())
        .filter(|c| c.succeeded_at(crd.generation))
        .map(|c| c.versions.clone())
        .unwrap_or_default()
}

fn completed_migrations(policy: &VersionPolicy) -> Vec<CompletedMigration> {
    let Some(migration) = policy.status.as_ref().and_then(|s| s.migration.as_ref()) else {
        return Vec::new();
    };
    match (&migration.phase, &migration.finished_at) {
        (MigrationPhase::Succeeded, Some(finished)) => vec![CompletedMigration {
            storage_version: migration.storage_version.clone(),
            finished_at: finished.0,
        }],
        _ => Vec::new(),
    }
}
