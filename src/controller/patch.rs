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

use crate::conversion::{CRD_CONVERSION_ANNOTATION, CRD_CONVERSION_BEFORE_ANNOTATION, RecordedConversion};
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

/// Adds the operations that point `spec.conversion` at the webhook (`desired`) and record
/// the conversion on the CRD (guarded like the rest): the `crdlifecycle.io/conversion`
/// annotation, and, the first time, the conversion the CRD had before in
/// `crdlifecycle.io/conversion-before`. Returns whether `spec.conversion` changed.
pub fn add_conversion(
    ops: &mut Vec<Value>,
    crd: &CustomResourceDefinition,
    desired: &Value,
    record: &RecordedConversion,
) -> bool {
    let current = serde_json::to_value(&crd.spec.conversion).unwrap_or(Value::Null);
    let annotations = crd.metadata.annotations.as_ref();
    let recorded = RecordedConversion::from_annotations(annotations);
    let conversion_changes = current != *desired;
    let mut wanted: Vec<(&str, String)> = Vec::new();
    if recorded.as_ref() != Some(record) {
        wanted.push((
            CRD_CONVERSION_ANNOTATION,
            serde_json::to_string(record).unwrap_or_default(),
        ));
    }
    // What to give back when the webhook is turned off: what the CRD had before any
    // policy pointed it at the webhook (kept across later changes).
    if recorded.is_none() && !annotations.is_some_and(|a| a.contains_key(CRD_CONVERSION_BEFORE_ANNOTATION)) {
        let before = match current.clone() {
            Value::Null => json!({"strategy": "None"}),
            before => before,
        };
        wanted.push((CRD_CONVERSION_BEFORE_ANNOTATION, before.to_string()));
    }
    if !conversion_changes && wanted.is_empty() {
        return false;
    }
    guard(ops, crd);
    if conversion_changes {
        ops.push(json!({"op": "add", "path": "/spec/conversion", "value": desired}));
    }
    set_annotations(ops, crd, &wanted, &[]);
    conversion_changes
}

/// Gives the CRD back the conversion it had before the webhook took over, when this
/// policy's webhook conversion is what it has (its `crdlifecycle.io/conversion` names the
/// policy), and removes the records. Returns whether it did.
pub fn restore_conversion(ops: &mut Vec<Value>, crd: &CustomResourceDefinition, policy: &str) -> bool {
    let annotations = crd.metadata.annotations.as_ref();
    if RecordedConversion::from_annotations(annotations).is_none_or(|r| r.policy != policy) {
        return false;
    }
    let before = annotations
        .and_then(|a| a.get(CRD_CONVERSION_BEFORE_ANNOTATION))
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .unwrap_or_else(|| json!({"strategy": "None"}));
    guard(ops, crd);
    ops.push(json!({"op": "add", "path": "/spec/conversion", "value": before}));
    set_annotations(
        ops,
        crd,
        &[],
        &[CRD_CONVERSION_ANNOTATION, CRD_CONVERSION_BEFORE_ANNOTATION],
    );
    true
}

/// Starts the patch with the resourceVersion guard if nothing else did.
fn guard(ops: &mut Vec<Value>, crd: &CustomResourceDefinition) {
    if ops.is_empty() {
        let resource_version = crd.metadata.resource_version.clone().unwrap_or_default();
        ops.push(json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}));
    }
}

/// Sets and removes annotations (JSON Pointer escapes `/` in keys as `~1`).
fn set_annotations(
    ops: &mut Vec<Value>,
    crd: &CustomResourceDefinition,
    set: &[(&str, String)],
    remove: &[&str],
) {
    let existing = crd.metadata.annotations.as_ref();
    let pointer = |key: &str| {
        format!(
            "/metadata/annotations/{}",
            key.replace('~', "~0").replace('/', "~1")
        )
    };
    if !set.is_empty() && existing.is_none() {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {}}));
    }
    for (key, value) in set {
        ops.push(json!({"op": "add", "path": pointer(key), "value": value}));
    }
    for key in remove {
        if existing.is_some_and(|a| a.contains_key(*key)) {
            ops.push(json!({"op": "remove", "path": pointer(key)}));
        }
    }
}

/// The patch as kube sends it.
pub fn as_json_patch(ops: &[Value]) -> Result<json_patch::Patch, serde_json::Error> {
    serde_json::from_value(Value::Array(ops.to_vec()))
}
