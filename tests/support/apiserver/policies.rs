//! VersionPolicies: status server-side applies per field manager, finalizers, deletion.

use serde_json::{Value, json};

use super::*;

/// Server-side apply of a policy's status, tracking ownership per field manager at the
/// granularity of the status' top-level fields: a manager's apply sets the fields it sends
/// and removes the ones it owned before and no longer sends; other managers' fields stay.
pub(super) fn apply_policy_status(state: &mut State, name: &str, manager: &str, body: Value) -> (u16, Value) {
    let rv = state.next_resource_version();
    let Some(policy) = state.policies.get_mut(name) else {
        return not_found("versionpolicies.crdlifecycle.io", name);
    };
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
    policy["metadata"]["resourceVersion"] = rv.into();
    (200, policy.clone())
}

/// JSON Patch on a policy (its finalizers). Finalizers follow Kubernetes' documented
/// semantics (no recorded sample): an object being deleted goes once its last finalizer is
/// removed.
pub(super) fn patch_policy(state: &mut State, name: &str, body: Value) -> (u16, Value) {
    let rv = state.next_resource_version();
    let Some(mut policy) = state.policies.get(name).cloned() else {
        return not_found("versionpolicies.crdlifecycle.io", name);
    };
    if let Err(answer) = apply_json_patch(&mut policy, &body) {
        return answer;
    }
    policy["metadata"]["resourceVersion"] = rv.into();
    let unfinalized = policy["metadata"]["finalizers"]
        .as_array()
        .is_none_or(Vec::is_empty);
    if policy["metadata"].get("deletionTimestamp").is_some() && unfinalized {
        state.policies.remove(name);
    } else {
        state.policies.insert(name.to_owned(), policy.clone());
    }
    (200, policy)
}

/// DELETE of a policy: with finalizers it only gets a deletionTimestamp.
pub(super) fn delete_policy(state: &mut State, name: &str) -> (u16, Value) {
    let rv = state.next_resource_version();
    let Some(policy) = state.policies.get_mut(name) else {
        return not_found("versionpolicies.crdlifecycle.io", name);
    };
    if policy["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty())
    {
        policy["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        policy["metadata"]["resourceVersion"] = rv.into();
        return (200, policy.clone());
    }
    let removed = state.policies.remove(name).unwrap_or(Value::Null);
    (200, removed)
}
