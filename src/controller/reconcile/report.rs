//! The report step: what the reconcile found and did, told as Events, metrics and the
//! policy's `status` (server-side apply, field manager `crd-lifecycle`).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use tracing::warn;

use super::Reconciled;
use super::gates;
use crate::api::{FIELD_MANAGER, HistoryEntry, VersionPolicy, VersionPolicyStatus};
use crate::controller::Context;
use crate::controller::events::publish_events;
use crate::controller::patches_first::BOOKKEEPING_WAITS_AT_MOST;
use crate::controller::status::{Observation, apply_status, build_status, policy_state, read_policy};
use crate::lifecycle::Evaluation;

/// The report step failed.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The server-side apply of the policy's status failed.
    #[error("writing the status of VersionPolicy {policy} failed: {source}")]
    WriteStatus {
        policy: String,
        #[source]
        source: kube::Error,
    },
    /// The status could not be serialized (a bug, reported rather than panicking).
    #[error("cannot serialize the status: {0}")]
    Serialize(#[source] serde_json::Error),
}

/// Tells what `reconciled` found and did: Events, metrics, then the status.
pub async fn report(
    policy: &VersionPolicy,
    ctx: &Context,
    name: &str,
    reconciled: &Reconciled,
    now: Timestamp,
) -> Result<(), ReportError> {
    let crd_name = &policy.spec.crd_name;
    let mut observation = observation(policy, reconciled);
    // The other reconciles' patches first (many policies due at the same instant), but
    // never past this policy's own next transition: while this reconcile waits, the next one
    // of the policy cannot start.
    let next = next_transition(reconciled.evaluation());
    let bookkeeping_waits = next.map_or(BOOKKEEPING_WAITS_AT_MOST, |at| {
        Duration::try_from(at.duration_since(ctx.now()))
            .unwrap_or(Duration::ZERO)
            .min(BOOKKEEPING_WAITS_AT_MOST)
    });
    ctx.patches_first.after_patches(bookkeeping_waits).await;
    publish_events(policy, &observation, reconciled.drift(), &ctx.recorder).await;
    for transition in observation.applied {
        ctx.metrics
            .record_transition(crd_name, &transition.version, transition.milestone.as_str());
    }
    let reasons: Vec<&str> = observation.blocked.iter().map(|(r, _)| r.as_str()).collect();
    ctx.metrics.set_blocked(name, &reasons);
    ctx.metrics.set_next_transition(name, next);

    let cache_current = policy
        .metadata
        .resource_version
        .as_deref()
        .is_some_and(|version| ctx.last_reconciles.holds_own_status(name, version));
    let (history, conditions) = recorded_status(&ctx.client, name, policy, cache_current).await;
    observation.recorded_history = history;
    observation.recorded_conditions = Some(conditions);
    let status = build_status(policy, &observation, now);
    if let Some(version) = write_status(&ctx.client, name, &status).await? {
        ctx.last_reconciles.record_status(name, &version);
    }
    ctx.metrics.set_state(name, Some(policy_state(&status)));
    Ok(())
}

/// The instant of the next transition, when the policy could be evaluated.
pub fn next_transition(evaluation: Option<&Evaluation>) -> Option<Timestamp> {
    evaluation.and_then(Evaluation::next_transition).map(|t| t.at)
}

/// The status's input, borrowed from the steps' results.
fn observation<'a>(policy: &VersionPolicy, reconciled: &'a Reconciled) -> Observation<'a> {
    let mut observation = Observation {
        crd: reconciled.crd(),
        evaluation: reconciled.evaluation(),
        blocked: reconciled.blocked(&policy.spec.crd_name),
        ..Observation::default()
    };
    if let Reconciled::Acted { applied, started } = reconciled {
        observation.migrating = started.migrating;
        observation.cleaning = started.cleaning;
        observation.approver = gates::approver(policy);
        if let Some(decided) = &applied.decided {
            let decision = &decided.decision;
            observation.approved = &decision.approved;
            observation.traffic = &decided.traffic;
            // What the patch did to spec.conversion is said once it landed: a dry run or a
            // refused patch changed nothing.
            if applied.patched() {
                observation.conversion_configured = decision.conversion_changed;
                observation.conversion_restored = decision.conversion_restored;
            }
        }
        match &applied.patch {
            super::apply::PatchOutcome::Landed { applied, .. } => observation.applied = applied,
            super::apply::PatchOutcome::DryRun(patch) => observation.dry_run_patch = Some(patch),
            _ => {}
        }
    }
    observation
}

/// The message of an apiserver's refusal.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// `status.history` and `status.conditions` as the apiserver has them, read past the cache
/// (which lags behind our own writes) unless `cache_current` (the cached policy holds the
/// last status this process wrote, and only this field manager writes them); the cached
/// ones when the read fails.
async fn recorded_status(
    client: &Client,
    name: &str,
    cached: &VersionPolicy,
    cache_current: bool,
) -> (Vec<HistoryEntry>, Vec<Condition>) {
    if cache_current {
        let status = cached.status.clone().unwrap_or_default();
        return (status.history, status.conditions);
    }
    let status = match read_policy(client, name).await {
        Ok(Some(fresh)) => fresh.status.unwrap_or_default(),
        Ok(None) => VersionPolicyStatus::default(),
        Err(error) => {
            warn!(policy = name, error = %error, "cannot read the policy's recorded status; using the cached one");
            cached.status.clone().unwrap_or_default()
        }
    };
    (status.history, status.conditions)
}

/// Applies the reconciler's status (field manager `crd-lifecycle`); returns the policy's
/// resourceVersion after it.
pub async fn write_status(
    client: &Client,
    name: &str,
    status: &VersionPolicyStatus,
) -> Result<Option<String>, ReportError> {
    let status = serde_json::to_value(status).map_err(ReportError::Serialize)?;
    apply_status(client, name, FIELD_MANAGER, status)
        .await
        .map_err(|source| ReportError::WriteStatus {
            policy: name.to_owned(),
            source,
        })
}
