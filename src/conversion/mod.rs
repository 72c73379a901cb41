//! Declarative conversion between a CRD's versions (pure; the webhook and `convert` use
//! it).
//!
//! Each step between adjacent versions renames, adds, removes and changes fields. Converting
//! up a step (older → newer): removed fields are saved, renamed fields move, changed fields
//! convert with their `upgrade` expression (the original is saved when `downgrade` would
//! not give it back), added fields are restored from what was saved or take their default.
//! Down (newer → older): added fields are saved (unless they hold the default) and
//! dropped, changed fields get their saved original back (while their value is still what
//! it was converted to) or convert with `downgrade`, renamed fields move back, removed
//! fields are restored. What a version cannot hold is saved in the annotation
//! `crdlifecycle.io/conversion-data` (JSON, keyed by the version the data belongs to), the
//! way Kubernetes round-trips fields through annotations between built-in API versions, so
//! that A → B → A gives back the original object exactly (apart from the annotation, which
//! is gone again once nothing is saved).

pub mod cel;
pub mod coverage;
mod path;
mod saved;
mod step;

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::ConversionSpec;
use crate::field_errors::FieldErrors;
pub use cel::{Budget, Expression};
pub use path::{FieldPath, ITEMS, ItemKey, ListStep, RulePath, segments_of, text_of};
pub use saved::MAX_ANNOTATIONS_BYTES;
use saved::{put_saved, take_saved};
use step::{Changed, Scope, Step};

/// The annotation holding what a version cannot hold.
pub const CONVERSION_DATA_ANNOTATION: &str = "crdlifecycle.io/conversion-data";

/// The annotation on a CRD recording the conversion its `spec.conversion` relies on (a
/// `RecordedConversion` as JSON), written in the same guarded patch that points the CRD at
/// the webhook: the webhook still finds it after the policy is gone.
pub const CRD_CONVERSION_ANNOTATION: &str = "crdlifecycle.io/conversion";

/// The annotation on a CRD recording its `spec.conversion` from before the webhook took
/// over (JSON), restored when the policy turns its webhook off.
pub const CRD_CONVERSION_BEFORE_ANNOTATION: &str = "crdlifecycle.io/conversion-before";

/// The conversion a CRD relies on, as recorded on it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RecordedConversion {
    /// The VersionPolicy that configured it (the webhook path is `/convert/<policy>`).
    pub policy: String,
    /// Its declarative conversion.
    pub conversion: ConversionSpec,
}

impl RecordedConversion {
    /// The record on a CRD, from its annotations.
    pub fn from_annotations(annotations: Option<&BTreeMap<String, String>>) -> Option<RecordedConversion> {
        let text = annotations?.get(CRD_CONVERSION_ANNOTATION)?;
        serde_json::from_str(text).ok()
    }
}

/// `namespace/name` (or `name`) of an object, for messages.
pub fn object_name(object: &Value) -> String {
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("(unnamed)");
    match object.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_owned(),
    }
}

/// Why an object cannot be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConversionError {
    #[error("object has no apiVersion of the form <group>/<version>")]
    NoApiVersion,
    #[error("unknown version {version} (the conversion chain has {known})")]
    UnknownVersion { version: String, known: String },
    #[error("cannot move {from} to {to}: {to} is already set")]
    TargetTaken { from: String, to: String },
    #[error("{path} cannot be set: {blocker} is not an object")]
    NotAnObject { path: String, blocker: String },
    #[error("the {CONVERSION_DATA_ANNOTATION} annotation is not valid JSON: {0}")]
    BadAnnotation(String),
    #[error(
        "what {to} cannot hold would take {saved} bytes in the {CONVERSION_DATA_ANNOTATION} annotation, making the object's annotations {total} bytes; the apiserver allows {MAX_ANNOTATIONS_BYTES}"
    )]
    SavedTooLarge { saved: usize, total: usize, to: String },
    #[error("{path}: {direction} `{expression}` failed on {value}: {message}")]
    Expression {
        path: String,
        direction: &'static str,
        expression: String,
        value: String,
        message: String,
        /// Whether a cost or size limit stopped it (rather than an error on this value).
        over_limit: bool,
    },
}

impl ConversionError {
    /// Whether a cost or size limit of an expression stopped the conversion.
    pub fn is_over_limit(&self) -> bool {
        matches!(self, ConversionError::Expression { over_limit: true, .. })
    }
}

/// A type change of a step, for checking its expressions against the versions' schemas.
pub struct ChangedRule<'a> {
    /// The field's path in the newer version, as segments ([`ITEMS`] for a list's items).
    pub path: Vec<String>,
    pub upgrade: &'a Expression,
    pub downgrade: &'a Expression,
    /// Parts below the field whose loss the policy accepts, as segments from it.
    pub accepted: &'a [Vec<String>],
}

/// A validated chain of conversion steps.
pub struct Converter {
    /// The versions, oldest first.
    versions: Vec<String>,
    /// `steps[i]` converts `versions[i]` ↔ `versions[i + 1]`.
    steps: Vec<Step>,
    /// `rules[i]`: the paths of `steps[i]`'s rules as segments, for translating paths.
    rules: Vec<StepPaths>,
}

/// A step's renames, additions and removals as whole paths' segments (lists as [`ITEMS`]).
#[derive(Default)]
struct StepPaths {
    renamed: Vec<(Vec<String>, Vec<String>)>,
    added: Vec<Vec<String>>,
    removed: Vec<Vec<String>>,
}

/// The scope of `root` that the rules inside `lists` apply in, made on the way.
fn scope_for<'a>(root: &'a mut Scope, lists: &[path::ListStep]) -> &'a mut Scope {
    let mut scope = root;
    for list in lists {
        let at = match scope.lists.iter().position(|(known, _)| known == list) {
            Some(at) => at,
            None => {
                scope.lists.push((list.clone(), Scope::default()));
                scope.lists.len() - 1
            }
        };
        scope = &mut scope.lists[at].1;
    }
    scope
}

/// Whether segments `path` are `root` or below it.
fn is_within(path: &[String], root: &[String]) -> bool {
    path.starts_with(root)
}

impl Converter {
    /// Validates the steps (one chain over `crd_versions`, well-formed paths, no path both
    /// renamed and removed in a step) and builds the converter. The chain may also name
    /// `former_versions` (versions the policy governs that are already gone from the CRD).
    /// Errors name their field path, e.g. `spec.conversion.changes[1].renamed[0].to`.
    pub fn new(
        spec: &ConversionSpec,
        crd_versions: &[String],
        former_versions: &[String],
    ) -> Result<Converter, FieldErrors> {
        let mut errors = FieldErrors::default();
        let mut versions: Vec<String> = Vec::new();
        let mut steps = Vec::new();
        let mut rules = Vec::new();
        for (i, change) in spec.changes.iter().enumerate() {
            let base = format!("spec.conversion.changes[{i}]");
            match versions.last() {
                None => versions.push(change.from.clone()),
                Some(last) if *last == change.from => {}
                Some(last) => errors.push(
                    format!("{base}.from"),
                    format!("steps must form one chain: this step starts at {} but the previous one ends at {last}", change.from),
                ),
            }
            if versions.contains(&change.to) {
                errors.push(
                    format!("{base}.to"),
                    format!("{} appears twice in the chain", change.to),
                );
            }
            versions.push(change.to.clone());
            for (field, version) in [("from", &change.from), ("to", &change.to)] {
                if !crd_versions.contains(version) && !former_versions.contains(version) {
                    errors.push(
                        format!("{base}.{field}"),
                        format!(
                            "{version} is not a version of the CRD ({})",
                            crd_versions.join(", ")
                        ),
                    );
                }
            }
            let mut parse = |text: &str, at: String| match RulePath::parse(text) {
                Ok(path) => Some((path, at)),
                Err(message) => {
                    errors.push(at, message);
                    None
                }
            };
            let renamed: Vec<((RulePath, String), (RulePath, String))> = change
                .renamed
                .iter()
                .enumerate()
                .filter_map(|(j, r)| {
                    let from = parse(&r.from, format!("{base}.renamed[{j}].from"));
                    let to = parse(&r.to, format!("{base}.renamed[{j}].to"));
                    from.zip(to)
                })
                .collect();
            let added: Vec<((RulePath, String), Value)> = change
                .added
                .iter()
                .enumerate()
                .filter_map(|(j, a)| {
                    parse(&a.path, format!("{base}.added[{j}].path")).map(|p| (p, a.default.clone()))
                })
                .collect();
            let removed: Vec<(RulePath, String)> = change
                .removed
                .iter()
                .enumerate()
                .filter_map(|(j, r)| parse(r, format!("{base}.removed[{j}]")))
                .collect();
            let accepted: Vec<(RulePath, String)> = change
                .accept_loss
                .iter()
                .enumerate()
                .filter_map(|(j, loss)| parse(&loss.path, format!("{base}.acceptLoss[{j}].path")))
                .collect();
            let mut changed_paths: Vec<(RulePath, String)> = Vec::new();
            let mut changed_expressions = Vec::new();
            for (j, field) in change.changed.iter().enumerate() {
                let at = format!("{base}.changed[{j}]");
                let path = match RulePath::parse(&field.path) {
                    Ok(path) => Some((path, format!("{at}.path"))),
                    Err(message) => {
                        errors.push(format!("{at}.path"), message);
                        None
                    }
                };
                let upgrade = Expression::compile(&field.upgrade)
                    .map_err(|message| errors.push(format!("{at}.upgrade"), message))
                    .ok();
                let downgrade = Expression::compile(&field.downgrade)
                    .map_err(|message| errors.push(format!("{at}.downgrade"), message))
                    .ok();
                if let Some((path, at)) = path {
                    changed_paths.push((path, at));
                    changed_expressions.push((upgrade, downgrade));
                }
            }
            for ((from, _), (to, to_at)) in &renamed {
                if from.lists != to.lists {
                    errors.push(
                        to_at.clone(),
                        format!("a rename stays within the same list items: {from} and {to} are in different lists"),
                    );
                }
            }
            for (path, at) in &removed {
                if renamed
                    .iter()
                    .any(|((from, _), (to, _))| from == path || to == path)
                {
                    errors.push(
                        at.clone(),
                        format!("{path} is both renamed and removed in this step"),
                    );
                }
            }
            for (n, (path, at)) in changed_paths.iter().enumerate() {
                let clash = if renamed.iter().any(|((from, _), _)| from == path) {
                    Some("renamed from in this step: name its new path (changes apply after renames)")
                } else if removed.iter().any(|(r, _)| r == path) {
                    Some("removed in this step")
                } else if added.iter().any(|((a, _), _)| a == path) {
                    Some("added in this step: give the added field's default in the newer type")
                } else {
                    None
                };
                if let Some(clash) = clash {
                    errors.push(at.clone(), format!("{path} is also {clash}"));
                }
                if changed_paths[..n].iter().any(|(other, _)| other == path) {
                    errors.push(at.clone(), format!("{path} is changed twice in this step"));
                }
            }
            // Rules inside list items: the list is not moved by a rename of this step, and no
            // rule touches the fields its items are matched by.
            let rename_roots: Vec<Vec<String>> = renamed
                .iter()
                .flat_map(|((from, _), (to, _))| [from.segments(), to.segments()])
                .collect();
            let mut inside_rules: Vec<(&RulePath, &String)> = Vec::new();
            inside_rules.extend(renamed.iter().flat_map(|((f, fa), (t, ta))| [(f, fa), (t, ta)]));
            inside_rules.extend(added.iter().map(|((p, a), _)| (p, a)));
            inside_rules.extend(removed.iter().map(|(p, a)| (p, a)));
            inside_rules.extend(changed_paths.iter().map(|(p, a)| (p, a)));
            inside_rules.extend(accepted.iter().map(|(p, a)| (p, a)));
            for (path, at) in &inside_rules {
                let mut prefix: Vec<String> = Vec::new();
                for list in &path.lists {
                    prefix.extend(list.list.segments().iter().cloned());
                    if rename_roots.iter().any(|root| is_within(&prefix, root)) {
                        errors.push(
                            (*at).clone(),
                            format!("{path}: the list {} is renamed in this step; rules inside its items are not supported in the same step", text_of(&prefix)),
                        );
                    }
                    prefix.push(ITEMS.to_owned());
                }
                if let Some(list) = path.lists.last()
                    && let ItemKey::Fields(keys) = &list.key
                    && keys.contains(&path.field.segments()[0])
                {
                    errors.push(
                        (*at).clone(),
                        format!("{path} is a key its list's items are matched by ({list}): it cannot change in a conversion that matches by it"),
                    );
                }
            }
            let mut root = Scope::default();
            let mut paths = StepPaths::default();
            for ((from, _), (to, _)) in &renamed {
                paths.renamed.push((from.segments(), to.segments()));
                if from.lists == to.lists {
                    scope_for(&mut root, &from.lists)
                        .renamed
                        .push((from.field.clone(), to.field.clone()));
                }
            }
            for ((path, _), default) in &added {
                paths.added.push(path.segments());
                scope_for(&mut root, &path.lists)
                    .added
                    .push((path.field.clone(), default.clone()));
            }
            for (path, _) in &removed {
                paths.removed.push(path.segments());
                scope_for(&mut root, &path.lists).removed.push(path.field.clone());
            }
            for ((path, _), (upgrade, downgrade)) in changed_paths.iter().zip(changed_expressions) {
                let (Some(upgrade), Some(downgrade)) = (upgrade, downgrade) else {
                    continue;
                };
                let whole = path.segments();
                let accepted_below = accepted
                    .iter()
                    .map(|(loss, _)| loss.segments())
                    .filter(|loss| is_within(loss, &whole))
                    .map(|loss| loss[whole.len()..].to_vec())
                    .collect();
                scope_for(&mut root, &path.lists).changed.push(Changed {
                    path: path.field.clone(),
                    upgrade,
                    downgrade,
                    accepted: accepted_below,
                });
            }
            steps.push(Step {
                from: change.from.clone(),
                to: change.to.clone(),
                root,
            });
            rules.push(paths);
        }
        if !spec.changes.is_empty() {
            for version in crd_versions.iter().filter(|v| !versions.contains(v)) {
                errors.push(
                    "spec.conversion.changes",
                    format!("the chain does not reach version {version} of the CRD, so objects could not convert to it"),
                );
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Converter {
            versions,
            steps,
            rules,
        })
    }

    /// Builds the converter from the steps alone, with the chain's own versions as the
    /// versions to reach (offline conversion and the webhook, which have no CRD at hand).
    pub fn for_spec(spec: &ConversionSpec) -> Result<Converter, FieldErrors> {
        let chain: Vec<String> = spec
            .changes
            .first()
            .map(|first| first.from.clone())
            .into_iter()
            .chain(spec.changes.iter().map(|c| c.to.clone()))
            .collect();
        Converter::new(spec, &chain, &[])
    }

    /// Where a field of `from_version` (its path as segments, e.g. `["spec", "size"]`, with
    /// [`ITEMS`] after a list whose items it is in) is in `to_version`: renames applied step
    /// by step; `None` when a step drops it (removed going up, added going down). A version
    /// outside the chain keeps the path as it is.
    pub fn translate_path(
        &self,
        path: &[String],
        from_version: &str,
        to_version: &str,
    ) -> Option<Vec<String>> {
        let position = |v: &str| self.versions.iter().position(|known| known == v);
        let (Some(from), Some(to)) = (position(from_version), position(to_version)) else {
            return Some(path.to_vec());
        };
        let moved = |path: &[String], from: &[String], to: &[String]| {
            let mut moved = to.to_vec();
            moved.extend_from_slice(&path[from.len()..]);
            moved
        };
        let mut path = path.to_vec();
        if from < to {
            for step in &self.rules[from..to] {
                if step.removed.iter().any(|r| is_within(&path, r)) {
                    return None;
                }
                if let Some((old, new)) = step.renamed.iter().find(|(old, _)| is_within(&path, old)) {
                    path = moved(&path, old, new);
                }
            }
        } else {
            for step in self.rules[to..from].iter().rev() {
                if step.added.iter().any(|added| is_within(&path, added)) {
                    return None;
                }
                if let Some((old, new)) = step.renamed.iter().find(|(_, new)| is_within(&path, new)) {
                    path = moved(&path, new, old);
                }
            }
        }
        Some(path)
    }

    /// The type changes of step `step` (the `spec.conversion.changes` index): each path's
    /// segments in the newer version, its expressions, and the parts below it whose loss is
    /// accepted.
    pub fn changed_rules(&self, step: usize) -> Vec<ChangedRule<'_>> {
        let mut found = Vec::new();
        if let Some(step) = self.steps.get(step) {
            step.root.changed_rules(&[], &mut found);
        }
        found
            .into_iter()
            .map(|(path, changed)| ChangedRule {
                path,
                upgrade: &changed.upgrade,
                downgrade: &changed.downgrade,
                accepted: &changed.accepted,
            })
            .collect()
    }

    /// The versions of the chain, oldest first.
    pub fn versions(&self) -> &[String] {
        &self.versions
    }

    /// Converts one object to `to_version`, chaining the steps up or down, with a fresh
    /// review budget for its expressions.
    pub fn convert(&self, object: &Value, to_version: &str) -> Result<Value, ConversionError> {
        self.convert_owned(object.clone(), to_version, &mut Budget::default())
    }

    /// Converts one object, taken by value, to `to_version`; its expressions draw on
    /// `budget` (shared by every object of a review).
    pub fn convert_owned(
        &self,
        mut object: Value,
        to_version: &str,
        budget: &mut Budget,
    ) -> Result<Value, ConversionError> {
        self.convert_in_place(&mut object, to_version, budget)?;
        Ok(object)
    }

    /// Converts one object in place. On an error the object may be half converted (never
    /// its metadata's name and namespace, for the message): discard it.
    pub fn convert_in_place(
        &self,
        object: &mut Value,
        to_version: &str,
        budget: &mut Budget,
    ) -> Result<(), ConversionError> {
        let api_version = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .ok_or(ConversionError::NoApiVersion)?;
        let (group, from_version) = api_version
            .rsplit_once('/')
            .ok_or(ConversionError::NoApiVersion)?;
        let index = |version: &str| {
            self.versions
                .iter()
                .position(|v| v == version)
                .ok_or_else(|| ConversionError::UnknownVersion {
                    version: version.to_owned(),
                    known: self.versions.join(", "),
                })
        };
        let (from, to) = (index(from_version)?, index(to_version)?);
        let api_version = format!("{group}/{to_version}");
        let mut saved = take_saved(object)?;
        if from < to {
            for step in &self.steps[from..to] {
                step.up(object, &mut saved, budget)?;
            }
        } else {
            for step in self.steps[to..from].iter().rev() {
                step.down(object, &mut saved, budget)?;
            }
        }
        put_saved(object, saved, to_version)?;
        object["apiVersion"] = Value::String(api_version);
        Ok(())
    }
}
