//! Leases for leader election.

use serde_json::Value;

use super::*;

pub(super) fn create_lease(state: &mut State, body: Value) -> (u16, Value) {
    create_named(
        state,
        |state| &mut state.leases,
        "leases.coordination.k8s.io",
        body,
    )
}

/// PUT with the resourceVersion read: 409 when someone wrote since (as 12 for objects).
pub(super) fn replace_lease(state: &mut State, name: &str, mut body: Value) -> (u16, Value) {
    let Some(current) = state.leases.get(name) else {
        return not_found("leases.coordination.k8s.io", name);
    };
    if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
        return conflict("leases.coordination.k8s.io", name);
    }
    body["metadata"]["resourceVersion"] = state.next_resource_version().into();
    state.leases.insert(name.to_owned(), body.clone());
    (200, body)
}
