//! Custom objects of every CRD: discovery, paged lists, reads, rewrites, faults.

use std::collections::BTreeMap;

use http::Response;
use kube::client::Body;
use serde_json::{Value, json};

use super::*;

/// A custom object: the version its bytes are encoded in in "etcd", and its data.
#[derive(Clone, Debug)]
pub struct StoredObject {
    pub encoded_as: String,
    pub resource_version: String,
    pub data: Value,
    /// `metadata.managedFields` (samples 11, 28, 29 show them on every object).
    pub managed_fields: Vec<Value>,
}

/// What the fake answers for one object instead of processing the request.
#[derive(Clone, Debug)]
pub enum ObjectFault {
    /// A conversion webhook that fails for this object, every time (samples 20, 21).
    ConversionFails(String),
    /// The next `times` requests get this status, with `Retry-After` seconds if given.
    Transient {
        code: u16,
        times: u32,
        retry_after: Option<u64>,
    },
    /// The next `times` requests never get an answer (a hung connection).
    Stall { times: u32 },
    /// Every write is refused as invalid under the current schema (e.g. a schema tightened
    /// after the object was written): 422 `Invalid` with the field errors, the Status the
    /// apiserver answers for an object that fails validation (as samples 04, 05 and 22 show
    /// for CRDs); reads still work.
    Invalid(String),
}

/// What the fake answers for the next list request of custom objects instead of a page.
#[derive(Clone, Debug)]
pub enum ListFault {
    /// An error status (5xx, 429), with `Retry-After` seconds if given.
    Status { code: u16, retry_after: Option<u64> },
    /// No answer at all (a hung connection).
    Stall,
}

impl State {
    /// A client writes the first `count` objects of the CRD (in key order): each is stored
    /// in the storage version of the moment with a new resourceVersion, as every write
    /// (sample 11).
    pub fn write_objects(&mut self, crd: &str, count: usize) {
        let storage = self
            .crds
            .get(crd)
            .and_then(|c| c["spec"]["versions"].as_array().cloned())
            .into_iter()
            .flatten()
            .find(|v| v["storage"] == true)
            .and_then(|v| v["name"].as_str().map(str::to_owned))
            .expect("a storage version");
        let keys: Vec<_> = self
            .objects
            .keys()
            .filter(|(c, _, _)| c == crd)
            .take(count)
            .cloned()
            .collect();
        for key in keys {
            let resource_version = self.next_resource_version();
            if let Some(object) = self.objects.get_mut(&key) {
                object.encoded_as = storage.clone();
                object.resource_version = resource_version;
            }
        }
    }
}

/// `/apis/<group>/<version>`: a discovery document, not a custom-object path.
pub(super) fn is_discovery(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    matches!(segments.as_slice(), ["apis", _, _])
}

/// Discovery of a custom group version (samples 25, 26): every CRD of the group that serves
/// the version, as the answering apiserver sees it, with its `storageVersionHash` (derived
/// from the storage version; the derivation reproduces both samples, see
/// `discovery_hashes_are_the_recorded_ones`). A group version nobody serves answers the
/// plain-text 404 of an unserved path (as sample 15).
pub(super) fn discovery(state: &mut State, group: &str, version: &str) -> Response<Body> {
    let names: Vec<String> = state
        .crds
        .iter()
        .filter(|(_, crd)| crd["spec"]["group"] == group)
        .map(|(name, _)| name.clone())
        .collect();
    let mut resources = Vec::new();
    for name in names {
        let Some(crd) = state.effective_crd(&name) else {
            continue;
        };
        let versions = crd["spec"]["versions"].as_array().cloned().unwrap_or_default();
        if !versions
            .iter()
            .any(|v| v["name"] == version && v["served"] == true)
        {
            continue;
        }
        let storage = versions
            .iter()
            .find(|v| v["storage"] == true)
            .and_then(|v| v["name"].as_str())
            .unwrap_or_default()
            .to_owned();
        let kind = crd["spec"]["names"]["kind"].as_str().unwrap_or_default();
        resources.push(json!({
            "name": crd["spec"]["names"]["plural"],
            "singularName": crd["spec"]["names"]["singular"].as_str().map_or_else(|| kind.to_lowercase(), str::to_owned),
            "namespaced": crd["spec"]["scope"] == "Namespaced",
            "kind": kind,
            "verbs": ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"],
            "storageVersionHash": crd_lifecycle::migrate::storage_version_hash(group, &storage, kind),
        }));
    }
    if resources.is_empty() {
        return plain_not_found();
    }
    respond(
        200,
        &json!({"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": format!("{group}/{version}"), "resources": resources}),
    )
}

/// A request for custom objects: which CRD, through which version, which object.
pub(super) struct CustomRequest {
    pub(super) crd: String,
    pub(super) version: String,
    pub(super) served: bool,
    pub(super) storage: String,
    pub(super) kind: String,
    pub(super) group: String,
    pub(super) plural: String,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    /// `status` for requests to the `/status` subresource.
    pub(super) subresource: Option<String>,
}

pub(super) fn custom_resource(state: &mut State, segments: &[&str]) -> Option<CustomRequest> {
    let ["apis", group, version, rest @ ..] = segments else {
        return None;
    };
    let (namespace, plural, name, subresource) = match rest {
        [plural] => (None, *plural, None, None),
        ["namespaces", ns, plural] => (Some(*ns), *plural, None, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name), None),
        ["namespaces", ns, plural, name, "status"] => (Some(*ns), *plural, Some(*name), Some("status")),
        [plural, name] => (None, *plural, Some(*name), None),
        [plural, name, "status"] => (None, *plural, Some(*name), Some("status")),
        _ => return None,
    };
    let crd_name = state
        .crds
        .iter()
        .find(|(_, c)| c["spec"]["group"] == *group && c["spec"]["names"]["plural"] == *plural)?
        .0
        .clone();
    let crd = &state.effective_crd(&crd_name)?;
    let versions = crd["spec"]["versions"].as_array()?;
    let entry = versions.iter().find(|v| v["name"] == *version)?;
    // Only a version with a status subresource serves `/status`.
    if subresource.is_some() && entry["subresources"]["status"].is_null() {
        return None;
    }
    let storage = versions.iter().find(|v| v["storage"] == true)?["name"]
        .as_str()?
        .to_owned();
    Some(CustomRequest {
        crd: crd_name,
        version: (*version).to_owned(),
        served: entry["served"] == true,
        storage,
        kind: crd["spec"]["names"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        group: (*group).to_owned(),
        plural: (*plural).to_owned(),
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
        subresource: subresource.map(str::to_owned),
    })
}

/// Custom objects: metadata-only lists in pages (09, 10), reads and rewrites through a
/// version (11), with the apiserver's answers for unserved versions (15), stale
/// preconditions (12), deleted objects (13), expired continue tokens (16) and failing
/// conversion webhooks (20, 21).
pub(super) fn serve_custom(state: &mut State, request: &Recorded, target: &CustomRequest) -> Response<Body> {
    if !target.served {
        return plain_not_found();
    }
    let Some(name) = &target.name else {
        return list_custom(state, request, target);
    };
    let namespace = target.namespace.clone().unwrap_or_default();
    let key = (target.crd.clone(), namespace.clone(), name.clone());
    let fault_key = format!("{namespace}/{name}");
    let converting = state
        .objects
        .get(&key)
        .is_some_and(|o| o.encoded_as != target.version)
        || request.method == "PATCH";
    match state.faults.get_mut(&fault_key) {
        Some(ObjectFault::ConversionFails(message)) if converting => {
            let message = format!(
                "conversion webhook for {}/{}, Kind={} failed: {message}",
                target.group, target.version, target.kind
            );
            return respond(
                500,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                        "status": "Failure", "message": message, "code": 500}),
            );
        }
        Some(ObjectFault::Invalid(message)) if request.method == "PATCH" => {
            let message = format!("{} \"{name}\" is invalid: {message}", target.kind);
            return respond(422, &status_body(422, "Invalid", &message));
        }
        Some(ObjectFault::Transient {
            code,
            times,
            retry_after,
        }) if *times > 0 => {
            *times -= 1;
            return try_again_later(*code, *retry_after);
        }
        _ => {}
    }
    let resource = format!("{}.{}", target.plural, target.group);
    let Some(object) = state.objects.get(&key).cloned() else {
        let (code, body) = not_found(&resource, name);
        return respond(code, &body);
    };
    match request.method.as_str() {
        "GET" => respond(200, &object_json(&object, target, &namespace, name)),
        "PATCH" if request.content_type.starts_with("application/apply-patch") => {
            server_side_apply(state, request, target, key, object)
        }
        "PATCH" if request.content_type.starts_with("application/json-patch") => {
            // A JSON Patch (e.g. of managedFields, sample 29); a failing `test` answers 422
            // with the generic message (as sample 03).
            let mut view = object_json(&object, target, &namespace, name);
            if let Err((code, body)) = apply_json_patch(&mut view, &request.body) {
                return respond(code, &body);
            }
            let resource_version = state.next_resource_version();
            let updated = StoredObject {
                encoded_as: target.storage.clone(),
                resource_version,
                data: object.data,
                managed_fields: view["metadata"]["managedFields"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
            };
            state.objects.insert(key, updated.clone());
            respond(200, &object_json(&updated, target, &namespace, name))
        }
        "PATCH" => {
            let precondition = request
                .body
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str);
            if precondition.is_some_and(|rv| rv != object.resource_version) {
                let (code, body) = conflict(&resource, name);
                return respond(code, &body);
            }
            // Through the main resource or `/status` alike (sample 31): encoded again in the
            // storage version of the apiserver answering. When that
            // gives the bytes already stored, etcd3's store writes nothing and the
            // resourceVersion stays (its GuaranteedUpdate skips an unchanged value; no sample
            // records this: sample 11 shows a rewrite that did change the encoding).
            if object.encoded_as == target.storage {
                return respond(200, &object_json(&object, target, &namespace, name));
            }
            let resource_version = state.next_resource_version();
            let updated = StoredObject {
                encoded_as: target.storage.clone(),
                resource_version,
                data: object.data,
                managed_fields: object.managed_fields,
            };
            state.objects.insert(key, updated.clone());
            respond(200, &object_json(&updated, target, &namespace, name))
        }
        _ => respond(405, &status_body(405, "MethodNotAllowed", "method not allowed")),
    }
}

pub(super) fn object_json(
    object: &StoredObject,
    target: &CustomRequest,
    namespace: &str,
    name: &str,
) -> Value {
    let mut data = object.data.clone();
    data["apiVersion"] = json!(format!("{}/{}", target.group, target.version));
    data["kind"] = json!(target.kind);
    data["metadata"] =
        json!({"name": name, "namespace": namespace, "resourceVersion": object.resource_version});
    if !object.managed_fields.is_empty() {
        data["metadata"]["managedFields"] = json!(object.managed_fields);
    }
    data
}

/// Server-side apply of `spec` fields. An object whose managedFields name a version the CRD
/// no longer has answers 500 "request to convert CR to an invalid group/version" for any
/// field manager (sample 29); otherwise the fields are set and the manager's Apply entry
/// (in the request's version) owns them.
pub(super) fn server_side_apply(
    state: &mut State,
    request: &Recorded,
    target: &CustomRequest,
    key: (String, String, String),
    object: StoredObject,
) -> Response<Body> {
    let versions: Vec<String> = state.crds[&target.crd]["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str().map(str::to_owned))
        .collect();
    for entry in &object.managed_fields {
        let api_version = entry["apiVersion"].as_str().unwrap_or_default();
        let version = api_version.rsplit_once('/').map_or("", |(_, v)| v);
        if !versions.iter().any(|v| v == version) {
            let message = format!("request to convert CR to an invalid group/version: {api_version}");
            return respond(
                500,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": message, "code": 500}),
            );
        }
    }
    let manager = request.query_param("fieldManager");
    let mut updated = object;
    let spec = request.body["spec"].as_object().cloned().unwrap_or_default();
    let mut owned = serde_json::Map::new();
    for (field, value) in spec {
        owned.insert(format!("f:{field}"), json!({}));
        updated.data["spec"][field.as_str()] = value;
    }
    let api_version = format!("{}/{}", target.group, target.version);
    updated
        .managed_fields
        .retain(|e| !(e["manager"] == manager.as_str() && e["operation"] == "Apply"));
    updated.managed_fields.push(
        json!({"manager": manager, "operation": "Apply", "apiVersion": api_version,
                                       "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": owned}}),
    );
    updated.resource_version = state.next_resource_version();
    updated.encoded_as = target.storage.clone();
    state.objects.insert(key.clone(), updated.clone());
    respond(200, &object_json(&updated, target, &key.1, &key.2))
}

/// A list in name order, `limit` at a time: metadata-only (`PartialObjectMetadataList`,
/// samples 09, 10) without `remainingItemCount`, or of full objects with it (sample 30). The
/// continue token names the compaction epoch it was issued in and the last object returned;
/// after a compaction it answers 410 with a fresh token that goes on after that object
/// (samples 27, 28).
pub(super) fn list_custom(state: &mut State, request: &Recorded, target: &CustomRequest) -> Response<Body> {
    if let Some(fault) = state.list_faults.pop_front() {
        match fault {
            ListFault::Status { code, retry_after } => return try_again_later(code, retry_after),
            // Handled before the request got here.
            ListFault::Stall => {}
        }
    }
    let query: BTreeMap<String, String> = request
        .query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_owned(), percent_decode(v)))
        .collect();
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(usize::MAX);
    let epoch = state.token_epoch();
    let after = match query.get("continue") {
        Some(token) => {
            let Some((issued, last)) = token.split_once(':') else {
                return respond(400, &status_body(400, "BadRequest", "invalid continue token"));
            };
            if issued != epoch.to_string() {
                let message = "The provided continue parameter is too old to display a consistent list result. \
                               You can start a new list without the continue parameter, or use the continue token \
                               in this response to retrieve the remainder of the results. Continuing with the \
                               provided token results in an inconsistent list - objects that were created, \
                               modified, or deleted between the time the first chunk was returned and now may \
                               show up in the list.";
                let mut body = status_body(410, "Expired", message);
                if !state.expired_without_token {
                    body["metadata"]["continue"] = json!(format!("{epoch}:{last}"));
                }
                return respond(410, &body);
            }
            Some(last.to_owned())
        }
        None => None,
    };
    let metadata_only = request.accept.contains("as=PartialObjectMetadataList");
    let mut items = Vec::new();
    let mut last_key = None;
    let mut remaining = 0u64;
    for ((crd, namespace, name), object) in &state.objects {
        if *crd != target.crd || target.namespace.as_ref().is_some_and(|ns| ns != namespace) {
            continue;
        }
        let key = format!("{namespace}/{name}");
        if after.as_ref().is_some_and(|a| key <= *a) {
            continue;
        }
        if items.len() == limit {
            remaining += 1;
            continue;
        }
        items.push(if metadata_only {
            let mut item = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                   "metadata": {"name": name, "namespace": namespace,
                                "resourceVersion": object.resource_version}});
            if !object.managed_fields.is_empty() {
                item["metadata"]["managedFields"] = json!(object.managed_fields);
            }
            item
        } else {
            object_json(object, target, namespace, name)
        });
        last_key = Some(key);
    }
    let mut metadata = json!({"resourceVersion": state.resource_version.to_string()});
    if remaining > 0
        && let Some(last) = last_key
    {
        metadata["continue"] = json!(format!("{epoch}:{last}"));
        if !metadata_only {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    if metadata_only {
        // Compactions happen between pages: the token just issued may be the next to expire.
        state.first_list_at.get_or_insert_with(tokio::time::Instant::now);
        state.pages_served += 1;
        if let Some(hook) = state.after_list_page.pop_front() {
            hook(state);
        }
    }
    let (kind, api_version) = if metadata_only {
        (
            "PartialObjectMetadataList".to_owned(),
            "meta.k8s.io/v1".to_owned(),
        )
    } else {
        (
            format!("{}List", target.kind),
            format!("{}/{}", target.group, target.version),
        )
    };
    respond(
        200,
        &json!({"kind": kind, "apiVersion": api_version, "metadata": metadata, "items": items}),
    )
}

pub(super) fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(byte) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }

        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
