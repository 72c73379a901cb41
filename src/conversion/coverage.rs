//! Coverage: every field that differs between two adjacent versions' schemas is handled by a
//! rule of the step between them, so that the apiserver never silently prunes what a
//! conversion produces nor rejects it for its type. Fields of list items count one by one
//! (`spec.ports[].appProtocol`). A type change's expressions are opaque, so they are run on
//! values generated from the schemas: what one gives that the other version cannot hold is a
//! problem too. Pure; the schemas come from the CRD.

use std::collections::BTreeMap;

use crate::api::ConversionSpec;
use crate::field_errors::FieldErrors;
use crate::schema::{Field, Rng, Schema, fields, generate_value, validate_value};

use super::{Budget, ChangedRule, Converter, ITEMS, ItemKey, RulePath, segments_of, text_of};

/// Values generated per type change and direction to run its expressions on.
const SAMPLES: usize = 16;

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
        let normal =
            |text: &str| RulePath::parse(text).map_or_else(|_| text.to_owned(), |p| text_of(&p.segments()));
        let accepted: Vec<String> = step.accept_loss.iter().map(|loss| normal(&loss.path)).collect();
        let accepted: Vec<&str> = accepted.iter().map(String::as_str).collect();
        let changed: Vec<String> = step.changed.iter().map(|c| normal(&c.path)).collect();
        let changed: Vec<&str> = changed.iter().map(String::as_str).collect();
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
        check_item_keys(step, &at, &pair, &old_fields, &new_fields, &mut errors);
        for rule in converter.changed_rules(i) {
            check_changed(&rule, converter, step, (older, newer), &at, &pair, i, &mut errors);
        }
    }
    errors
}

/// A rule reaching into the items of a list whose items the schema matches by key
/// (`x-kubernetes-list-type: map`) must match them by those keys too: by position, what an
/// item saved would go to another item once a client inserts or removes one.
fn check_item_keys(
    step: &crate::api::ConversionStep,
    at: &str,
    pair: &str,
    old_fields: &BTreeMap<String, Field>,
    new_fields: &BTreeMap<String, Field>,
    errors: &mut FieldErrors,
) {
    let older_rules = step.removed.iter().chain(step.renamed.iter().map(|r| &r.from));
    let newer_rules = step
        .added
        .iter()
        .map(|a| &a.path)
        .chain(step.changed.iter().map(|c| &c.path))
        .chain(step.renamed.iter().map(|r| &r.to));
    let both = step.accept_loss.iter().map(|loss| &loss.path);
    let rules = older_rules
        .map(|text| (text, vec![old_fields]))
        .chain(newer_rules.map(|text| (text, vec![new_fields])))
        .chain(both.map(|text| (text, vec![old_fields, new_fields])));
    for (text, versions) in rules {
        let Ok(path) = RulePath::parse(text) else { continue };
        let mut prefix: Vec<String> = Vec::new();
        for list in &path.lists {
            prefix.extend(list.list.segments().iter().cloned());
            let list_path = text_of(&prefix);
            for fields in &versions {
                let Some(field) = fields.get(&list_path) else {
                    continue;
                };
                match (&field.map_keys, &list.key) {
                    (Some(keys), ItemKey::Fields(named)) if sorted(keys) == sorted(named) => {}
                    (Some(keys), _) => errors.push(
                        at.to_owned(),
                        format!(
                            "{pair}: {text}: the items of {list_path} are matched by {} (x-kubernetes-list-map-keys): write {list_path}[{}] so that what an item saved comes back to that item, wherever it moves",
                            keys.join(", "),
                            keys.join(",")
                        ),
                    ),
                    (None, ItemKey::Fields(named)) => {
                        let mut item = prefix.clone();
                        item.push(ITEMS.to_owned());
                        for name in named {
                            item.push(name.clone());
                            if !fields.contains_key(&text_of(&item)) {
                                errors.push(
                                    at.to_owned(),
                                    format!("{pair}: {text}: the items of {list_path} have no field {name} to be matched by"),
                                );
                            }
                            item.pop();
                        }
                    }
                    (None, ItemKey::Position) => {}
                }
            }
            prefix.push(ITEMS.to_owned());
        }
    }
}

fn sorted(names: &[String]) -> Vec<&String> {
    let mut names: Vec<&String> = names.iter().collect();
    names.sort();
    names
}

/// Runs a type change on values generated from each version's schema of its field: a result
/// holding what the other version has no place for (a field the apiserver would prune),
/// outside what the policy accepts to lose, is a loss the policy does not declare. A value
/// the other version would reject is not checked here (nothing is lost: the write fails;
/// `crd-lifecycle test` and the preflight report it), nor an expression that fails on a
/// sample (its object's conversion fails, loudly).
#[allow(clippy::too_many_arguments)]
fn check_changed(
    rule: &ChangedRule,
    converter: &Converter,
    step: &crate::api::ConversionStep,
    (older, newer): (&Schema, &Schema),
    at: &str,
    pair: &str,
    index: usize,
    errors: &mut FieldErrors,
) {
    let newer_path = rule.path.clone();
    let Some(older_path) = converter.translate_path(&newer_path, &step.to, &step.from) else {
        return;
    };
    let (Some(newer_node), Some(older_node)) = (newer.at(&newer_path), older.at(&older_path)) else {
        return;
    };
    let shown_path = text_of(&newer_path);
    let accepted: Vec<String> = rule.accepted.iter().map(|rest| text_of(rest)).collect();
    let directions = [
        ("downgrade", rule.downgrade, newer_node, older_node, &step.from),
        ("upgrade", rule.upgrade, older_node, newer_node, &step.to),
    ];
    for (seed, (direction, expression, source, target, target_version)) in directions.into_iter().enumerate()
    {
        let mut rng = Rng::new(0x5eed_0000 + (index as u64) * 1_000 + seed as u64);
        'samples: for _ in 0..SAMPLES {
            let Some(sample) = generate_value(source, &mut rng) else {
                continue;
            };
            let Ok(result) = expression.evaluate_within(&sample, &mut Budget::default()) else {
                continue;
            };
            for problem in validate_value(target, &result) {
                if !problem.message.starts_with("unknown field") {
                    continue;
                }
                let relative = normal_indices(&problem.path);
                if accepted
                    .iter()
                    .any(|loss| within(&relative, loss) || loss.is_empty())
                {
                    continue;
                }
                errors.push(
                    at.to_owned(),
                    format!(
                        "{pair}: {shown_path}: {direction} `{}` gives {} for {}, and {target_version} has no place for {}: the apiserver would prune it; make the expression drop it (what it drops is kept in the conversion-data annotation) or declare the loss (acceptLoss)",
                        expression.source(),
                        short(&result),
                        short(&sample),
                        join(&shown_path, &problem.path),
                    ),
                );
                break 'samples;
            }
        }
    }
}

/// A problem's path below a field, joined to the field's (`spec.ports` + `[0].name`).
fn join(field: &str, relative: &str) -> String {
    match relative {
        "" => field.to_owned(),
        r if r.starts_with('[') => format!("{field}{r}"),
        r => format!("{field}.{r}"),
    }
}

/// `[0].name` as `[].name`: the path of any item.
fn normal_indices(path: &str) -> String {
    text_of(
        &segments_of(path)
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>(),
    )
}

fn short(value: &serde_json::Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= 60 {
        return text;
    }
    format!("{}...", text.chars().take(60).collect::<String>())
}

/// As [`check`], for a CRD manifest (JSON): its versions' schemas.
pub fn check_crd(spec: &ConversionSpec, converter: &Converter, crd: &serde_json::Value) -> FieldErrors {
    check(spec, converter, &crate::schema::version_schemas(crd))
}

/// `path` is `root` or below it (a field of it, or its items).
fn within(path: &str, root: &str) -> bool {
    path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// An object field with fields of its own listed: it is covered by its fields.
fn is_container(path: &str, all: &BTreeMap<String, Field>) -> bool {
    let prefix = format!("{path}.");
    let items = format!("{path}[]");
    all.range(prefix.clone()..)
        .next()
        .is_some_and(|(next, _)| next.starts_with(&prefix))
        || all.contains_key(&items)
}

/// A parent of `path` keeps unknown fields, so the apiserver keeps it.
fn kept_open(path: &str, all: &BTreeMap<String, Field>) -> bool {
    let segments = segments_of(path);
    (1..segments.len()).any(|end| {
        all.get(&text_of(&segments[..end]))
            .is_some_and(|field| field.open)
    })
}

fn translate(converter: &Converter, path: &str, from: &str, to: &str) -> Option<String> {
    converter
        .translate_path(&segments_of(path), from, to)
        .map(|moved| text_of(&moved))
}

fn shown(default: &Option<serde_json::Value>) -> String {
    default
        .as_ref()
        .map_or_else(|| "nothing".to_owned(), |value| value.to_string())
}
