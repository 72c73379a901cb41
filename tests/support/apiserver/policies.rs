//! VersionPolicies: status server-side applies per field manager, finalizers, deletion.

use serde_json::{Value, json};

use super::*;

/// Server-side apply of a policy's status, tracking ownership per field manager at the
/// granularity of the status' top-level fields: a manager's apply sets the fields it sends
/// and removes the ones it owned before and no longer sends; other managers' fields stay.
/// An apply that changes nothing keeps the resourceVersion and sends no watch event
/// (tests/fixtures/watch/versionpolicies.txt).
pub(super) fn apply_policy_status(state: &mut State, name: &str, manager: &str, body: Value) -> (u16, Value) {
    let Some(before) = state.policies.get(name).cloned() else {
        return not_found("versionpolicies.crdlifecycle.io", name);
    };
    let mut policy = before.clone();
    let applied = body["status"].as_object().cloned().unwrap_or_default();
    let owners = state
        .status_owners
        .entry((name.to_owned(), manager.to_owned()))
        .or_default();
    if !policy["status"].is_object() {
        policy["status"] = json!({});
    }
    let status = policy["status"].as_object_mut().expect("object");
    for field in owners.iter().filter(|f| !applied.contains_key(*f)) {
        status.remove(field);
    }
    *owners = applied.keys().cloned().collect();
    for (field, value) in applied {
        status.insert(field, value);
    }
    if policy == before {
        return (200, before);
    }
    policy["metadata"]["resourceVersion"] = state.next_resource_version().into();
    state.record(Watched::Policies, "MODIFIED", &policy);
    state.policies.insert(name.to_owned(), policy.clone());
    (200, policy)
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
