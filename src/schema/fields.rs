//! The fields a schema gives an object, each with the type of value it holds, for comparing
//! two versions.

use std::collections::BTreeMap;

use super::Schema;

/// A field of a version: its type as a comparable signature (`string`, `integer`,
/// `array<string>`, `map<integer>`, `int-or-string`, `object`...), whether its subtree keeps
/// unknown fields, and its default.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub signature: String,
    /// Fields below it are not listed: it keeps whatever it is given.
    pub open: bool,
    pub default: Option<serde_json::Value>,
    /// For a list whose items are matched by key (`x-kubernetes-list-type: map`), its
    /// `x-kubernetes-list-map-keys`.
    pub map_keys: Option<Vec<String>>,
}

/// Every field path below the root (`spec.port`, `spec.scale.replicas`), outside
/// `apiVersion`, `kind` and `metadata`. Objects with properties are walked, and so are the
/// items of lists of such objects (`spec.ports[]`, `spec.ports[].name`); maps and other
/// lists are leaves whose signature includes their element's.
pub fn fields(root: &Schema) -> BTreeMap<String, Field> {
    let mut out = BTreeMap::new();
    for (name, child) in &root.properties {
        if matches!(name.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        walk(name, child, &mut out);
    }
    out
}

fn walk(path: &str, schema: &Schema, out: &mut BTreeMap<String, Field>) {
    out.insert(
        path.to_owned(),
        Field {
            signature: signature(schema),
            open: schema.preserve_unknown_fields || schema.embedded_resource,
            default: schema.default.clone(),
            map_keys: (schema.list_type.as_deref() == Some("map")).then(|| schema.list_map_keys.clone()),
        },
    );
    if let Some(items) = walked_items(schema) {
        walk(&format!("{path}[]"), items, out);
        return;
    }
    if schema.additional_properties.is_some() {
        return;
    }
    for (name, child) in &schema.properties {
        walk(&format!("{path}.{name}"), child, out);
    }
}

/// The items of a list that are objects with fields of their own: walked field by field.
fn walked_items(schema: &Schema) -> Option<&Schema> {
    let items = schema.items.as_deref()?;
    (schema.kind.as_deref() == Some("array")
        && !items.properties.is_empty()
        && items.additional_properties.is_none())
    .then_some(items)
}

/// The type of value a node holds. Objects with properties are `object` (their fields are
/// compared one by one); inside arrays and maps the whole element type counts.
pub fn signature(schema: &Schema) -> String {
    let base = if schema.int_or_string {
        "int-or-string".to_owned()
    } else {
        match schema.kind.as_deref() {
            // Walked item by item (`fields`).
            Some("array") if walked_items(schema).is_some() => "array<object>".to_owned(),
            Some("array") => format!(
                "array<{}>",
                schema
                    .items
                    .as_deref()
                    .map_or_else(|| "any".to_owned(), deep_signature)
            ),
            Some("object") if schema.additional_properties.is_some() => format!(
                "map<{}>",
                schema
                    .additional_properties
                    .as_deref()
                    .map_or_else(|| "any".to_owned(), deep_signature)
            ),
            Some(kind) => kind.to_owned(),
            None if schema.preserve_unknown_fields => "any".to_owned(),
            None => "any".to_owned(),
        }
    };
    if schema.nullable { format!("{base}?") } else { base }
}

/// A signature that includes an object's fields (for elements of arrays and maps).
fn deep_signature(schema: &Schema) -> String {
    let base = signature(schema);
    if schema.properties.is_empty() {
        return base;
    }
    let fields: Vec<String> = schema
        .properties
        .iter()
        .map(|(name, child)| format!("{name}: {}", deep_signature(child)))
        .collect();
    format!("{base}{{{}}}", fields.join(", "))
}
