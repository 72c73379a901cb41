//! A policy that does not decode (possible for objects stored before a schema change):
//! reported as invalid instead of breaking the watch for every policy.

use kube::core::error_boundary::InvalidObject;
use kube::runtime::controller::Action;
use serde_json::json;

use super::release::{ReleaseError, remove_release_finalizer};
use super::report::ReportError;
use crate::api::FIELD_MANAGER;
use crate::controller::conditions::{ConditionReason, ConditionState, ConditionType, StatusReason};
use crate::controller::status::apply_status;
use crate::controller::{Context, Error};

/// Reports `invalid` on its status (Stalled and Blocked, `InvalidPolicy`), or lets it go
/// when it is being deleted.
pub async fn report_undecodable(invalid: &InvalidObject, ctx: &Context) -> Result<Action, Error> {
    let name = invalid.metadata.name.clone().ok_or(Error::MissingName)?;
    // Its spec cannot be read, so there is nothing to release: let a deletion proceed (a
    // conversion recorded on the CRD stays served from there).
    if invalid.metadata.deletion_timestamp.is_some() {
        let finalizers = invalid.metadata.finalizers.as_deref().unwrap_or_default();
        return remove_release_finalizer(ctx, &name, finalizers)
            .await
            .map_err(|e: ReleaseError| e.into());
    }
    let now = ctx.now();
    let message = format!("the policy cannot be read: {}", invalid.error);
    let generation = invalid.metadata.generation;
    let conditions: Vec<_> = [
        ConditionState::new(
            ConditionType::Ready,
            false,
            ConditionReason::InvalidPolicy.as_str(),
            message.clone(),
        ),
        ConditionState::new(
            ConditionType::Reconciling,
            false,
            StatusReason::Stalled.as_str(),
            message.clone(),
        ),
        ConditionState::new(
            ConditionType::Stalled,
            true,
            ConditionReason::InvalidPolicy.as_str(),
            message.clone(),
        ),
        ConditionState::new(
            ConditionType::Blocked,
            true,
            ConditionReason::InvalidPolicy.as_str(),
            message,
        ),
    ]
    .into_iter()
    .map(|c| c.condition(&[], generation, now))
    .collect();
    let status = json!({"observedGeneration": generation, "conditions": conditions});
    apply_status(&ctx.client, &name, FIELD_MANAGER, status)
        .await
        .map_err(|source| ReportError::WriteStatus {
            policy: name.clone(),
            source,
        })?;
    ctx.metrics
        .set_blocked(&name, &[ConditionReason::InvalidPolicy.as_str()]);
    ctx.metrics.set_state(&name, Some("Stalled"));
    Ok(Action::await_change())
}
