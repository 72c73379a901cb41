//! A deleted policy releases its CRD before it goes (the `crdlifecycle.io/release-crd`
//! finalizer).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::conditions::ConditionReason;
use super::context::{Context, get_crd};
use super::error::{Error, Request};
use super::patch::{add_conversion, as_json_patch};
use super::status::{Observation, build_status, write_status};
use crate::api::VersionPolicy;
use crate::conversion::RecordedConversion;
use crate::kube_events;

/// The finalizer that keeps a policy until its CRD is released.
pub const RELEASE_FINALIZER: &str = "crdlifecycle.io/release-crd";

/// Keeps the policy from disappearing before its CRD is released (see `release`).
pub async fn ensure_finalizer(policy: &VersionPolicy, ctx: &Context) -> Result<(), Error> {
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
pub async fn release(policy: &VersionPolicy, ctx: &Context) -> Result<Action, Error> {
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
    let note = match get_crd(ctx, crd_name).await? {
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
                        publish(ctx, policy, EventType::Warning, "CannotReleaseCRD", &message).await;
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
    publish(ctx, policy, EventType::Normal, "CRDReleased", &note).await;
    ctx.metrics.set_blocked(&name, &[]);
    ctx.metrics.set_next_transition(&name, None);
    ctx.metrics.set_state(&name, None);
    let_go(
        ctx,
        &name,
        policy.metadata.finalizers.as_deref().unwrap_or_default(),
    )
    .await
}

/// Removes the release finalizer (a guarded JSON Patch: `test` its entry, then `remove`
/// it), so that a deleted policy goes. Gone already, or the finalizers changed meanwhile:
/// the next event tells.
pub async fn let_go(ctx: &Context, name: &str, finalizers: &[String]) -> Result<Action, Error> {
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

async fn patch_policy(ctx: &Context, name: &str, ops: Vec<Value>) -> Result<(), Error> {
    let api: Api<DeserializeGuard<VersionPolicy>> = Api::all(ctx.client.clone());
    json_patch(&api, name, ops, Request::PatchPolicy).await
}

async fn patch_crd(ctx: &Context, name: &str, ops: Vec<Value>) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    json_patch(&api, name, ops, Request::PatchCrd).await
}

async fn json_patch<K>(api: &Api<K>, name: &str, ops: Vec<Value>, request: Request) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = as_json_patch(&ops).map_err(|source| Error::Serialize {
        what: "patch",
        source,
    })?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(Error::of(request))?;
    Ok(())
}

async fn publish(ctx: &Context, policy: &VersionPolicy, type_: EventType, reason: &str, note: &str) {
    let event = kube_events::event(type_, reason, "Release", note.to_owned());
    kube_events::send(&ctx.recorder, &policy.object_ref(&()), event).await;
}
