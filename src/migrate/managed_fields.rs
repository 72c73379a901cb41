//! Rewriting `metadata.managedFields` entries that name a version about to be removed (or
//! already gone), so that server-side apply keeps working on the object.
//!
//! After a version is removed from a CRD, any object whose managedFields still has an entry
//! with that `apiVersion` answers every server-side apply with 500 "request to convert CR to
//! an invalid group/version" (apiserver-samples/29, kubernetes issue 111937). Rewriting the
//! entry's `apiVersion` to the storage version repairs it (29). Where the policy's
//! declarative conversion renames or removes fields between the versions, the paths in the
//! entry's `fieldsV1` are translated too, so that the manager keeps owning the right fields;
//! a path that has no counterpart is dropped from the entry, and an entry is dropped only
//! when nothing is left of it.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

/// How a field path of one version maps to the storage version's (the policy's declarative
/// conversion; without one, paths stay as they are).
pub type Translate<'a> = &'a (dyn Fn(&[String], &str) -> Option<Vec<String>> + Send + Sync);

/// Which entries to rewrite, and into what.
pub struct Rewrite<'a> {
    /// The object's API group.
    pub group: &'a str,
    /// Versions whose entries are rewritten.
    pub stale: &'a BTreeSet<String>,
    /// The version they are rewritten into (the storage version).
    pub into: &'a str,
    pub translate: Translate<'a>,
}

impl Rewrite<'_> {
    /// The object's managedFields with every stale entry rewritten, or `None` when no entry
    /// names a stale version. Entries that end up with the same manager, operation,
    /// apiVersion and subresource as another are merged into it (their fields united).
    pub fn apply(&self, entries: &[Value]) -> Option<Vec<Value>> {
        let into = format!("{}/{}", self.group, self.into);
        let stale_version = |entry: &Value| {
            let api_version = entry["apiVersion"].as_str()?;
            let (group, version) = api_version.rsplit_once('/')?;
            (group == self.group && self.stale.contains(version)).then(|| version.to_owned())
        };
        if !entries.iter().any(|e| stale_version(e).is_some()) {
            return None;
        }
        let mut result: Vec<Value> = Vec::new();
        for entry in entries {
            let mut entry = entry.clone();
            if let Some(version) = stale_version(&entry) {
                entry["apiVersion"] = Value::String(into.clone());
                if let Some(fields) = entry.get("fieldsV1") {
                    let translated = translate_fields(fields, &|path| (self.translate)(path, &version));
                    if translated.as_object().is_some_and(Map::is_empty)
                        && !fields.as_object().is_some_and(Map::is_empty)
                    {
                        // Nothing of it has a counterpart: the entry goes.
                        continue;
                    }
                    entry["fieldsV1"] = translated;
                }
            }
            match result.iter_mut().find(|kept| same_owner(kept, &entry)) {
                Some(kept) => {
                    let mut fields = kept["fieldsV1"].take();
                    merge_fields(&mut fields, &entry["fieldsV1"]);
                    kept["fieldsV1"] = fields;
                    if entry["time"].as_str() > kept["time"].as_str() {
                        kept["time"] = entry["time"].clone();
                    }
                }
                None => result.push(entry),
            }
        }
        Some(result)
    }
}

/// The versions of `group` that entries name, as `group/version` apiVersions split.
pub fn named_versions(entries: &[Value], group: &str) -> BTreeSet<String> {
    entries
        .iter()
        .filter_map(|e| e["apiVersion"].as_str()?.rsplit_once('/'))
        .filter(|(g, _)| *g == group)
        .map(|(_, v)| v.to_owned())
        .collect()
}

fn same_owner(a: &Value, b: &Value) -> bool {
    ["manager", "operation", "apiVersion", "subresource"]
        .iter()
        .all(|key| a.get(*key) == b.get(*key))
}

/// Translates a `fieldsV1` trie: the leading `f:` keys of every leaf path form a field path
/// (`f:spec` `f:size` → `spec.size`), translated by `translate`; what follows (list keys
/// `k:`, values `v:`, indices `i:`, the `.` marker) is kept. A path `translate` drops is
/// left out.
pub fn translate_fields(fields: &Value, translate: &dyn Fn(&[String]) -> Option<Vec<String>>) -> Value {
    let mut leaves = Vec::new();
    collect_leaves(fields, &mut Vec::new(), &mut leaves);
    let mut result = Value::Object(Map::new());
    for leaf in leaves {
        let split = leaf.iter().take_while(|k| k.starts_with("f:")).count();
        let field: Vec<String> = leaf[..split].iter().map(|k| k[2..].to_owned()).collect();
        let Some(translated) = translate(&field) else {
            continue;
        };
        let mut keys: Vec<String> = translated.into_iter().map(|s| format!("f:{s}")).collect();
        keys.extend_from_slice(&leaf[split..]);
        insert_leaf(&mut result, &keys);
    }
    result
}

fn collect_leaves(value: &Value, prefix: &mut Vec<String>, leaves: &mut Vec<Vec<String>>) {
    match value.as_object() {
        Some(map) if !map.is_empty() => {
            for (key, child) in map {
                prefix.push(key.clone());
                collect_leaves(child, prefix, leaves);
                prefix.pop();
            }
        }
        _ if !prefix.is_empty() => leaves.push(prefix.clone()),
        _ => {}
    }
}

fn insert_leaf(trie: &mut Value, keys: &[String]) {
    let mut node = trie;
    for key in keys {
        let Some(map) = node.as_object_mut() else { return };
        node = map
            .entry(key.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
}

fn merge_fields(into: &mut Value, other: &Value) {
    let mut leaves = Vec::new();
    collect_leaves(other, &mut Vec::new(), &mut leaves);
    if !into.is_object() {
        *into = Value::Object(Map::new());
    }
    for leaf in leaves {
        insert_leaf(into, &leaf);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn same(path: &[String], _: &str) -> Option<Vec<String>> {
        Some(path.to_vec())
    }

    #[test]
    fn a_stale_entry_names_the_storage_version() {
        // apiserver-samples/29: the entry of a server-side apply through v1alpha1.
        let entries = vec![
            json!({"apiVersion": "mf.acme.io/v1alpha1", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:size": {}}}, "manager": "ssa-old", "operation": "Apply",
            "time": "2026-11-23T11:19:00Z"}),
        ];
        let stale = BTreeSet::from(["v1alpha1".to_owned()]);
        let rewrite = Rewrite {
            group: "mf.acme.io",
            stale: &stale,
            into: "v1",
            translate: &same,
        };
        let rewritten = rewrite.apply(&entries).expect("rewritten");
        assert_eq!(rewritten[0]["apiVersion"], "mf.acme.io/v1");
        assert_eq!(rewritten[0]["fieldsV1"], json!({"f:spec": {"f:size": {}}}));
        assert_eq!(rewritten[0]["manager"], "ssa-old");
        // Nothing stale: nothing to write.
        assert_eq!(rewrite.apply(&rewritten), None);
    }

    #[test]
    fn renamed_fields_are_translated_and_lost_ones_dropped() {
        let translate = |path: &[String], _: &str| -> Option<Vec<String>> {
            match path {
                [a, b, rest @ ..] if a == "spec" && b == "size" => {
                    let mut moved = vec!["spec".to_owned(), "scale".to_owned(), "replicas".to_owned()];
                    moved.extend_from_slice(rest);
                    Some(moved)
                }
                [a, b, ..] if a == "spec" && b == "legacyMode" => None,
                other => Some(other.to_vec()),
            }
        };
        let fields = json!({"f:spec": {".": {}, "f:size": {}, "f:legacyMode": {}, "f:items": {"k:{\"name\":\"a\"}": {".": {}, "f:value": {}}}}});
        let translated = translate_fields(&fields, &|p| translate(p, "v1alpha1"));
        assert_eq!(
            translated,
            json!({"f:spec": {".": {}, "f:scale": {"f:replicas": {}}, "f:items": {"k:{\"name\":\"a\"}": {".": {}, "f:value": {}}}}})
        );
        // An entry that owned only a removed field goes; the others stay.
        let entries = vec![
            json!({"apiVersion": "example.com/v1alpha1", "manager": "legacy", "operation": "Update",
                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:legacyMode": {}}}}),
            json!({"apiVersion": "example.com/v1alpha1", "manager": "kubectl", "operation": "Apply",
                   "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:size": {}}}}),
        ];
        let stale = BTreeSet::from(["v1alpha1".to_owned()]);
        let rewrite = Rewrite {
            group: "example.com",
            stale: &stale,
            into: "v1",
            translate: &translate,
        };
        let rewritten = rewrite.apply(&entries).expect("rewritten");
        assert_eq!(rewritten.len(), 1);
        assert_eq!(rewritten[0]["manager"], "kubectl");
        assert_eq!(
            rewritten[0]["fieldsV1"],
            json!({"f:spec": {"f:scale": {"f:replicas": {}}}})
        );
    }

    #[test]
    fn entries_that_meet_are_merged() {
        let entries = vec![
            json!({"apiVersion": "example.com/v1", "manager": "kubectl", "operation": "Update",
                   "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:a": {}}}}),
            json!({"apiVersion": "example.com/v1alpha1", "manager": "kubectl", "operation": "Update",
                   "time": "2026-02-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:b": {}}}}),
        ];
        let stale = BTreeSet::from(["v1alpha1".to_owned()]);
        let rewrite = Rewrite {
            group: "example.com",
            stale: &stale,
            into: "v1",
            translate: &same,
        };
        let rewritten = rewrite.apply(&entries).expect("rewritten");
        assert_eq!(rewritten.len(), 1);
        assert_eq!(
            rewritten[0]["fieldsV1"],
            json!({"f:spec": {"f:a": {}, "f:b": {}}})
        );
        assert_eq!(rewritten[0]["time"], "2026-02-01T00:00:00Z");
    }
}
