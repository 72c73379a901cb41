//! Dotted field paths inside an object (`spec.scale.replicas`).

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

    /// The value at the path, if every step is an object that has it.
    pub fn get<'a>(&self, object: &'a Value) -> Option<&'a Value> {
        self.0
            .iter()
            .try_fold(object, |value, key| value.as_object()?.get(key))
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
