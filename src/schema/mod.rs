//! Structural schemas of a CRD's versions (`openAPIV3Schema`), as the apiserver applies them
//! to objects: the fields each version has and their types (for conversion coverage), the
//! validation and pruning of an object, and objects generated from a schema (for `test`).
//! Pure: plain JSON in, plain data out.

mod fields;
mod generate;
mod validate;

use std::collections::BTreeMap;

use serde_json::Value;

pub use fields::{Field, fields};
pub use generate::{Rng, generate, generate_value};
pub use validate::{Problem, served, validate, validate_value};

/// One node of a structural schema.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schema {
    /// `object`, `array`, `string`, `integer`, `number` or `boolean`; `None` with
    /// `x-kubernetes-preserve-unknown-fields` or `x-kubernetes-int-or-string`.
    pub kind: Option<String>,
    pub properties: BTreeMap<String, Schema>,
    /// `additionalProperties`: a map whose values have this schema.
    pub additional_properties: Option<Box<Schema>>,
    pub items: Option<Box<Schema>>,
    pub preserve_unknown_fields: bool,
    pub int_or_string: bool,
    pub embedded_resource: bool,
    pub nullable: bool,
    pub required: Vec<String>,
    pub enum_values: Option<Vec<Value>>,
    pub format: Option<String>,
    pub pattern: Option<String>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
    pub exclusive_minimum: bool,
    pub exclusive_maximum: bool,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub min_properties: Option<u64>,
    pub max_properties: Option<u64>,
    pub multiple_of: Option<f64>,
    pub default: Option<Value>,
    /// `x-kubernetes-list-type` (`atomic`, `set`, `map`).
    pub list_type: Option<String>,
    /// `x-kubernetes-list-map-keys` of a `map` list.
    pub list_map_keys: Vec<String>,
    /// Value validations that must all hold, at least one, exactly one, or not hold.
    pub all_of: Vec<Schema>,
    pub any_of: Vec<Schema>,
    pub one_of: Vec<Schema>,
    pub not: Option<Box<Schema>>,
}

impl Schema {
    /// Reads a `JSONSchemaProps` (as JSON). Unknown keywords are ignored: the apiserver has
    /// already accepted the CRD.
    pub fn parse(value: &Value) -> Schema {
        let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
        let number = |key: &str| value.get(key).and_then(Value::as_f64);
        let count = |key: &str| value.get(key).and_then(Value::as_u64);
        let flag = |key: &str| value.get(key).and_then(Value::as_bool).unwrap_or(false);
        let properties = value
            .get("properties")
            .and_then(Value::as_object)
            .map(|props| props.iter().map(|(k, v)| (k.clone(), Schema::parse(v))).collect())
            .unwrap_or_default();
        let additional_properties = match value.get("additionalProperties") {
            Some(Value::Object(schema)) => Some(Box::new(Schema::parse(&Value::Object(schema.clone())))),
            Some(Value::Bool(true)) => Some(Box::new(Schema {
                preserve_unknown_fields: true,
                ..Schema::default()
            })),
            _ => None,
        };
        let strings = |key: &str| -> Vec<String> {
            value
                .get(key)
                .and_then(Value::as_array)
                .map(|names| {
                    names
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let schemas = |key: &str| -> Vec<Schema> {
            value
                .get(key)
                .and_then(Value::as_array)
                .map(|all| all.iter().map(Schema::parse).collect())
                .unwrap_or_default()
        };
        Schema {
            kind: text("type"),
            properties,
            additional_properties,
            items: value.get("items").map(|items| Box::new(Schema::parse(items))),
            preserve_unknown_fields: flag("x-kubernetes-preserve-unknown-fields"),
            int_or_string: flag("x-kubernetes-int-or-string"),
            embedded_resource: flag("x-kubernetes-embedded-resource"),
            nullable: flag("nullable"),
            required: strings("required"),
            enum_values: value.get("enum").and_then(Value::as_array).cloned(),
            format: text("format"),
            pattern: text("pattern"),
            minimum: number("minimum"),
            maximum: number("maximum"),
            exclusive_minimum: flag("exclusiveMinimum"),
            exclusive_maximum: flag("exclusiveMaximum"),
            min_length: count("minLength"),
            max_length: count("maxLength"),
            min_items: count("minItems"),
            max_items: count("maxItems"),
            min_properties: count("minProperties"),
            max_properties: count("maxProperties"),
            multiple_of: number("multipleOf"),
            default: value.get("default").cloned(),
            list_type: text("x-kubernetes-list-type"),
            list_map_keys: strings("x-kubernetes-list-map-keys"),
            all_of: schemas("allOf"),
            any_of: schemas("anyOf"),
            one_of: schemas("oneOf"),
            not: value.get("not").map(|not| Box::new(Schema::parse(not))),
        }
    }
}

impl Schema {
    /// The schema at a path of field names below this node, where `[]` stands for the items
    /// of a list (`["spec", "ports", "[]", "name"]`).
    pub fn at(&self, segments: &[String]) -> Option<&Schema> {
        segments.iter().try_fold(self, |node, segment| {
            if segment == "[]" {
                node.items.as_deref()
            } else {
                node.properties.get(segment)
            }
        })
    }
}

/// Each version's `schema.openAPIV3Schema` of a CRD, as JSON, by version name; versions
/// without one are left out.
pub fn schemas_of(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> BTreeMap<String, Value> {
    crd.spec
        .versions
        .iter()
        .filter_map(|v| {
            let schema = v.schema.as_ref()?.open_api_v3_schema.as_ref()?;
            Some((v.name.clone(), serde_json::to_value(schema).ok()?))
        })
        .collect()
}

/// The schemas of a CRD's versions, by version name, from the CRD manifest (JSON). Versions
/// without a schema are left out.
pub fn version_schemas(crd: &Value) -> BTreeMap<String, Schema> {
    let shared = crd.pointer("/spec/validation/openAPIV3Schema");
    crd.pointer("/spec/versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|version| {
            let name = version.get("name")?.as_str()?;
            let schema = version.pointer("/schema/openAPIV3Schema").or(shared)?;
            Some((name.to_owned(), Schema::parse(schema)))
        })
        .collect()
}
