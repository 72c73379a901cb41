//! Leases for leader election.

use serde_json::Value;

use super::*;

pub(super) fn create_lease(state: &mut State, body: Value) -> (u16, Value) {
    let (code, body) = create_named(
        state,
        |state| &mut state.leases,
        "leases.coordination.k8s.io",
        body,
    );
    if code == 201 {
        held(state, &body);
    }
    (code, body)
}

/// Records when the lease's holder last had it stored, and for how long it is valid.
fn held(state: &mut State, lease: &Value) {
    if let Some(holder) = lease["spec"]["holderIdentity"].as_str().filter(|h| !h.is_empty()) {
        let duration =
            std::time::Duration::from_secs(lease["spec"]["leaseDurationSeconds"].as_u64().unwrap_or(0));
        state
            .lease_held
            .insert(holder.to_owned(), (tokio::time::Instant::now(), duration));
    }
}

/// PUT with the resourceVersion read: 409 when someone wrote since (as 12 for objects).
pub(super) fn replace_lease(state: &mut State, name: &str, mut body: Value) -> (u16, Value) {
    let Some(current) = state.leases.get(name) else {
        return not_found("leases.coordination.k8s.io", name);
    };
    if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
        return conflict("leases.coordination.k8s.io", name);
    }
    let before = current["spec"]["holderIdentity"].as_str().map(str::to_owned);
    body["metadata"]["resourceVersion"] = state.next_resource_version().into();
    state.leases.insert(name.to_owned(), body.clone());
    // A holder that released it (or lost it) holds it no more from now.
    if let Some(before) = before
        && body["spec"]["holderIdentity"].as_str() != Some(before.as_str())
    {
        state
            .lease_held
            .insert(before, (tokio::time::Instant::now(), std::time::Duration::ZERO));
    }
    held(state, &body);
    (200, body)
}
