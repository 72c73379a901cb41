//! What a version cannot hold, kept in the object's `crdlifecycle.io/conversion-data`
//! annotation while it is in another version.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::{CONVERSION_DATA_ANNOTATION, ConversionError};

/// What one version's fields were, kept while the object is in a version without them.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct SavedFields {
    /// Field values, by path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) values: BTreeMap<String, Value>,
    /// Added fields that were absent (so that converting back does not add the default).
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub(super) absent: std::collections::BTreeSet<String>,
    /// Objects that setting an added field had to create (so that converting back removes
    /// them again, and only them).
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub(super) created: std::collections::BTreeSet<String>,
    /// Changed fields whose value the round trip would not give back, by their path in
    /// the newer version: the original value, restored going back while the newer value
    /// is still what it was converted to.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) changed: BTreeMap<String, Value>,
}

impl SavedFields {
    pub(super) fn is_empty(&self) -> bool {
        self.values.is_empty() && self.absent.is_empty() && self.created.is_empty() && self.changed.is_empty()
    }
}

/// What versions cannot hold: version → its saved fields.
pub(super) type Saved = BTreeMap<String, SavedFields>;

pub(super) fn take_saved(object: &mut Value) -> Result<Saved, ConversionError> {
    let Some(annotations) = object
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    else {
        return Ok(Saved::new());
    };
    let Some(text) = annotations.remove(CONVERSION_DATA_ANNOTATION) else {
        return Ok(Saved::new());
    };
    if annotations.is_empty()
        && let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut)
    {
        meta.remove("annotations");
    }
    let text = text.as_str().unwrap_or_default().to_owned();
    serde_json::from_str(&text).map_err(|e| ConversionError::BadAnnotation(e.to_string()))
}

pub(super) fn put_saved(object: &mut Value, mut saved: Saved) {
    saved.retain(|_, fields| !fields.is_empty());
    if saved.is_empty() {
        return;
    }
    let text = serde_json::to_string(&saved).unwrap_or_default();
    let Some(object) = object.as_object_mut() else {
        return;
    };
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(metadata) = metadata.as_object_mut() {
        let annotations = metadata
            .entry("annotations")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(annotations) = annotations.as_object_mut() {
            annotations.insert(CONVERSION_DATA_ANNOTATION.to_owned(), Value::String(text));
        }
    }
}
