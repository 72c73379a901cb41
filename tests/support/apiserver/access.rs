//! SelfSubjectAccessReviews: may the caller do a verb on a resource?
//!
//! No recorded sample yet: the shape follows k8s-openapi's documented types
//! (`authorization.k8s.io/v1` SelfSubjectAccessReview: the request's `spec` is echoed and
//! `status.allowed` answers; `status.denied` and `status.reason` are optional; the create
//! answers 201). Everything is allowed unless a test denies it.

use serde_json::{Value, json};

use super::*;

/// A denied `(verb, group, resource, subresource)`; `subresource` is "" for the resource.
pub type Denied = (String, String, String, String);

pub(super) fn review_access(state: &mut State, mut body: Value) -> (u16, Value) {
    let attributes = &body["spec"]["resourceAttributes"];
    let field = |name: &str| attributes[name].as_str().unwrap_or_default().to_owned();
    let asked: Denied = (
        field("verb"),
        field("group"),
        field("resource"),
        field("subresource"),
    );
    state.access_reviews.push(asked.clone());
    let allowed = !state.denied.contains(&asked);
    body["status"] = if allowed {
        json!({"allowed": true, "reason": "allowed by the fake apiserver"})
    } else {
        json!({"allowed": false})
    };
    (201, body)
}
