//! Writing an evaluation back into a CustomResourceDefinition manifest.

use serde_json::{Map, Value};

use super::engine::Evaluation;

/// The CRD manifest as it must be: flags changed and removed versions dropped, and
/// everything else exactly as it was, including fields this program does not know.
/// Versions the evaluation does not know are left as they are.
pub fn render_crd(crd: &Value, evaluation: &Evaluation) -> Value {
    let mut rendered = crd.clone();
    let Some(versions) = rendered
        .pointer_mut("/spec/versions")
        .and_then(Value::as_array_mut)
    else {
        return rendered;
    };
    let desired_for = |entry: &Value| {
        entry
            .get("name")
            .and_then(Value::as_str)
            .and_then(|n| evaluation.version(n))
    };
    versions.retain(|entry| desired_for(entry).is_none_or(|d| d.present));
    for entry in versions.iter_mut() {
        let Some(desired) = desired_for(entry) else {
            continue;
        };
        let Some(fields) = entry.as_object_mut() else {
            continue;
        };
        fields.insert("served".into(), desired.served.into());
        fields.insert("storage".into(), desired.storage.into());
        set_or_clear(
            fields,
            "deprecated",
            desired.deprecated.then_some(Value::Bool(true)),
            Value::Bool(false),
        );
        let warning = desired.deprecation_warning.clone().map(Value::String);
        set_or_clear(fields, "deprecationWarning", warning, Value::Null);
    }
    rendered
}

/// Sets `key`; when there is nothing to set, writes `cleared` over an existing value (so
/// an explicit `deprecated: false` stays explicit) and leaves an absent key absent.
fn set_or_clear(fields: &mut Map<String, Value>, key: &str, value: Option<Value>, cleared: Value) {
    match value {
        Some(value) => {
            fields.insert(key.into(), value);
        }
        None if cleared.is_null() => {
            fields.remove(key);
        }
        None => {
            if let Some(existing) = fields.get_mut(key) {
                *existing = cleared;
            }
        }
    }
}

/// A manifest ready for `kubectl apply`: no `status` and none of the metadata the
/// apiserver sets on its own (resourceVersion, uid, generation, managedFields, ...).
pub fn as_manifest(mut crd: Value) -> Value {
    if let Some(fields) = crd.as_object_mut() {
        fields.remove("status");
    }
    if let Some(meta) = crd.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in [
            "resourceVersion",
            "uid",
            "generation",
            "creationTimestamp",
            "managedFields",
            "selfLink",
        ] {
            meta.remove(key);
        }
    }
    crd
}
