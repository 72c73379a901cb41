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
pub use path::FieldPath;
use saved::{put_saved, take_saved};
use step::{Changed, Step};

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

/// A validated chain of conversion steps.
pub struct Converter {
    /// The versions, oldest first.
    versions: Vec<String>,
    /// `steps[i]` converts `versions[i]` ↔ `versions[i + 1]`.
    steps: Vec<Step>,
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
            let mut parse = |text: &str, at: String| match FieldPath::parse(text) {
                Ok(path) => Some(path),
                Err(message) => {
                    errors.push(at, message);
                    None
                }
            };
            let renamed: Vec<(FieldPath, FieldPath)> = change
                .renamed
                .iter()
                .enumerate()
                .filter_map(|(j, r)| {
                    let from = parse(&r.from, format!("{base}.renamed[{j}].from"));
                    let to = parse(&r.to, format!("{base}.renamed[{j}].to"));
                    from.zip(to)
                })
                .collect();
            let added: Vec<(FieldPath, Value)> = change
                .added
                .iter()
                .enumerate()
                .filter_map(|(j, a)| {
                    parse(&a.path, format!("{base}.added[{j}].path")).map(|p| (p, a.default.clone()))
                })
                .collect();
            let removed: Vec<FieldPath> = change
                .removed
                .iter()
                .enumerate()
                .filter_map(|(j, r)| parse(r, format!("{base}.removed[{j}]")))
                .collect();
            for (j, loss) in change.accept_loss.iter().enumerate() {
                parse(&loss.path, format!("{base}.acceptLoss[{j}].path"));
            }
            for (j, path) in removed.iter().enumerate() {
                if renamed.iter().any(|(from, to)| from == path || to == path) {
                    errors.push(
                        format!("{base}.removed[{j}]"),
                        format!("{path} is both renamed and removed in this step"),
                    );
                }
            }
            let mut changed = Vec::new();
            for (j, field) in change.changed.iter().enumerate() {
                let at = format!("{base}.changed[{j}]");
                let path = FieldPath::parse(&field.path)
                    .map_err(|message| errors.push(format!("{at}.path"), message))
                    .ok();
                let upgrade = Expression::compile(&field.upgrade)
                    .map_err(|message| errors.push(format!("{at}.upgrade"), message))
                    .ok();
                let downgrade = Expression::compile(&field.downgrade)
                    .map_err(|message| errors.push(format!("{at}.downgrade"), message))
                    .ok();
                let Some(path) = path else { continue };
                let clash = if renamed.iter().any(|(from, _)| *from == path) {
                    Some("renamed from in this step: name its new path (changes apply after renames)")
                } else if removed.contains(&path) {
                    Some("removed in this step")
                } else if added.iter().any(|(added, _)| *added == path) {
                    Some("added in this step: give the added field's default in the newer type")
                } else {
                    None
                };
                if let Some(clash) = clash {
                    errors.push(format!("{at}.path"), format!("{path} is also {clash}"));
                }
                if change.changed[..j].iter().any(|other| other.path == field.path) {
                    errors.push(
                        format!("{at}.path"),
                        format!("{path} is changed twice in this step"),
                    );
                }
                if let (Some(upgrade), Some(downgrade)) = (upgrade, downgrade) {
                    changed.push(Changed {
                        path,
                        upgrade,
                        downgrade,
                    });
                }
            }
            steps.push(Step {
                from: change.from.clone(),
                to: change.to.clone(),
                renamed,
                added,
                removed,
                changed,
            });
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
        Ok(Converter { versions, steps })
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

    /// Where a field of `from_version` (its path as segments, e.g. `["spec", "size"]`) is in
    /// `to_version`: renames applied step by step; `None` when a step drops it (removed going
    /// up, added going down). A version outside the chain keeps the path as it is.
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
        let under = |path: &[String], field: &FieldPath| path.starts_with(field.segments());
        let moved = |path: &[String], from: &FieldPath, to: &FieldPath| {
            let mut moved = to.segments().to_vec();
            moved.extend_from_slice(&path[from.depth()..]);
            moved
        };
        let mut path = path.to_vec();
        if from < to {
            for step in &self.steps[from..to] {
                if step.removed.iter().any(|r| under(&path, r)) {
                    return None;
                }
                if let Some((old, new)) = step.renamed.iter().find(|(old, _)| under(&path, old)) {
                    path = moved(&path, old, new);
                }
            }
        } else {
            for step in self.steps[to..from].iter().rev() {
                if step.added.iter().any(|(added, _)| under(&path, added)) {
                    return None;
                }
                if let Some((old, new)) = step.renamed.iter().find(|(_, new)| under(&path, new)) {
                    path = moved(&path, new, old);
                }
            }
        }
        Some(path)
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
        put_saved(object, saved);
        object["apiVersion"] = Value::String(api_version);
        Ok(())
    }
}
