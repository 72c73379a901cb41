//! What a migration writes: an object rewritten through the storage version, its
//! managedFields replaced.

use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use super::Requester;
use super::answer::Answer;
use super::reads::ObjectKey;
use crate::migrate::target::Target;

/// The `Accept` of a write whose answer is not read: the object's metadata, or (from an
/// apiserver that cannot answer so) the whole object.
const METADATA_ONLY_ANSWER: &str =
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

impl Requester<'_> {
    /// Rewrites one object through the storage version: a merge patch carrying only its
    /// resourceVersion changes nothing, but makes the apiserver decode the object and encode
    /// it again in the storage version (apiserver-samples/11); the resourceVersion is a
    /// precondition, so an object written since it was listed answers 409 (12). The answer
    /// is asked for as metadata only (tests/fixtures/rewrite-metadata-only-answer.txt): the
    /// apiserver then encodes no spec or status for a reply nobody reads. `application/json`
    /// after it: an apiserver that cannot answer so answers the whole object.
    pub async fn rewrite(&self, target: &Target, object: &ObjectKey) -> Answer {
        let patch = json!({"metadata": {"resourceVersion": object.resource_version}});
        let collection = kube::core::Request::new(target.collection_path(object.namespace.as_deref()));
        let params = PatchParams::default();
        let request = match target.subresource.as_deref() {
            Some(subresource) => {
                collection.patch_subresource(subresource, &object.name, &params, &Patch::Merge(&patch))
            }
            None => collection.patch(&object.name, &params, &Patch::Merge(&patch)),
        };
        self.answer(request.map(|mut request| {
            request.headers_mut().insert(
                http::header::ACCEPT,
                http::HeaderValue::from_static(METADATA_ONLY_ANSWER),
            );
            request
        }))
        .await
    }

    /// Replaces the object's `metadata.managedFields` with `entries`, guarded by a `test` of
    /// the resourceVersion it was read at (a JSON Patch of managedFields repairs an object,
    /// apiserver-samples/29).
    pub async fn replace_managed_fields(
        &self,
        target: &Target,
        object: &ObjectKey,
        resource_version: &str,
        entries: &[Value],
    ) -> Answer {
        let ops: json_patch::Patch = match serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "replace", "path": "/metadata/managedFields", "value": entries},
        ])) {
            Ok(ops) => ops,
            Err(e) => return Answer::Transport(e.to_string()),
        };
        let request = kube::core::Request::new(target.collection_path(object.namespace.as_deref())).patch(
            &object.name,
            &PatchParams::default(),
            &Patch::<()>::Json(ops),
        );
        self.answer(request).await
    }
}
