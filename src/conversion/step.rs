//! One step between adjacent versions: its renames, additions, removals and type changes,
//! applied up (older → newer) or down.

use serde_json::Value;

use super::saved::Saved;
use super::{Budget, ConversionError, Expression, FieldPath};

pub(super) struct Step {
    pub(super) from: String,
    pub(super) to: String,
    pub(super) renamed: Vec<(FieldPath, FieldPath)>,
    pub(super) added: Vec<(FieldPath, Value)>,
    pub(super) removed: Vec<FieldPath>,
    pub(super) changed: Vec<Changed>,
}

/// A field whose value converts with CEL (its path in the newer version).
pub(super) struct Changed {
    pub(super) path: FieldPath,
    pub(super) upgrade: Expression,
    pub(super) downgrade: Expression,
}

impl Changed {
    fn apply(
        &self,
        expression: &Expression,
        direction: &'static str,
        value: &Value,
        budget: &mut Budget,
    ) -> Result<Value, ConversionError> {
        expression
            .evaluate_within(value, budget)
            .map_err(|error| ConversionError::Expression {
                path: self.path.to_string(),
                direction,
                expression: expression.source().to_owned(),
                value: shortened(value),
                over_limit: error.over_limit,
                message: error.message,
            })
    }

    /// Evaluates only to compare: an error of the expression is `None`, a limit stops the
    /// conversion.
    fn probe(
        &self,
        expression: &Expression,
        direction: &'static str,
        value: &Value,
        budget: &mut Budget,
    ) -> Result<Option<Value>, ConversionError> {
        match expression.evaluate_within(value, budget) {
            Ok(result) => Ok(Some(result)),
            Err(error) if error.over_limit => Err(ConversionError::Expression {
                path: self.path.to_string(),
                direction,
                expression: expression.source().to_owned(),
                value: shortened(value),
                over_limit: true,
                message: error.message,
            }),
            Err(_) => Ok(None),
        }
    }
}

/// Longest rendering of a value in a message (the apiserver shows it to every client).
const MAX_VALUE_IN_MESSAGE: usize = 80;

/// A value as JSON, cut to `MAX_VALUE_IN_MESSAGE` characters with its size said.
fn shortened(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= MAX_VALUE_IN_MESSAGE {
        return text;
    }
    let head: String = text.chars().take(MAX_VALUE_IN_MESSAGE).collect();
    format!("{head}... ({} bytes)", text.len())
}

impl Step {
    pub(super) fn up(
        &self,
        object: &mut Value,
        saved: &mut Saved,
        budget: &mut Budget,
    ) -> Result<(), ConversionError> {
        for path in &self.removed {
            // Parents stay, even emptied: the object had them, and a schema may require them.
            if let Some(value) = path.take(object, |_| false) {
                saved
                    .entry(self.from.clone())
                    .or_default()
                    .values
                    .insert(path.to_string(), value);
            }
        }
        for (from, to) in &self.renamed {
            move_field(object, from, to)?;
        }
        for changed in &self.changed {
            // A missing field stays missing.
            let Some(original) = changed.path.get(object).cloned() else {
                continue;
            };
            let upgraded = changed.apply(&changed.upgrade, "upgrade", &original, budget)?;
            // Keep what the way back would not give back (`"08080"` → 8080 → `"8080"`).
            let back = changed.probe(&changed.downgrade, "downgrade", &upgraded, budget)?;
            if back.as_ref() != Some(&original) {
                saved
                    .entry(self.from.clone())
                    .or_default()
                    .changed
                    .insert(changed.path.to_string(), original);
            }
            changed.path.set(object, upgraded)?;
        }
        for (path, default) in &self.added {
            let key = path.to_string();
            let kept = saved.get_mut(&self.to);
            let was_absent = kept.as_ref().is_some_and(|s| s.absent.contains(&key));
            let restored = kept.and_then(|s| {
                s.absent.remove(&key);
                s.values.remove(&key)
            });
            let (value, from_saved) = match restored {
                Some(value) => (value, true),
                None if !was_absent && path.get(object).is_none() => (default.clone(), false),
                None => continue,
            };
            let created = path.set_creating(object, value)?;
            // Parents a restored value needs are the object's own (the apiserver may have
            // pruned them in a version without them) or still recorded from before.
            if !from_saved && !created.is_empty() {
                saved.entry(self.to.clone()).or_default().created.extend(created);
            }
        }
        Ok(())
    }

    pub(super) fn down(
        &self,
        object: &mut Value,
        saved: &mut Saved,
        budget: &mut Budget,
    ) -> Result<(), ConversionError> {
        for (path, default) in self.added.iter().rev() {
            // Only the parents that converting up created for it go with it.
            let created = saved
                .get_mut(&self.to)
                .map(|s| std::mem::take(&mut s.created))
                .unwrap_or_default();
            let taken = path.take(object, |parent| created.contains(parent));
            // A record goes once its object is gone (another added field may still be in
            // it), unless this field's value is kept: converting back recreates the parent
            // for it, and it is still one conversion created.
            let value_kept = taken.as_ref().is_some_and(|value| value != default);
            let key = path.to_string();
            let remaining: std::collections::BTreeSet<String> = created
                .into_iter()
                .filter(|c| {
                    (value_kept && key.starts_with(&format!("{c}.")))
                        || FieldPath::parse(c).is_ok_and(|p| p.get(object).is_some())
                })
                .collect();
            if !remaining.is_empty() {
                saved.entry(self.to.clone()).or_default().created = remaining;
            }
            match taken {
                // The default comes back by itself when converting up.
                Some(value) if value == *default => {}
                Some(value) => {
                    saved
                        .entry(self.to.clone())
                        .or_default()
                        .values
                        .insert(path.to_string(), value);
                }
                None => {
                    saved
                        .entry(self.to.clone())
                        .or_default()
                        .absent
                        .insert(path.to_string());
                }
            }
        }
        for changed in self.changed.iter().rev() {
            let key = changed.path.to_string();
            let kept = saved.get_mut(&self.from).and_then(|s| s.changed.remove(&key));
            let Some(current) = changed.path.get(object).cloned() else {
                continue;
            };
            // The original comes back while the newer value is still what it became;
            // a value changed since is converted.
            let restored = match kept {
                Some(original) => changed
                    .probe(&changed.upgrade, "upgrade", &original, budget)?
                    .is_some_and(|upgraded| upgraded == current)
                    .then_some(original),
                None => None,
            };
            let value = match restored {
                Some(original) => original,
                None => changed.apply(&changed.downgrade, "downgrade", &current, budget)?,
            };
            changed.path.set(object, value)?;
        }
        for (from, to) in self.renamed.iter().rev() {
            move_field(object, to, from)?;
        }
        for path in &self.removed {
            if let Some(value) = saved
                .get_mut(&self.from)
                .and_then(|s| s.values.remove(&path.to_string()))
            {
                path.set(object, value)?;
            }
        }
        Ok(())
    }
}

/// Moves a field. Parents of `from` that the move empties are removed only below the part
/// the two paths share (they belong to the other version's layout, and moving back creates
/// them again), so a round trip gives back exactly the parents the object had.
fn move_field(object: &mut Value, from: &FieldPath, to: &FieldPath) -> Result<(), ConversionError> {
    if from.get(object).is_none() {
        return Ok(());
    }
    if to.get(object).is_some() {
        return Err(ConversionError::TargetTaken {
            from: from.to_string(),
            to: to.to_string(),
        });
    }
    let shared = from.common_prefix(to);
    if let Some(value) = from.take(object, |parent| parent.split('.').count() > shared) {
        to.set(object, value)?;
    }
    Ok(())
}
