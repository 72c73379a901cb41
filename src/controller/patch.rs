//! The guarded JSON Patch that moves a CRD's versions to what the engine decided.
//!
//! `spec.versions` is an atomic list, so server-side apply would take ownership of the
//! whole list (schemas included). A JSON Patch touches only the governed flags and the
//! removed entries, and its `test` operations make it fail (422, see
//! `apiserver-samples/03`) instead of corrupting the CRD when someone changed it since we
//! read it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use serde_json::{Value, json};

use crate::lifecycle::{DesiredVersion, Evaluation};

/// The operations that make `crd` match `evaluation`, guarded by `test` operations on
/// `metadata.resourceVersion` and on the name of every touched entry; empty when the CRD
/// already matches. Removals come last, from the highest index down, so that the indices
/// of the earlier operations stay valid.
pub fn crd_patch(crd: &CustomResourceDefinition, evaluation: &Evaluation) -> Vec<Value> {
    let mut guards = Vec::new();
    let mut changes = Vec::new();
    let mut removals = Vec::new();
    for (index, current) in crd.spec.versions.iter().enumerate() {
        let Some(desired) = evaluation.version(&current.name) else {
            continue;
        };
        let base = format!("/spec/versions/{index}");
        let before = changes.len();
        if !desired.present {
            removals.push(json!({"op": "remove", "path": base}));
        } else {
            flag_changes(&base, current, desired, &mut changes);
        }
        if !desired.present || changes.len() > before {
            guards.push(json!({"op": "test", "path": format!("{base}/name"), "value": current.name}));
        }
    }
    if changes.is_empty() && removals.is_empty() {
        return Vec::new();
    }
    let resource_version = crd.metadata.resource_version.clone().unwrap_or_default();
    let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})];
    ops.extend(guards);
    ops.extend(changes);
    ops.extend(removals.into_iter().rev());
    ops
}

fn flag_changes(
    base: &str,
    current: &CustomResourceDefinitionVersion,
    desired: &DesiredVersion,
    ops: &mut Vec<Value>,
) {
    if current.served != desired.served {
        ops.push(json!({"op": "replace", "path": format!("{base}/served"), "value": desired.served}));
    }
    if current.storage != desired.storage {
        ops.push(json!({"op": "replace", "path": format!("{base}/storage"), "value": desired.storage}));
    }
    // The apiserver omits `deprecated: false` and an unset warning, so these are added
    // and removed rather than replaced (as in apiserver-samples/07).
    let deprecated = current.deprecated.unwrap_or(false);
    if desired.deprecated && !deprecated {
        ops.push(json!({"op": "add", "path": format!("{base}/deprecated"), "value": true}));
    } else if !desired.deprecated && current.deprecated.is_some() {
        ops.push(json!({"op": "remove", "path": format!("{base}/deprecated")}));
    }
    match (&current.deprecation_warning, &desired.deprecation_warning) {
        (current, Some(wanted)) if current.as_ref() != Some(wanted) => {
            ops.push(json!({"op": "add", "path": format!("{base}/deprecationWarning"), "value": wanted}));
        }
        (Some(_), None) => ops.push(json!({"op": "remove", "path": format!("{base}/deprecationWarning")})),
        _ => {}
    }
}

/// Adds the operation that sets `spec.conversion` to `desired` when the CRD's differs
/// (guarded like the rest); returns whether it did.
pub fn add_conversion(ops: &mut Vec<Value>, crd: &CustomResourceDefinition, desired: &Value) -> bool {
    let current = serde_json::to_value(&crd.spec.conversion).unwrap_or(Value::Null);
    if current == *desired {
        return false;
    }
    if ops.is_empty() {
        let resource_version = crd.metadata.resource_version.clone().unwrap_or_default();
        ops.push(json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}));
    }
    ops.push(json!({"op": "add", "path": "/spec/conversion", "value": desired}));
    true
}

/// The patch as kube sends it.
pub fn as_json_patch(ops: &[Value]) -> Result<json_patch::Patch, serde_json::Error> {
    serde_json::from_value(Value::Array(ops.to_vec()))
}
