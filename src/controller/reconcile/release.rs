//! The release step: a deleted policy releases its CRD before it goes (the
//! `crdlifecycle.io/release-crd` finalizer), and a live one keeps that finalizer.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::read::{self, ReadError};
use super::report::write_status;
use crate::api::VersionPolicy;
use crate::controller::Context;
use crate::controller::conditions::ConditionReason;
use crate::controller::events::{EventReason, event};
use crate::controller::patch::{add_conversion, as_json_patch};
use crate::controller::request::status_code;
use crate::controller::status::{Observation, build_status};
use crate::conversion::RecordedConversion;
use crate::kube_events;

/// The release step failed.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    /// A JSON Patch of the policy (its finalizer) failed.
    #[error("patching VersionPolicy {policy} failed: {source}")]
    PatchPolicy {
        policy: String,
        #[source]
        source: kube::Error,
    },
    /// Recording the conversion on the CRD before releasing it failed.
    #[error("patching CustomResourceDefinition {crd} failed: {source}")]
    PatchCrd {
        crd: String,
        #[source]
        source: kube::Error,
    },
    /// Reading the CRD to release failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A patch could not be serialized (a bug, reported rather than panicking).
    #[error("cannot serialize the patch: {0}")]
    Serialize(#[source] serde_json::Error),
}

impl ReleaseError {
    /// The apiserver's answer, when a patch failed with one.
    pub fn api_status_code(&self) -> Option<u16> {
        match self {
            ReleaseError::PatchPolicy { source, .. } | ReleaseError::PatchCrd { source, .. } => {
                status_code(source)
            }
            ReleaseError::Read(error) => status_code(&error.source),
            ReleaseError::Serialize(_) => None,
        }
    }
}

/// The finalizer that keeps a policy until its CRD is released.
pub const RELEASE_FINALIZER: &str = "crdlifecycle.io/release-crd";

/// Keeps the policy from disappearing before its CRD is released (see `release`).
pub async fn ensure_finalizer(policy: &VersionPolicy, ctx: &Context) -> Result<(), ReleaseError> {
    let finalizers = policy.metadata.finalizers.as_deref().unwrap_or_default();
    if finalizers.iter().any(|f| f == RELEASE_FINALIZER) {
        return Ok(());
    }
    let op = if policy.metadata.finalizers.is_none() {
        json!({"op": "add", "path": "/metadata/finalizers", "value": [RELEASE_FINALIZER]})
    } else {
        json!({"op": "add", "path": "/metadata/finalizers/-", "value": RELEASE_FINALIZER})
    };
    patch_policy(ctx, &policy.name_any(), vec![op]).await
}

/// A deleted policy releases its CRD, then lets itself go. The CRD keeps every version and
/// flag as it is. If it converts through this operator's webhook for this policy, it keeps
/// doing so: the conversion is recorded on the CRD (`crdlifecycle.io/conversion`, written
/// here if an older version of the operator did not), and the webhook serves it from there
/// once the policy is gone, so every served version stays readable. Turning
/// `spec.conversion.webhook.enabled` off before deleting hands conversion back instead.
pub async fn release(policy: &VersionPolicy, ctx: &Context) -> Result<Action, ReleaseError> {
    let name = policy.name_any();
    let has_finalizer = policy
        .metadata
        .finalizers
        .as_deref()
        .is_some_and(|f| f.iter().any(|f| f == RELEASE_FINALIZER));
    if !has_finalizer {
        return Ok(Action::await_change());
    }
    let crd_name = &policy.spec.crd_name;
    let note = match read::from_etcd(ctx, crd_name).await? {
        None => format!("VersionPolicy {name} deleted; CustomResourceDefinition {crd_name} does not exist"),
        Some(crd) => match converting_for(&crd, &name) {
            Some(current) => {
                if let Some(conversion) = &policy.spec.conversion {
                    let record = RecordedConversion {
                        policy: name.clone(),
                        conversion: conversion.clone(),
                    };
                    let mut ops = Vec::new();
                    add_conversion(&mut ops, &crd, &current, &record);
                    if !ops.is_empty()
                        && let Err(error) = patch_crd(ctx, crd_name, ops).await
                    {
                        let message = format!(
                            "cannot record the conversion of {crd_name} on it before releasing it ({error}); \
                             the policy stays until it can, so that every version stays readable"
                        );
                        warn!(policy = name, "{message}");
                        publish(ctx, policy, EventReason::CannotReleaseCRD, &message).await;
                        let observation = Observation {
                            blocked: vec![(ConditionReason::ReleasingCrd, message)],
                            ..Observation::default()
                        };
                        let status = build_status(policy, &observation, ctx.now());
                        let _ = write_status(&ctx.client, &name, &status).await;
                        return Err(error);
                    }
                }
                format!(
                    "VersionPolicy {name} deleted; {crd_name} keeps its versions as they are and keeps converting \
                     through this operator's webhook, from its crdlifecycle.io/conversion annotation. To hand \
                     conversion back, set spec.conversion.webhook.enabled: false before deleting the policy"
                )
            }
            None => format!("VersionPolicy {name} deleted; {crd_name} keeps its versions as they are"),
        },
    };
    info!(policy = name, "{note}");
    publish(ctx, policy, EventReason::CRDReleased, &note).await;
    ctx.metrics.set_blocked(&name, &[]);
    ctx.metrics.set_next_transition(&name, None);
    ctx.metrics.set_state(&name, None);
    remove_release_finalizer(
        ctx,
        &name,
        policy.metadata.finalizers.as_deref().unwrap_or_default(),
    )
    .await
}

/// Removes the release finalizer (a guarded JSON Patch: `test` its entry, then `remove`
/// it), so that a deleted policy goes. Gone already, or the finalizers changed meanwhile:
/// the next event tells.
pub async fn remove_release_finalizer(
    ctx: &Context,
    name: &str,
    finalizers: &[String],
) -> Result<Action, ReleaseError> {
    ctx.last_reconciles.forget(name);
    let Some(index) = finalizers.iter().position(|f| f == RELEASE_FINALIZER) else {
        return Ok(Action::await_change());
    };
    let ops = vec![
        json!({"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": RELEASE_FINALIZER}),
        json!({"op": "remove", "path": format!("/metadata/finalizers/{index}")}),
    ];
    match patch_policy(ctx, name, ops).await {
        Err(error) if matches!(error.api_status_code(), Some(404 | 409 | 422)) => Ok(Action::await_change()),
        other => other.map(|()| Action::await_change()),
    }
}

/// The CRD's `spec.conversion` when it is this operator's webhook for `policy`.
fn converting_for(crd: &CustomResourceDefinition, policy: &str) -> Option<Value> {
    let conversion = crd.spec.conversion.as_ref()?;
    let config = conversion.webhook.as_ref()?.client_config.as_ref()?;
    let path = format!("/convert/{policy}");
    let ours = config.service.as_ref().and_then(|s| s.path.as_deref()) == Some(path.as_str())
        || config.url.as_deref().is_some_and(|u| u.ends_with(&path));
    (conversion.strategy == "Webhook" && ours)
        .then(|| serde_json::to_value(conversion).unwrap_or(Value::Null))
}

async fn patch_policy(ctx: &Context, name: &str, ops: Vec<Value>) -> Result<(), ReleaseError> {
    let patch = as_json_patch(&ops).map_err(ReleaseError::Serialize)?;
    let api: Api<DeserializeGuard<VersionPolicy>> = Api::all(ctx.client.clone());
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(|source| ReleaseError::PatchPolicy {
            policy: name.to_owned(),
            source,
        })?;
    Ok(())
}

async fn patch_crd(ctx: &Context, name: &str, ops: Vec<Value>) -> Result<(), ReleaseError> {
    let patch = as_json_patch(&ops).map_err(ReleaseError::Serialize)?;
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(|source| ReleaseError::PatchCrd {
            crd: name.to_owned(),
            source,
        })?;
    Ok(())
}

async fn publish(ctx: &Context, policy: &VersionPolicy, reason: EventReason, note: &str) {
    let event = event(reason, note.to_owned(), "Release");
    kube_events::send(&ctx.recorder, &policy.object_ref(&()), event).await;
}
