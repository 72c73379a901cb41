//! What a version cannot hold, kept in the object's `crdlifecycle.io/conversion-data`
//! annotation while it is in another version.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::path::ItemKey;
use super::{CONVERSION_DATA_ANNOTATION, ConversionError};

/// Most bytes an object's annotations may hold together, keys and values (the apiserver's
/// `TotalAnnotationSizeLimitB`; it refuses a converted object over it, so the converter
/// refuses first, with a message: `tests/fixtures/conversion-data/`).
pub const MAX_ANNOTATIONS_BYTES: usize = 256 << 10;

/// What one version's fields were, kept while the object is in a version without them.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct SavedFields {
    /// Field values, by path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) values: BTreeMap<String, Value>,
    /// Added fields that were absent (so that converting back does not add the default).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(super) absent: BTreeSet<String>,
    /// Objects that setting an added field had to create (so that converting back removes
    /// them again, and only them).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub(super) created: BTreeSet<String>,
    /// Changed fields whose value the round trip would not give back, by their path in
    /// the newer version: this version's value, restored going back while the other
    /// version's value is still what it was converted to.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) changed: BTreeMap<String, Value>,
    /// The same for the items of lists, by list (`ports[port]`, as the rules name it from
    /// here), item by item.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) items: BTreeMap<String, Vec<SavedItem>>,
}

/// What one item of a list could not hold, and which item it is.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct SavedItem {
    #[serde(flatten)]
    pub(super) id: ItemId,
    #[serde(default, skip_serializing_if = "SavedFields::is_empty")]
    pub(super) fields: SavedFields,
}

/// Which item of a list: its position, or the values of its key fields (and, should two
/// items share them, which of those it is).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct ItemId {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) at: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) key: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) nth: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl ItemId {
    /// The identities of a list's items under `key`.
    pub(super) fn of_items(items: &[Value], key: &ItemKey) -> Vec<ItemId> {
        let mut seen: Vec<Map<String, Value>> = Vec::new();
        items
            .iter()
            .enumerate()
            .map(|(i, item)| match key {
                ItemKey::Position => ItemId {
                    at: Some(i),
                    ..ItemId::default()
                },
                ItemKey::Fields(names) => {
                    let values: Map<String, Value> = names
                        .iter()
                        .map(|name| (name.clone(), item.get(name).cloned().unwrap_or(Value::Null)))
                        .collect();
                    let nth = seen.iter().filter(|other| **other == values).count();
                    seen.push(values.clone());
                    ItemId {
                        at: None,
                        key: Some(values),
                        nth,
                    }
                }
            })
            .collect()
    }

    /// How the item shows in a message (`[2]`, `[port=80]`).
    pub(super) fn shown(&self) -> String {
        match (&self.at, &self.key) {
            (Some(at), _) => format!("[{at}]"),
            (None, Some(key)) => {
                let pairs: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("[{}]", pairs.join(","))
            }
            (None, None) => "[]".to_owned(),
        }
    }
}

impl SavedFields {
    pub(super) fn is_empty(&self) -> bool {
        self.values.is_empty()
            && self.absent.is_empty()
            && self.created.is_empty()
            && self.changed.is_empty()
            && self.items.is_empty()
    }

    /// What the item `id` of the list `list` saved, made if it has nothing yet.
    pub(super) fn item_mut(&mut self, list: &str, id: &ItemId) -> &mut SavedFields {
        let entries = self.items.entry(list.to_owned()).or_default();
        let at = match entries.iter().position(|entry| entry.id == *id) {
            Some(at) => at,
            None => {
                entries.push(SavedItem {
                    id: id.clone(),
                    fields: SavedFields::default(),
                });
                entries.len() - 1
            }
        };
        &mut entries[at].fields
    }

    /// Forgets what was saved for items of `list` that are not among `ids` any more: it
    /// belongs to no item.
    pub(super) fn keep_items(&mut self, list: &str, ids: &[ItemId]) {
        if let Some(entries) = self.items.get_mut(list) {
            entries.retain(|entry| ids.contains(&entry.id));
        }
    }

    /// Drops empty records, items included.
    pub(super) fn prune(&mut self) {
        for entries in self.items.values_mut() {
            for entry in entries.iter_mut() {
                entry.fields.prune();
            }
            entries.retain(|entry| !entry.fields.is_empty());
        }
        self.items.retain(|_, entries| !entries.is_empty());
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

/// Writes what is saved into the annotation (none when nothing is). Refuses, as the
/// apiserver would refuse the converted object, to make the object's annotations larger than
/// [`MAX_ANNOTATIONS_BYTES`].
pub(super) fn put_saved(object: &mut Value, mut saved: Saved, to: &str) -> Result<(), ConversionError> {
    for fields in saved.values_mut() {
        fields.prune();
    }
    saved.retain(|_, fields| !fields.is_empty());
    if saved.is_empty() {
        return Ok(());
    }
    let text = serde_json::to_string(&saved).unwrap_or_default();
    let Some(object) = object.as_object_mut() else {
        return Ok(());
    };
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(metadata) = metadata.as_object_mut() else {
        return Ok(());
    };
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(annotations) = annotations.as_object_mut() else {
        return Ok(());
    };
    let others: usize = annotations
        .iter()
        .map(|(key, value)| key.len() + value.as_str().map_or(0, str::len))
        .sum();
    let total = others + CONVERSION_DATA_ANNOTATION.len() + text.len();
    if total > MAX_ANNOTATIONS_BYTES {
        return Err(ConversionError::SavedTooLarge {
            saved: text.len(),
            total,
            to: to.to_owned(),
        });
    }
    annotations.insert(CONVERSION_DATA_ANNOTATION.to_owned(), Value::String(text));
    Ok(())
}
