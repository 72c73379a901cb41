//! A small stateful in-memory apiserver behind kube's `Client`, for flows that span many
//! calls. It implements only what crd-lifecycle uses, and each apiserver rule it encodes
//! cites the recorded response in `../shared/apiserver-samples/` it was checked against.

#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

/// One request as the fake received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    pub body: Value,
}

type Hook = Box<dyn FnOnce(&mut State) + Send>;

#[derive(Default)]
pub struct State {
    pub crds: BTreeMap<String, Value>,
    pub policies: BTreeMap<String, Value>,
    pub events: Vec<Value>,
    pub leases: BTreeMap<String, Value>,
    pub requests: Vec<Recorded>,
    resource_version: u64,
    /// Run just before the next CRD patch is applied: another writer racing us.
    before_crd_patch: VecDeque<Hook>,
    /// Canned failures for the next CRD patches: (status code, message).
    crd_patch_failures: VecDeque<(u16, String)>,
}

impl State {
    fn next_resource_version(&mut self) -> String {
        self.resource_version += 1;
        (10_000 + self.resource_version).to_string()
    }

    /// Stores a CRD as the apiserver would after a write: new resourceVersion, generation
    /// bumped when the spec changed.
    pub fn store_crd(&mut self, mut crd: Value, spec_changed: bool) {
        let rv = self.next_resource_version();
        let name = crd["metadata"]["name"].as_str().expect("CRD name").to_owned();
        let meta = crd["metadata"].as_object_mut().expect("metadata");
        meta.insert("resourceVersion".into(), rv.into());
        let generation = meta.get("generation").and_then(Value::as_i64).unwrap_or(0);
        meta.insert(
            "generation".into(),
            (if spec_changed {
                generation + 1
            } else {
                generation.max(1)
            })
            .into(),
        );
        self.crds.insert(name, crd);
    }
}

/// The fake; clone it freely, every clone shares the state.
#[derive(Clone, Default)]
pub struct FakeApiserver {
    pub state: Arc<Mutex<State>>,
}

impl FakeApiserver {
    pub fn new() -> Self {
        Self::default()
    }

    /// A kube client talking to this fake.
    pub fn client(&self) -> Client {
        let fake = self.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let fake = fake.clone();
            async move { Ok::<_, Infallible>(fake.handle(request).await) }
        });
        Client::new(service, "default")
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates a CRD; like the apiserver, `status.storedVersions` starts as the storage
    /// version unless given.
    pub fn create_crd(&self, mut crd: Value) {
        if crd.pointer("/status/storedVersions").is_none() {
            let storage = crd["spec"]["versions"]
                .as_array()
                .and_then(|vs| vs.iter().find(|v| v["storage"] == true))
                .map(|v| v["name"].clone());
            crd["status"] = json!({"storedVersions": storage.into_iter().collect::<Vec<_>>()});
        }
        crd["metadata"]["generation"] = json!(1);
        self.lock().store_crd(crd, false);
    }

    pub fn crd(&self, name: &str) -> Value {
        self.lock().crds.get(name).cloned().unwrap_or(Value::Null)
    }

    /// Another writer changes the CRD (e.g. `kubectl edit`, a Helm upgrade).
    pub fn edit_crd(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        let mut state = self.lock();
        let mut crd = state.crds.get(name).cloned().expect("CRD exists");
        let before = crd["spec"].clone();
        edit(&mut crd);
        let spec_changed = crd["spec"] != before;
        state.store_crd(crd, spec_changed);
    }

    pub fn create_policy(&self, policy: Value) {
        let mut state = self.lock();
        let rv = state.next_resource_version();
        let name = policy["metadata"]["name"].as_str().expect("name").to_owned();
        let mut policy = policy;
        policy["metadata"]["resourceVersion"] = rv.into();
        state.policies.insert(name, policy);
    }

    pub fn policy(&self, name: &str) -> Value {
        self.lock().policies.get(name).cloned().unwrap_or(Value::Null)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    pub fn clear_requests(&self) {
        self.lock().requests.clear();
    }

    /// The writes (anything but GET) to CRDs.
    pub fn crd_writes(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET" && r.path.starts_with("/apis/apiextensions.k8s.io/"))
            .collect()
    }

    pub fn events(&self) -> Vec<Value> {
        self.lock().events.clone()
    }

    /// (type, reason, note) of every event, oldest first.
    pub fn event_summaries(&self) -> Vec<(String, String, String)> {
        self.events()
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap_or_default().to_owned(),
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                    e["note"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    pub fn before_next_crd_patch(&self, hook: impl FnOnce(&mut State) + Send + 'static) {
        self.lock().before_crd_patch.push_back(Box::new(hook));
    }

    pub fn fail_next_crd_patch(&self, code: u16, message: &str) {
        self.lock()
            .crd_patch_failures
            .push_back((code, message.to_owned()));
    }

    async fn handle(&self, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        let recorded = Recorded {
            method: parts.method.to_string(),
            path: parts.uri.path().to_owned(),
            query: parts.uri.query().unwrap_or_default().to_owned(),
            content_type: parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            body: body.clone(),
        };
        let mut state = self.lock();
        state.requests.push(recorded.clone());
        let segments: Vec<&str> = recorded.path.trim_start_matches('/').split('/').collect();
        let (code, reply) = route(&mut state, &recorded, &segments, body);
        respond(code, &reply)
    }
}

fn route(state: &mut State, request: &Recorded, segments: &[&str], body: Value) -> (u16, Value) {
    match (request.method.as_str(), segments) {
        ("GET", ["version"]) => (200, json!({"major": "1", "minor": "21", "gitVersion": "v1.21.0"})),
        (
            "GET",
            [
                "apis",
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                name,
            ],
        ) => match state.crds.get(*name) {
            Some(crd) => (200, crd.clone()),
            None => not_found("customresourcedefinitions.apiextensions.k8s.io", name),
        },
        (
            "PATCH",
            [
                "apis",
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                name,
            ],
        ) => patch_crd(state, name, body),
        (
            "PATCH",
            [
                "apis",
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                name,
                "status",
            ],
        ) => patch_crd_status(state, name, body),
        (
            "PATCH",
            [
                "apis",
                "crdlifecycle.io",
                "v1alpha1",
                "versionpolicies",
                name,
                "status",
            ],
        ) => apply_policy_status(state, name, body),
        ("POST", ["apis", "events.k8s.io", "v1", "namespaces", _, "events"]) => {
            state.events.push(body.clone());
            (201, body)
        }
        ("PATCH", ["apis", "events.k8s.io", "v1", "namespaces", _, "events", _]) => (200, body),
        (
            "GET",
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                _,
                "leases",
                name,
            ],
        ) => match state.leases.get(*name) {
            Some(lease) => (200, lease.clone()),
            None => not_found("leases.coordination.k8s.io", name),
        },
        ("POST", ["apis", "coordination.k8s.io", "v1", "namespaces", _, "leases"]) => {
            create_lease(state, body)
        }
        (
            "PUT",
            [
                "apis",
                "coordination.k8s.io",
                "v1",
                "namespaces",
                _,
                "leases",
                name,
            ],
        ) => replace_lease(state, name, body),
        _ => (
            404,
            status_body(
                404,
                "NotFound",
                &format!(
                    "the fake apiserver does not serve {} {}",
                    request.method, request.path
                ),
            ),
        ),
    }
}

/// JSON Patch on a CRD, with the apiserver's checks:
/// - a failing `test` op answers 422 with a generic message (apiserver-samples/03);
/// - exactly one storage version (05), every stored version still in spec.versions (04);
/// - a new storage version is appended to status.storedVersions (02, 06).
fn patch_crd(state: &mut State, name: &str, body: Value) -> (u16, Value) {
    if let Some(hook) = state.before_crd_patch.pop_front() {
        hook(state);
    }
    if let Some((code, message)) = state.crd_patch_failures.pop_front() {
        return (code, status_body(code, "Invalid", &message));
    }
    let Some(mut crd) = state.crds.get(name).cloned() else {
        return not_found("customresourcedefinitions.apiextensions.k8s.io", name);
    };
    let Ok(patch) = serde_json::from_value::<json_patch::Patch>(body) else {
        return (400, status_body(400, "BadRequest", "invalid JSON Patch"));
    };
    let before = crd["spec"].clone();
    if json_patch::patch(&mut crd, &patch).is_err() {
        return (
            422,
            status_body(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request",
            ),
        );
    }
    let versions = crd["spec"]["versions"].as_array().cloned().unwrap_or_default();
    let storage: Vec<&Value> = versions.iter().filter(|v| v["storage"] == true).collect();
    if storage.len() != 1 {
        let message = format!(
            "CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: spec.versions: Invalid value: ...: \
             must have exactly one version marked as storage version"
        );
        return (422, status_body(422, "Invalid", &message));
    }
    let storage_name = storage[0]["name"].clone();
    let stored = crd["status"]["storedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (i, stored_version) in stored.iter().enumerate() {
        if !versions.iter().any(|v| v["name"] == *stored_version) {
            let message = format!(
                "CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: status.storedVersions[{i}]: \
                 Invalid value: {stored_version}: must appear in spec.versions"
            );
            return (422, status_body(422, "Invalid", &message));
        }
    }
    if !stored.contains(&storage_name) {
        let mut stored = stored;
        stored.push(storage_name);
        crd["status"]["storedVersions"] = Value::Array(stored);
    }
    let spec_changed = crd["spec"] != before;
    state.store_crd(crd, spec_changed);
    (200, state.crds[name].clone())
}

/// Merge patch on the CRD status subresource: accepted whatever the objects are stored
/// as (apiserver-samples/14).
fn patch_crd_status(state: &mut State, name: &str, body: Value) -> (u16, Value) {
    let Some(mut crd) = state.crds.get(name).cloned() else {
        return not_found("customresourcedefinitions.apiextensions.k8s.io", name);
    };
    if let Some(expected) = body.pointer("/metadata/resourceVersion").and_then(Value::as_str)
        && crd["metadata"]["resourceVersion"].as_str() != Some(expected)
    {
        return conflict("customresourcedefinitions.apiextensions.k8s.io", name);
    }
    if let Some(status) = body.get("status") {
        json_patch::merge(&mut crd["status"], status);
    }
    state.store_crd(crd, false);
    (200, state.crds[name].clone())
}

/// Server-side apply of a policy's status by its only status manager: the applied status
/// replaces the previous one (fields the manager no longer sets are removed).
fn apply_policy_status(state: &mut State, name: &str, body: Value) -> (u16, Value) {
    let rv = state.next_resource_version();
    let Some(policy) = state.policies.get_mut(name) else {
        return not_found("versionpolicies.crdlifecycle.io", name);
    };
    policy["status"] = body["status"].clone();
    policy["metadata"]["resourceVersion"] = rv.into();
    (200, policy.clone())
}

fn create_lease(state: &mut State, mut body: Value) -> (u16, Value) {
    let name = body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    if state.leases.contains_key(&name) {
        return (
            409,
            status_body(
                409,
                "AlreadyExists",
                &format!("leases.coordination.k8s.io \"{name}\" already exists"),
            ),
        );
    }
    body["metadata"]["resourceVersion"] = state.next_resource_version().into();
    state.leases.insert(name, body.clone());
    (201, body)
}

/// PUT with the resourceVersion read: 409 when someone wrote since (as 12 for objects).
fn replace_lease(state: &mut State, name: &str, mut body: Value) -> (u16, Value) {
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

fn not_found(resource: &str, name: &str) -> (u16, Value) {
    (
        404,
        status_body(404, "NotFound", &format!("{resource} \"{name}\" not found")),
    )
}

fn conflict(resource: &str, name: &str) -> (u16, Value) {
    let message = format!(
        "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; \
         please apply your changes to the latest version and try again"
    );
    (409, status_body(409, "Conflict", &message))
}

pub fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn respond(code: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap_or_default()))
        .unwrap_or_else(|_| Response::new(Body::from(Vec::new())))
}
