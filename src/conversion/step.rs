//! One step between adjacent versions: its renames, additions, removals and type changes,
//! applied up (older → newer) or down, to the object and, rule by rule, to the items of the
//! lists the rules reach into.

use serde_json::Value;

use super::path::{ITEMS, ListStep};
use super::saved::{ItemId, Saved, SavedFields};
use super::{Budget, ConversionError, Expression, FieldPath};

pub(super) struct Step {
    pub(super) from: String,
    pub(super) to: String,
    /// The rules on the object's own fields, and on the items of lists.
    pub(super) root: Scope,
}

/// The rules of a step at one level: the object, or each item of a list (paths relative to
/// the item).
#[derive(Default)]
pub(super) struct Scope {
    pub(super) renamed: Vec<(FieldPath, FieldPath)>,
    pub(super) added: Vec<(FieldPath, Value)>,
    pub(super) removed: Vec<FieldPath>,
    pub(super) changed: Vec<Changed>,
    /// Lists whose items rules reach into, with those rules.
    pub(super) lists: Vec<(ListStep, Scope)>,
}

/// A field whose value converts with CEL (its path in the newer version).
pub(super) struct Changed {
    pub(super) path: FieldPath,
    pub(super) upgrade: Expression,
    pub(super) downgrade: Expression,
    /// Parts of the value whose loss the policy accepts (`acceptLoss` below the field, as
    /// segments from it, with [`ITEMS`] for each item of a list): differences there do not
    /// count, and are not kept.
    pub(super) accepted: Vec<Vec<String>>,
}

/// Where a scope is, for messages: the object (empty) or an item (`spec.ports[port=80].`).
type At<'a> = &'a str;

/// What a step works on at one scope: the value, what the older version saved, what the
/// newer version saved, and the review's budget.
struct Work<'a> {
    older: &'a mut SavedFields,
    newer: &'a mut SavedFields,
    budget: &'a mut Budget,
}

impl Changed {
    fn apply(
        &self,
        at: At,
        expression: &Expression,
        direction: &'static str,
        value: &Value,
        budget: &mut Budget,
    ) -> Result<Value, ConversionError> {
        expression
            .evaluate_within(value, budget)
            .map_err(|error| ConversionError::Expression {
                path: format!("{at}{}", self.path),
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
        at: At,
        expression: &Expression,
        direction: &'static str,
        value: &Value,
        budget: &mut Budget,
    ) -> Result<Option<Value>, ConversionError> {
        match expression.evaluate_within(value, budget) {
            Ok(result) => Ok(Some(result)),
            Err(error) if error.over_limit => Err(ConversionError::Expression {
                path: format!("{at}{}", self.path),
                direction,
                expression: expression.source().to_owned(),
                value: shortened(value),
                over_limit: true,
                message: error.message,
            }),
            Err(_) => Ok(None),
        }
    }

    /// Whether `a` and `b` are the same value, apart from the parts whose loss is accepted.
    fn same(&self, a: Option<&Value>, b: &Value) -> bool {
        let Some(a) = a else { return false };
        if self.accepted.is_empty() {
            return a == b;
        }
        let (mut a, mut b) = (a.clone(), b.clone());
        for accepted in &self.accepted {
            strip(&mut a, accepted);
            strip(&mut b, accepted);
        }
        a == b
    }
}

/// Removes the part of `value` at `segments` (from the value; [`ITEMS`] for every item).
fn strip(value: &mut Value, segments: &[String]) {
    let Some((first, rest)) = segments.split_first() else {
        return;
    };
    match value {
        Value::Array(items) if first == ITEMS => items.iter_mut().for_each(|item| strip(item, rest)),
        Value::Object(fields) if rest.is_empty() => {
            fields.remove(first);
        }
        Value::Object(fields) => {
            if let Some(child) = fields.get_mut(first) {
                strip(child, rest);
            }
        }
        _ => {}
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

/// The passes of converting up a step, in order; down is the reverse.
const UP: [Phase; 4] = [
    Phase::UpRemoved,
    Phase::Renamed { up: true },
    Phase::UpChanged,
    Phase::UpAdded,
];
const DOWN: [Phase; 4] = [
    Phase::DownAdded,
    Phase::DownChanged,
    Phase::Renamed { up: false },
    Phase::DownRemoved,
];

impl Step {
    pub(super) fn up(
        &self,
        object: &mut Value,
        saved: &mut Saved,
        budget: &mut Budget,
    ) -> Result<(), ConversionError> {
        self.with_saved(saved, budget, |work| {
            UP.iter()
                .try_for_each(|phase| self.root.phase(object, work, "", *phase))
        })
    }

    pub(super) fn down(
        &self,
        object: &mut Value,
        saved: &mut Saved,
        budget: &mut Budget,
    ) -> Result<(), ConversionError> {
        self.with_saved(saved, budget, |work| {
            DOWN.iter()
                .try_for_each(|phase| self.root.phase(object, work, "", *phase))
        })
    }

    /// Runs `steps` with what both versions of the step saved, and puts it back.
    fn with_saved(
        &self,
        saved: &mut Saved,
        budget: &mut Budget,
        steps: impl FnOnce(&mut Work) -> Result<(), ConversionError>,
    ) -> Result<(), ConversionError> {
        let mut older = saved.remove(&self.from).unwrap_or_default();
        let mut newer = saved.remove(&self.to).unwrap_or_default();
        let outcome = steps(&mut Work {
            older: &mut older,
            newer: &mut newer,
            budget,
        });
        for (version, mut fields) in [(&self.from, older), (&self.to, newer)] {
            fields.prune();
            if !fields.is_empty() {
                saved.insert(version.clone(), fields);
            }
        }
        outcome
    }
}

/// One pass over a scope and the items of its lists. Up: removed fields are saved, renamed
/// fields move, changed fields convert, added fields are restored or defaulted; down, the
/// reverse, in reverse order.
#[derive(Clone, Copy)]
enum Phase {
    UpRemoved,
    Renamed { up: bool },
    UpChanged,
    UpAdded,
    DownAdded,
    DownChanged,
    DownRemoved,
}

impl Scope {
    /// Every type change of this scope and the items of its lists, with its whole path's
    /// segments (`prefix` leading to this scope).
    pub(super) fn changed_rules<'a>(&'a self, prefix: &[String], out: &mut Vec<(Vec<String>, &'a Changed)>) {
        for changed in &self.changed {
            let mut path = prefix.to_vec();
            path.extend(changed.path.segments().iter().cloned());
            out.push((path, changed));
        }
        for (list, scope) in &self.lists {
            let mut inner = prefix.to_vec();
            inner.extend(list.list.segments().iter().cloned());
            inner.push(ITEMS.to_owned());
            scope.changed_rules(&inner, out);
        }
    }

    fn phase(
        &self,
        object: &mut Value,
        work: &mut Work,
        at: At,
        phase: Phase,
    ) -> Result<(), ConversionError> {
        let up = matches!(
            phase,
            Phase::UpRemoved | Phase::UpChanged | Phase::UpAdded | Phase::Renamed { up: true }
        );
        if up {
            self.own_phase(object, work, at, phase)?;
        }
        for (list, scope) in &self.lists {
            self.each_item(object, work, at, list, |item, work, at| {
                scope.phase(item, work, at, phase)
            })?;
        }
        if !up {
            self.own_phase(object, work, at, phase)?;
        }
        Ok(())
    }

    /// Runs `each` on every item of `list`, with what the item saved in either version.
    fn each_item(
        &self,
        object: &mut Value,
        work: &mut Work,
        at: At,
        list: &ListStep,
        mut each: impl FnMut(&mut Value, &mut Work, At) -> Result<(), ConversionError>,
    ) -> Result<(), ConversionError> {
        let name = list.to_string();
        let Some(Value::Array(items)) = list.list.get_mut(object) else {
            // No list, no items: what was kept for them belongs to none.
            work.older.keep_items(&name, &[]);
            work.newer.keep_items(&name, &[]);
            return Ok(());
        };
        let ids = ItemId::of_items(items, &list.key);
        work.older.keep_items(&name, &ids);
        work.newer.keep_items(&name, &ids);
        for (item, id) in items.iter_mut().zip(&ids) {
            let item_at = format!("{at}{}{}.", list.list, id.shown());
            let (older, newer) = (work.older.item_mut(&name, id), work.newer.item_mut(&name, id));
            let mut item_work = Work {
                older,
                newer,
                budget: &mut *work.budget,
            };
            each(item, &mut item_work, &item_at)?;
        }
        Ok(())
    }

    fn own_phase(
        &self,
        object: &mut Value,
        work: &mut Work,
        at: At,
        phase: Phase,
    ) -> Result<(), ConversionError> {
        match phase {
            Phase::UpRemoved => {
                for path in &self.removed {
                    // Parents stay, even emptied: the object had them, and a schema may require them.
                    if let Some(value) = path.take(object, |_| false) {
                        work.older.values.insert(path.to_string(), value);
                    }
                }
            }
            Phase::Renamed { up: true } => {
                for (from, to) in &self.renamed {
                    move_field(object, from, to, at)?;
                }
            }
            Phase::Renamed { up: false } => {
                for (from, to) in self.renamed.iter().rev() {
                    move_field(object, to, from, at)?;
                }
            }
            Phase::UpChanged => {
                for changed in &self.changed {
                    self.change(object, work, at, changed, true)?;
                }
            }
            Phase::UpAdded => {
                for (path, default) in &self.added {
                    add_up(object, work.newer, path, default)?;
                }
            }
            Phase::DownAdded => {
                for (path, default) in self.added.iter().rev() {
                    add_down(object, work.newer, path, default);
                }
            }
            Phase::DownChanged => {
                for changed in self.changed.iter().rev() {
                    self.change(object, work, at, changed, false)?;
                }
            }
            Phase::DownRemoved => {
                for path in &self.removed {
                    if let Some(value) = work.older.values.remove(&path.to_string()) {
                        path.set(object, value)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A type change one way (`up`: `upgrade`, else `downgrade`). The value the other
    /// version kept is restored while converting it back still gives the value here (an
    /// edit here wins); otherwise the value converts, and when converting the result back
    /// would not give the value here again (`"08080"` → 8080 → `"8080"`; a field the other
    /// version has no place for, a value it narrows), the value here is kept, apart from the
    /// parts whose loss is accepted.
    fn change(
        &self,
        object: &mut Value,
        work: &mut Work,
        at: At,
        changed: &Changed,
        up: bool,
    ) -> Result<(), ConversionError> {
        let ((forward, forward_name), (backward, backward_name)) = if up {
            ((&changed.upgrade, "upgrade"), (&changed.downgrade, "downgrade"))
        } else {
            ((&changed.downgrade, "downgrade"), (&changed.upgrade, "upgrade"))
        };
        let (this, other) = if up {
            (&mut *work.older, &mut *work.newer)
        } else {
            (&mut *work.newer, &mut *work.older)
        };
        let key = changed.path.to_string();
        let kept = other.changed.remove(&key);
        // A missing field stays missing.
        let Some(here) = changed.path.get(object).cloned() else {
            return Ok(());
        };
        let restored = match kept {
            Some(kept) => changed
                .probe(at, backward, backward_name, &kept, work.budget)?
                .is_some_and(|back| back == here)
                .then_some(kept),
            None => None,
        };
        let value = match restored {
            Some(kept) => kept,
            None => {
                let converted = changed.apply(at, forward, forward_name, &here, work.budget)?;
                let back = changed.probe(at, backward, backward_name, &converted, work.budget)?;
                if !changed.same(back.as_ref(), &here) {
                    this.changed.insert(key, here);
                }
                converted
            }
        };
        changed.path.set(object, value)
    }
}

/// Up: an added field gets back what it had (or its absence), else its default.
fn add_up(
    object: &mut Value,
    newer: &mut SavedFields,
    path: &FieldPath,
    default: &Value,
) -> Result<(), ConversionError> {
    let key = path.to_string();
    let was_absent = newer.absent.remove(&key);
    let restored = newer.values.remove(&key);
    let (value, from_saved) = match restored {
        Some(value) => (value, true),
        None if !was_absent && path.get(object).is_none() => (default.clone(), false),
        None => return Ok(()),
    };
    let created = path.set_creating(object, value)?;
    // Parents a restored value needs are the object's own (the apiserver may have pruned
    // them in a version without them) or still recorded from before.
    if !from_saved && !created.is_empty() {
        newer.created.extend(created);
    }
    Ok(())
}

/// Down: an added field is kept (unless it holds its default) and dropped, with the
/// parents converting up created for it.
fn add_down(object: &mut Value, newer: &mut SavedFields, path: &FieldPath, default: &Value) {
    let key = path.to_string();
    // What was kept for it before is stale now: this conversion records it anew.
    newer.values.remove(&key);
    newer.absent.remove(&key);
    let created = std::mem::take(&mut newer.created);
    let taken = path.take(object, |parent| created.contains(parent));
    // A record goes once its object is gone (another added field may still be in it),
    // unless this field's value is kept: converting back recreates the parent for it, and
    // it is still one conversion created.
    let value_kept = taken.as_ref().is_some_and(|value| value != default);
    newer.created = created
        .into_iter()
        .filter(|c| {
            (value_kept && key.starts_with(&format!("{c}.")))
                || FieldPath::parse_relative(c).get(object).is_some()
        })
        .collect();
    match taken {
        // The default comes back by itself when converting up.
        Some(value) if value == *default => {}
        Some(value) => {
            newer.values.insert(key, value);
        }
        None => {
            newer.absent.insert(key);
        }
    }
}

/// Moves a field. Parents of `from` that the move empties are removed only below the part
/// the two paths share (they belong to the other version's layout, and moving back creates
/// them again), so a round trip gives back exactly the parents the object had.
fn move_field(object: &mut Value, from: &FieldPath, to: &FieldPath, at: At) -> Result<(), ConversionError> {
    if from.get(object).is_none() {
        return Ok(());
    }
    if to.get(object).is_some() {
        return Err(ConversionError::TargetTaken {
            from: format!("{at}{from}"),
            to: format!("{at}{to}"),
        });
    }
    let shared = from.common_prefix(to);
    if let Some(value) = from.take(object, |parent| parent.split('.').count() > shared) {
        to.set(object, value)?;
    }
    Ok(())
}
