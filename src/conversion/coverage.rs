//! Coverage: every field that differs between two adjacent versions' schemas is handled by a
//! rule of the step between them, so that the apiserver never silently prunes what a
//! conversion produces nor rejects it for its type. Pure; the schemas come from the CRD.

use std::collections::BTreeMap;

use crate::api::ConversionSpec;
use crate::field_errors::FieldErrors;
use crate::schema::{Field, Schema, fields};

use super::Converter;

/// Problems of the conversion against the versions' schemas, each at
/// `spec.conversion.changes[i]`, naming the two versions and the field path. Steps whose
/// versions have no schema are not compared.
pub fn check(
    spec: &ConversionSpec,
    converter: &Converter,
    schemas: &BTreeMap<String, Schema>,
) -> FieldErrors {
    let mut errors = FieldErrors::default();
    for (i, step) in spec.changes.iter().enumerate() {
        let (Some(older), Some(newer)) = (schemas.get(&step.from), schemas.get(&step.to)) else {
            continue;
        };
        let at = format!("spec.conversion.changes[{i}]");
        let accepted: Vec<&str> = step.accept_loss.iter().map(|loss| loss.path.as_str()).collect();
        let changed: Vec<&str> = step.changed.iter().map(|c| c.path.as_str()).collect();
        let (old_fields, new_fields) = (fields(older), fields(newer));
        let pair = format!("{} -> {}", step.from, step.to);
        let under = |path: &str, roots: &[&str]| roots.iter().any(|root| within(path, root));
        // Up: every field of the older version lands somewhere in the newer one.
        for (path, field) in &old_fields {
            if is_container(path, &old_fields) {
                continue;
            }
            // A loss can be accepted; a wrong type cannot (the apiserver rejects it on write).
            let lost_on_purpose = under(path, &accepted);
            let Some(moved) = translate(converter, path, &step.from, &step.to) else {
                continue; // removed: kept in the conversion-data annotation
            };
            if under(&moved, &changed) {
                continue;
            }
            match new_fields.get(&moved) {
                Some(other) if other.signature != field.signature => errors.push(
                    at.clone(),
                    format!(
                        "{pair}: {moved} is {} in {} and {} in {}: add a changed rule for {moved}",
                        field.signature, step.from, other.signature, step.to
                    ),
                ),
                Some(other) if other.default != field.default && !lost_on_purpose => errors.push(
                    at.clone(),
                    format!(
                        "{pair}: {moved} defaults to {} in {} and to {} in {}: objects that omit it read differently in each; add a changed rule for {moved} (or acceptLoss)",
                        shown(&field.default),
                        step.from,
                        shown(&other.default),
                        step.to
                    ),
                ),
                Some(_) => {}
                None if lost_on_purpose || kept_open(&moved, &new_fields) => {}
                None => errors.push(
                    at.clone(),
                    format!(
                        "{pair}: {path} ({}) of {} has no place in {}: the apiserver would prune it; add a removed, renamed or changed rule for it (or acceptLoss)",
                        field.signature, step.from, step.to
                    ),
                ),
            }
        }
        // Down: every field of the newer version comes from somewhere in the older one.
        for (path, field) in &new_fields {
            if under(path, &accepted) || under(path, &changed) || is_container(path, &new_fields) {
                continue;
            }
            let Some(back) = translate(converter, path, &step.to, &step.from) else {
                continue; // added: saved going down, defaulted going up
            };
            if old_fields.contains_key(&back) || kept_open(&back, &old_fields) {
                continue;
            }
            errors.push(
                at.clone(),
                format!(
                    "{pair}: {path} ({}) of {} has no place in {}: converting down would lose it; add an added or renamed rule for it (or acceptLoss)",
                    field.signature, step.to, step.from
                ),
            );
        }
    }
    errors
}

/// As [`check`], for a CRD manifest (JSON): its versions' schemas.
pub fn check_crd(spec: &ConversionSpec, converter: &Converter, crd: &serde_json::Value) -> FieldErrors {
    check(spec, converter, &crate::schema::version_schemas(crd))
}

/// `path` is `root` or below it.
fn within(path: &str, root: &str) -> bool {
    path == root || path.strip_prefix(root).is_some_and(|rest| rest.starts_with('.'))
}

/// An object field with fields of its own listed: it is covered by its fields.
fn is_container(path: &str, all: &BTreeMap<String, Field>) -> bool {
    let prefix = format!("{path}.");
    all.range(prefix.clone()..)
        .next()
        .is_some_and(|(next, _)| next.starts_with(&prefix))
}

/// A parent of `path` keeps unknown fields, so the apiserver keeps it.
fn kept_open(path: &str, all: &BTreeMap<String, Field>) -> bool {
    let mut parent = path;
    while let Some((head, _)) = parent.rsplit_once('.') {
        if all.get(head).is_some_and(|field| field.open) {
            return true;
        }
        parent = head;
    }
    false
}

fn translate(converter: &Converter, path: &str, from: &str, to: &str) -> Option<String> {
    let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
    converter
        .translate_path(&segments, from, to)
        .map(|moved| moved.join("."))
}

fn shown(default: &Option<serde_json::Value>) -> String {
    default
        .as_ref()
        .map_or_else(|| "nothing".to_owned(), |value| value.to_string())
}
