//! VersionPolicies: status server-side applies per field manager, finalizers, deletion.

use serde_json::{Value, json};

use super::*;

/// Server-side apply of a policy's status, tracking ownership per field manager at the
/// granularity of the status' top-level fields, and of the entries (by key) of those that
/// are list maps (`x-kubernetes-list-type: map` in the VersionPolicy CRD): a manager's apply
/// sets the fields and entries it sends and removes those it owned before and no longer
/// sends, unless another manager owns them too; other managers' fields and entries stay
/// (tests/fixtures/ssa-status-list-map.txt, recorded from kube-apiserver v1.36). Within an
/// entry, the applying manager's copy replaces the whole entry (each entry has one writer).
/// An apply that changes nothing keeps the resourceVersion and sends no watch event
/// (tests/fixtures/watch/versionpolicies.txt).
pub(super) fn apply_policy_status(state: &mut State, name: &str, manager: &str, body: Value) -> (u16, Value) {
    let Some(before) = state.policies.get(name).cloned() else {
        return not_found("versionpolicies.crdlifecycle.io", name);
    };
    let mut policy = before.clone();
    let applied = body["status"].as_object().cloned().unwrap_or_default();
    let list_maps = status_list_maps();
    let key_of = |field: &str, entry: &Value| {
        let keys = &list_maps[field];
        let values: Vec<&Value> = keys.iter().map(|k| &entry[k.as_str()]).collect();
        format!("{field}\0{}", json!(values))
    };
    let mut owned: Vec<String> = Vec::new();
    for (field, value) in &applied {
        match value.as_array().filter(|_| list_maps.contains_key(field)) {
            Some(entries) => owned.extend(entries.iter().map(|e| key_of(field, e))),
            None => owned.push(field.clone()),
        }
    }
    let others: std::collections::BTreeSet<String> = state
        .status_owners
        .iter()
        .filter(|((policy, other), _)| policy == name && other != manager)
        .flat_map(|(_, paths)| paths.iter().cloned())
        .collect();
    let previous = state
        .status_owners
        .insert((name.to_owned(), manager.to_owned()), owned.clone())
        .unwrap_or_default();
    if !policy["status"].is_object() {
        policy["status"] = json!({});
    }
    let status = policy["status"].as_object_mut().expect("object");
    for path in previous
        .iter()
        .filter(|p| !owned.contains(p) && !others.contains(*p))
    {
        match path.split_once('\0') {
            None => {
                status.remove(path);
            }
            Some((field, _)) => {
                if let Some(entries) = status.get_mut(field).and_then(Value::as_array_mut) {
                    entries.retain(|e| key_of(field, e) != *path);
                }
            }
        }
    }
    for (field, value) in applied {
        match value.as_array().filter(|_| list_maps.contains_key(&field)) {
            Some(entries) => {
                let list = status.entry(field.clone()).or_insert_with(|| json!([]));
                if !list.is_array() {
                    *list = json!([]);
                }
                let list = list.as_array_mut().expect("array");
                for entry in entries {
                    let key = key_of(&field, entry);
                    match list.iter_mut().find(|e| key_of(&field, e) == key) {
                        Some(existing) => *existing = entry.clone(),
                        None => list.push(entry.clone()),
                    }
                }
            }
            None => {
                status.insert(field, value);
            }
        }
    }
    if policy == before {
        return (200, before);
    }
    policy["metadata"]["resourceVersion"] = state.next_resource_version().into();
    state.record(Watched::Policies, "MODIFIED", &policy);
    state.policies.insert(name.to_owned(), policy.clone());
    (200, policy)
}

/// The status fields of the VersionPolicy CRD that are list maps, with their keys.
fn status_list_maps() -> &'static BTreeMap<String, Vec<String>> {
    static LIST_MAPS: std::sync::OnceLock<BTreeMap<String, Vec<String>>> = std::sync::OnceLock::new();
    LIST_MAPS.get_or_init(|| {
        let crd = serde_json::to_value(crd_lifecycle::api::versionpolicy_crd()).expect("CRD");
        let mut maps = BTreeMap::new();
        for version in crd["spec"]["versions"].as_array().into_iter().flatten() {
            let fields = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
            for (field, schema) in fields.as_object().into_iter().flatten() {
                if schema["x-kubernetes-list-type"] == "map" {
                    let keys = schema["x-kubernetes-list-map-keys"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|k| k.as_str().map(str::to_owned))
                        .collect();
                    maps.insert(field.clone(), keys);
                }
            }
        }
        maps
    })
}

/// JSON Patch on a policy (its finalizers): an object being deleted goes once its last
/// finalizer is removed, with a DELETED event; a spec change adds 1 to the generation
/// (tests/fixtures/watch/versionpolicies.txt).
pub(super) fn patch_policy(state: &mut State, name: &str, body: Value) -> (u16, Value) {
    let Some(before) = state.policies.get(name).cloned() else {
        return not_found("versionpolicies.crdlifecycle.io", name);
    };
    let mut policy = before.clone();
    if let Err(answer) = apply_json_patch(&mut policy, &body) {
        return answer;
    }
    if policy == before {
        return (200, before);
    }
    if policy["spec"] != before["spec"] {
        let generation = policy["metadata"]["generation"].as_i64().unwrap_or(1);
        policy["metadata"]["generation"] = json!(generation + 1);
    }
    policy["metadata"]["resourceVersion"] = state.next_resource_version().into();
    let unfinalized = policy["metadata"]["finalizers"]
        .as_array()
        .is_none_or(Vec::is_empty);
    if policy["metadata"].get("deletionTimestamp").is_some() && unfinalized {
        state.record(Watched::Policies, "DELETED", &policy);
        state.policies.remove(name);
    } else {
        state.record(Watched::Policies, "MODIFIED", &policy);
        state.policies.insert(name.to_owned(), policy.clone());
    }
    (200, policy)
}

/// DELETE of a policy: with finalizers it only gets a deletionTimestamp and generation + 1
/// (tests/fixtures/watch/versionpolicies.txt).
pub(super) fn delete_policy(state: &mut State, name: &str) -> (u16, Value) {
    let rv = state.next_resource_version();
    let Some(policy) = state.policies.get_mut(name) else {
        return not_found("versionpolicies.crdlifecycle.io", name);
    };
    if policy["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty())
    {
        if policy["metadata"].get("deletionTimestamp").is_none() {
            let generation = policy["metadata"]["generation"].as_i64().unwrap_or(1);
            policy["metadata"]["generation"] = json!(generation + 1);
        }
        policy["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        policy["metadata"]["resourceVersion"] = rv.into();
        let policy = policy.clone();
        state.record(Watched::Policies, "MODIFIED", &policy);
        return (200, policy);
    }
    let mut removed = state.policies.remove(name).unwrap_or(Value::Null);
    removed["metadata"]["resourceVersion"] = rv.into();
    state.record(Watched::Policies, "DELETED", &removed);
    (200, removed)
}
