//! Dotted field paths inside an object (`spec.scale.replicas`), and the paths of rules, which
//! may reach into the items of lists (`spec.ports[].appProtocol`, `spec.ports[port].name`).

use std::fmt;

use serde_json::{Map, Value};

use super::ConversionError;

/// A path of object keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath(Vec<String>);

impl FieldPath {
    /// Parses `a.b.c`: non-empty segments of letters, digits, `-` and `_`; not inside
    /// `apiVersion`, `kind` or `metadata`, which conversion must not touch.
    pub fn parse(text: &str) -> Result<FieldPath, String> {
        let segments: Vec<String> = text.split('.').map(str::to_owned).collect();
        let well_formed = |s: &String| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        if text.is_empty() || !segments.iter().all(well_formed) {
            return Err(format!(
                "{text:?} is not a field path (dot-separated field names, e.g. spec.scale.replicas)"
            ));
        }
        if matches!(segments[0].as_str(), "apiVersion" | "kind" | "metadata") {
            return Err(format!(
                "{text:?} is inside {}, which conversion must not change",
                segments[0]
            ));
        }
        Ok(FieldPath(segments))
    }

    /// A path of the given field names inside a list's items (no check of the names, which
    /// [`RulePath::parse`] made).
    fn relative(segments: Vec<String>) -> FieldPath {
        FieldPath(segments)
    }

    /// A dotted path as written by this module (`Display`), without checks: paths that
    /// conversion recorded itself.
    pub(super) fn parse_relative(text: &str) -> FieldPath {
        FieldPath(text.split('.').map(str::to_owned).collect())
    }

    /// The value at the path, if every step is an object that has it.
    pub fn get<'a>(&self, object: &'a Value) -> Option<&'a Value> {
        self.0
            .iter()
            .try_fold(object, |value, key| value.as_object()?.get(key))
    }

    /// The value at the path, to change it.
    pub fn get_mut<'a>(&self, object: &'a mut Value) -> Option<&'a mut Value> {
        self.0
            .iter()
            .try_fold(object, |value, key| value.as_object_mut()?.get_mut(key))
    }

    /// Removes the value at the path. An object on the way that the removal leaves empty is
    /// removed too only where `prune` says so for its path (`spec.scale`): conversion drops
    /// only the parents it created itself, never one the object had (a schema may require it).
    pub fn take(&self, object: &mut Value, prune: impl Fn(&str) -> bool) -> Option<Value> {
        fn take_in(
            value: &mut Value,
            keys: &[String],
            depth: usize,
            path: &FieldPath,
            prune: &dyn Fn(&str) -> bool,
        ) -> Option<Value> {
            let map = value.as_object_mut()?;
            let (first, rest) = keys.split_first()?;
            if rest.is_empty() {
                return map.remove(first);
            }
            let child = map.get_mut(first)?;
            let taken = take_in(child, rest, depth + 1, path, prune)?;
            if child.as_object().is_some_and(Map::is_empty) && prune(&path.0[..=depth].join(".")) {
                map.remove(first);
            }
            Some(taken)
        }
        take_in(object, &self.0, 0, self, &prune)
    }

    /// Sets the value at the path, creating the objects on the way.
    pub fn set(&self, object: &mut Value, value: Value) -> Result<(), ConversionError> {
        self.set_creating(object, value).map(|_| ())
    }

    /// Sets the value at the path; returns the paths of the objects it had to create on the
    /// way, outermost first.
    pub fn set_creating(&self, object: &mut Value, value: Value) -> Result<Vec<String>, ConversionError> {
        let mut created = Vec::new();
        let mut current = object;
        for (i, key) in self.0.iter().enumerate() {
            let blocker = || self.0[..i].join(".");
            let map = current
                .as_object_mut()
                .ok_or_else(|| ConversionError::NotAnObject {
                    path: self.to_string(),
                    blocker: if i == 0 {
                        "the object".to_owned()
                    } else {
                        blocker()
                    },
                })?;
            if i + 1 == self.0.len() {
                map.insert(key.clone(), value);
                return Ok(created);
            }
            if !map.contains_key(key) {
                created.push(self.0[..=i].join("."));
            }
            current = map
                .entry(key.clone())
                .or_insert_with(|| Value::Object(Map::new()));
        }
        Ok(created)
    }

    /// How many leading segments two paths share.
    pub fn common_prefix(&self, other: &FieldPath) -> usize {
        self.0.iter().zip(&other.0).take_while(|(a, b)| a == b).count()
    }

    /// How many segments the path has.
    pub fn depth(&self) -> usize {
        self.0.len()
    }

    /// The segments.
    pub fn segments(&self) -> &[String] {
        &self.0
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

/// The segment that stands for "each item of the list" in a path's segments
/// (`["spec", "ports", "[]", "name"]`); no field name can be it.
pub const ITEMS: &str = "[]";

/// How the items of a list are matched across conversions, so that what one version's item
/// cannot hold comes back to the same item: by position (`spec.ports[]`), or by the values of
/// some of their fields (`spec.ports[port]`, `spec.ports[port,protocol]`: the list's
/// `x-kubernetes-list-map-keys`), which survives items inserted, removed or reordered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemKey {
    Position,
    Fields(Vec<String>),
}

/// A list a rule reaches into: its path (from the object, or from the enclosing list's item)
/// and how its items are matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListStep {
    pub list: FieldPath,
    pub key: ItemKey,
}

impl fmt::Display for ListStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.key {
            ItemKey::Position => write!(f, "{}[]", self.list),
            ItemKey::Fields(names) => write!(f, "{}[{}]", self.list, names.join(",")),
        }
    }
}

/// The path of a rule: through zero or more lists, to a field
/// (`spec.groups[].ports[port].appProtocol`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RulePath {
    /// The lists on the way, outermost first.
    pub lists: Vec<ListStep>,
    /// The field, from the object (no lists) or from the innermost list's item.
    pub field: FieldPath,
}

impl RulePath {
    /// Parses a rule's path: dot-separated field names, where a name followed by `[]` (match
    /// the items by position) or `[a,b]` (by the values of their fields `a` and `b`) is a
    /// list whose items the rest of the path is in. Not inside `apiVersion`, `kind` or
    /// `metadata`; it ends at a field, not at a list.
    pub fn parse(text: &str) -> Result<RulePath, String> {
        let invalid = || {
            format!(
                "{text:?} is not a field path (dot-separated field names, e.g. spec.scale.replicas; spec.ports[].name or spec.ports[port].name for a field of each item of a list)"
            )
        };
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        };
        let mut lists = Vec::new();
        let mut current: Vec<String> = Vec::new();
        for part in text.split('.') {
            let (name, key) = match part.split_once('[') {
                Some((name, rest)) => {
                    let inner = rest.strip_suffix(']').ok_or_else(invalid)?;
                    let key = if inner.is_empty() {
                        ItemKey::Position
                    } else {
                        let names: Vec<String> = inner.split(',').map(str::to_owned).collect();
                        let unique: std::collections::BTreeSet<&String> = names.iter().collect();
                        if !names.iter().all(|n| name_ok(n)) || unique.len() != names.len() {
                            return Err(invalid());
                        }
                        ItemKey::Fields(names)
                    };
                    (name, Some(key))
                }
                None => (part, None),
            };
            if !name_ok(name) {
                return Err(invalid());
            }
            current.push(name.to_owned());
            if let Some(key) = key {
                lists.push(ListStep {
                    list: FieldPath::relative(std::mem::take(&mut current)),
                    key,
                });
            }
        }
        if current.is_empty() {
            return Err(format!(
                "{text:?} ends at a list: name a field of its items (e.g. spec.ports[].name)"
            ));
        }
        let first = lists.first().map_or(&current[0], |list| &list.list.0[0]);
        if matches!(first.as_str(), "apiVersion" | "kind" | "metadata") {
            return Err(format!(
                "{text:?} is inside {first}, which conversion must not change"
            ));
        }
        Ok(RulePath {
            lists,
            field: FieldPath::relative(current),
        })
    }

    /// The path's segments, with [`ITEMS`] after each list (how items are matched left
    /// out): `["spec", "ports", "[]", "name"]`.
    pub fn segments(&self) -> Vec<String> {
        let mut segments = Vec::new();
        for list in &self.lists {
            segments.extend(list.list.0.iter().cloned());
            segments.push(ITEMS.to_owned());
        }
        segments.extend(self.field.0.iter().cloned());
        segments
    }
}

impl fmt::Display for RulePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for list in &self.lists {
            write!(f, "{list}.")?;
        }
        write!(f, "{}", self.field)
    }
}

/// Segments of a path written with `[]` after lists (`spec.ports[].name`, or with keys,
/// `spec.ports[port].name`, which count as `[]`).
pub fn segments_of(text: &str) -> Vec<String> {
    let mut segments = Vec::new();
    for part in text.split('.') {
        match part.split_once('[') {
            Some((name, _)) => {
                segments.push(name.to_owned());
                segments.push(ITEMS.to_owned());
            }
            None => segments.push(part.to_owned()),
        }
    }
    segments
}

/// The text of segments (`spec.ports[].name`).
pub fn text_of(segments: &[String]) -> String {
    let mut text = String::new();
    for segment in segments {
        if segment == ITEMS {
            text.push_str(ITEMS);
        } else {
            if !text.is_empty() {
                text.push('.');
            }
            text.push_str(segment);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_paths() {
        assert_eq!(
            FieldPath::parse("spec.scale.replicas").map(|p| p.to_string()),
            Ok("spec.scale.replicas".into())
        );
        for bad in [
            "",
            "spec.",
            ".spec",
            "spec..a",
            "spec.a b",
            "metadata.name",
            "kind",
            "spec.a[0]",
        ] {
            assert!(FieldPath::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rule_paths_reach_into_list_items() {
        let path = RulePath::parse("spec.groups[].ports[port,protocol].tls.mode").expect("path");
        assert_eq!(path.to_string(), "spec.groups[].ports[port,protocol].tls.mode");
        assert_eq!(path.lists.len(), 2);
        assert_eq!(
            path.lists[1].key,
            ItemKey::Fields(vec!["port".into(), "protocol".into()])
        );
        assert_eq!(path.field.to_string(), "tls.mode");
        assert_eq!(text_of(&path.segments()), "spec.groups[].ports[].tls.mode");
        assert_eq!(
            segments_of("spec.ports[port].name"),
            ["spec", "ports", "[]", "name"]
        );
        assert_eq!(RulePath::parse("spec.size").map(|p| p.lists.len()), Ok(0));
        for bad in [
            "spec.ports[]",
            "spec.ports[",
            "spec.ports[a,a].x",
            "spec.ports[a b].x",
            "metadata[].x",
            "spec.[].x",
        ] {
            assert!(RulePath::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn get_take_and_set() {
        let mut object = json!({"spec": {"scale": {"replicas": 3}, "keep": 1}});
        let path = FieldPath::parse("spec.scale.replicas").expect("path");
        assert_eq!(path.get(&object), Some(&json!(3)));
        assert_eq!(path.take(&mut object, |p| p == "spec.scale"), Some(json!(3)));
        assert_eq!(
            object,
            json!({"spec": {"keep": 1}}),
            "an emptied parent goes where allowed"
        );
        assert_eq!(
            path.set_creating(&mut object, json!(5)).expect("set"),
            ["spec.scale"]
        );
        assert_eq!(object, json!({"spec": {"keep": 1, "scale": {"replicas": 5}}}));
        assert_eq!(path.take(&mut object, |_| false), Some(json!(5)));
        assert_eq!(
            object,
            json!({"spec": {"keep": 1, "scale": {}}}),
            "and stays otherwise"
        );
        let blocked = FieldPath::parse("spec.keep.x").expect("path");
        assert!(matches!(
            blocked.set(&mut object, json!(1)),
            Err(ConversionError::NotAnObject { .. })
        ));
    }
}
