//! The checks of `crd-lifecycle test` on plain data: every object converts to every other
//! version, the result fits that version's schema (nothing pruned, nothing rejected), and
//! converting back gives the object exactly. A failure is shrunk to the smallest object that
//! still fails the same way.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use crate::conversion::Converter;
use crate::schema::{Schema, validate};

/// What the checks need of the CRD.
pub struct Crd {
    pub group: String,
    pub kind: String,
    pub namespaced: bool,
    /// The versions in the CRD's order.
    pub versions: Vec<String>,
    pub schemas: BTreeMap<String, Schema>,
    /// Paths whose loss the policy accepts (`acceptLoss`): pruned, as the apiserver would,
    /// and not expected back.
    pub accepted_losses: Vec<String>,
}

/// One failed check.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// What was checked, e.g. `v1beta1 -> v1` or `v1beta1 -> v1 -> v1beta1`.
    pub conversion: String,
    /// The field path where it failed (empty for the whole object).
    pub path: String,
    pub message: String,
    /// The object that fails (shrunk once `shrink` ran), in its own version.
    pub object: Value,
}

/// An object and what it converts to in every other version (the golden corpus).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Case {
    pub input: Value,
    pub outputs: BTreeMap<String, Value>,
}

impl Crd {
    /// A whole object of `version` around generated `fields`.
    pub fn object(&self, version: &str, name: &str, fields: Map<String, Value>) -> Value {
        let mut object = Map::new();
        object.insert(
            "apiVersion".into(),
            Value::String(format!("{}/{version}", self.group)),
        );
        object.insert("kind".into(), Value::String(self.kind.clone()));
        let mut metadata = Map::new();
        metadata.insert("name".into(), Value::String(name.to_owned()));
        if self.namespaced {
            metadata.insert("namespace".into(), Value::String("default".into()));
        }
        object.insert("metadata".into(), Value::Object(metadata));
        object.extend(fields);
        Value::Object(object)
    }
}

/// The version an object is in.
pub fn version_of(object: &Value) -> Option<&str> {
    object
        .get("apiVersion")?
        .as_str()?
        .rsplit_once('/')
        .map(|(_, v)| v)
}

/// Converts `object` to every other version and back; the case, or the first failure.
pub fn check(converter: &Converter, crd: &Crd, object: &Value) -> Result<Case, Box<Failure>> {
    let from = version_of(object).unwrap_or_default().to_owned();
    let fail = |conversion: String, path: String, message: String| {
        Box::new(Failure {
            conversion,
            path,
            message,
            object: object.clone(),
        })
    };
    if let Some(schema) = crd.schemas.get(&from)
        && let Some(problem) = validate(schema, object).into_iter().next()
    {
        return Err(fail(
            format!("{from} (the object itself)"),
            problem.path,
            format!(
                "the object does not fit its own version's schema: {}",
                problem.message
            ),
        ));
    }
    let mut outputs = BTreeMap::new();
    for to in crd.versions.iter().filter(|v| **v != from) {
        let there = format!("{from} -> {to}");
        let (converted, pruned) = convert_as_served(converter, crd, object, to)
            .map_err(|(path, message)| fail(there.clone(), path, message))?;
        let mut expected_back = object.clone();
        for path in &pruned {
            remove_path(&mut expected_back, path);
        }
        let back_path = format!("{from} -> {to} -> {from}");
        let back = converter
            .convert(&converted, &from)
            .map_err(|e| fail(back_path.clone(), error_path(&e), e.to_string()))?;
        if let Some((path, was, now)) = round_trip_difference(&expected_back, &back) {
            return Err(fail(
                back_path,
                path,
                format!("the round trip is not exact: {was} came back as {now}"),
            ));
        }
        outputs.insert(to.clone(), converted);
    }
    Ok(Case {
        input: object.clone(),
        outputs,
    })
}

/// Converts `object` to `to` and applies what the apiserver would: fields whose loss the
/// policy accepts are pruned (their paths returned); any other problem against the target
/// schema is an error (its path and message).
pub fn convert_as_served(
    converter: &Converter,
    crd: &Crd,
    object: &Value,
    to: &str,
) -> Result<(Value, Vec<String>), (String, String)> {
    let mut converted = converter
        .convert(object, to)
        .map_err(|e| (error_path(&e), e.to_string()))?;
    let mut pruned = Vec::new();
    if let Some(schema) = crd.schemas.get(to) {
        for problem in validate(schema, &converted) {
            if problem.message.starts_with("unknown field") {
                // An empty object loses nothing when pruned (the conversion keeps parents
                // the object had; converting back brings them back): whether anything was
                // lost shows in the round trip.
                let empty = get_path(&converted, &problem.path).is_some_and(holds_nothing);
                let any_item = normal_items(&problem.path);
                let accepted = crd
                    .accepted_losses
                    .iter()
                    .any(|loss| within(&any_item, &normal_items(loss)));
                if empty || accepted {
                    remove_path(&mut converted, &problem.path);
                    if accepted {
                        pruned.push(problem.path);
                    }
                    continue;
                }
            }
            return Err((problem.path.clone(), problem.to_string()));
        }
    }
    Ok((converted, pruned))
}

/// The first difference, looking at the object's own fields before its metadata (where a
/// difference is usually the consequence of one in a field).
fn round_trip_difference(expected: &Value, actual: &Value) -> Option<(String, String, String)> {
    let without_metadata = |value: &Value| {
        let mut value = value.clone();
        if let Some(fields) = value.as_object_mut() {
            fields.remove("metadata");
        }
        value
    };
    first_difference(&without_metadata(expected), &without_metadata(actual), "")
        .or_else(|| first_difference(expected, actual, ""))
}

fn within(path: &str, root: &str) -> bool {
    path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// A path with every list position or key written `[]` (`spec.ports[2].name`,
/// `spec.ports[port].name` → `spec.ports[].name`).
fn normal_items(path: &str) -> String {
    crate::conversion::text_of(&crate::conversion::segments_of(path))
}

/// An object holding nothing but (objects holding nothing but) empty objects.
fn holds_nothing(value: &Value) -> bool {
    value
        .as_object()
        .is_some_and(|fields| fields.values().all(holds_nothing))
}

/// The steps of a problem's path: field names and list positions (`spec.ports[2].name`).
fn steps_of(path: &str) -> Vec<PathStep<'_>> {
    let mut steps = Vec::new();
    for part in path.split('.') {
        let (name, mut rest) = part
            .split_once('[')
            .map_or((part, ""), |(name, rest)| (name, rest));
        if !name.is_empty() {
            steps.push(PathStep::Field(name));
        }
        while let Some((index, after)) = rest.split_once(']') {
            steps.push(PathStep::Item(index.parse().unwrap_or(usize::MAX)));
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    steps
}

enum PathStep<'a> {
    Field(&'a str),
    Item(usize),
}

fn get_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    steps_of(path).into_iter().try_fold(value, |v, step| match step {
        PathStep::Field(name) => v.get(name),
        PathStep::Item(i) => v.get(i),
    })
}

/// Removes the field at a problem's path (`spec.ports[2].name`).
fn remove_path(value: &mut Value, path: &str) {
    let mut steps = steps_of(path);
    let Some(PathStep::Field(last)) = steps.pop() else {
        return;
    };
    let mut current = value;
    for step in steps {
        let next = match step {
            PathStep::Field(name) => current.get_mut(name),
            PathStep::Item(i) => current.get_mut(i),
        };
        match next {
            Some(next) => current = next,
            None => return,
        }
    }
    if let Some(fields) = current.as_object_mut() {
        fields.remove(last);
    }
}

fn error_path(error: &crate::conversion::ConversionError) -> String {
    match error {
        crate::conversion::ConversionError::Expression { path, .. } => path.clone(),
        crate::conversion::ConversionError::TargetTaken { to, .. } => to.clone(),
        crate::conversion::ConversionError::NotAnObject { path, .. } => path.clone(),
        _ => String::new(),
    }
}

/// Where two values first differ: the path and both sides (`(absent)` for a missing field).
pub fn first_difference(a: &Value, b: &Value, path: &str) -> Option<(String, String, String)> {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (key, value) in x {
                match y.get(key) {
                    Some(other) => {
                        if let Some(found) = first_difference(value, other, &join(key)) {
                            return Some(found);
                        }
                    }
                    None => return Some((join(key), value.to_string(), "(absent)".into())),
                }
            }
            y.iter()
                .find(|(key, _)| !x.contains_key(*key))
                .map(|(key, value)| (join(key), "(absent)".into(), value.to_string()))
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, &format!("{path}[{i}]"))),
        _ if a == b => None,
        _ => Some((path.to_owned(), a.to_string(), b.to_string())),
    }
}

/// The smallest object it finds that still fails the same check (same conversion) and
/// still fits its own schema: fields dropped, strings, lists and numbers made smaller.
pub fn shrink(converter: &Converter, crd: &Crd, failure: Failure) -> Failure {
    let version = version_of(&failure.object).unwrap_or_default().to_owned();
    let schema = crd.schemas.get(&version);
    let still_fails = |candidate: &Value| -> Option<Failure> {
        if schema.is_some_and(|s| !validate(s, candidate).is_empty()) {
            return None;
        }
        match check(converter, crd, candidate) {
            Err(f) if f.conversion == failure.conversion => Some(*f),
            _ => None,
        }
    };
    let mut best = failure.clone();
    for _ in 0..200 {
        let next = candidates(&best.object).into_iter().find_map(|c| still_fails(&c));
        match next {
            Some(smaller) => best = smaller,
            None => break,
        }
    }
    best
}

/// Objects one step smaller than `object`, outside apiVersion, kind and metadata.
fn candidates(object: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    let Some(fields) = object.as_object() else {
        return out;
    };
    for (key, value) in fields {
        if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let mut without = fields.clone();
        without.remove(key);
        out.push(Value::Object(without));
        for smaller in smaller_values(value) {
            let mut replaced = fields.clone();
            replaced.insert(key.clone(), smaller);
            out.push(Value::Object(replaced));
        }
    }
    out
}

fn smaller_values(value: &Value) -> Vec<Value> {
    match value {
        Value::Object(fields) => {
            let mut out = Vec::new();
            for (key, child) in fields {
                let mut without = fields.clone();
                without.remove(key);
                out.push(Value::Object(without));
                for smaller in smaller_values(child) {
                    let mut replaced = fields.clone();
                    replaced.insert(key.clone(), smaller);
                    out.push(Value::Object(replaced));
                }
            }
            out
        }
        Value::Array(items) if !items.is_empty() => {
            let mut out = vec![Value::Array(items[..items.len() - 1].to_vec())];
            if items.len() > 1 {
                out.push(Value::Array(items[1..].to_vec()));
            }
            out
        }
        Value::String(text) if !text.is_empty() => {
            let chars: Vec<char> = text.chars().collect();
            vec![
                Value::String(chars[..chars.len() - 1].iter().collect()),
                Value::String(chars[1..].iter().collect()),
            ]
        }
        Value::Number(n) if n.as_i64().is_some_and(|i| i != 0) => {
            let i = n.as_i64().unwrap_or_default();
            vec![Value::from(0), Value::from(i / 2)]
        }
        _ => Vec::new(),
    }
}
