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
    /// The `Accept` header (metadata-only lists ask for `PartialObjectMetadataList`).
    pub accept: String,
    pub body: Value,
    /// When it arrived.
    pub at: std::time::Instant,
}

type Hook = Box<dyn FnOnce(&mut State) + Send>;

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
}

/// What the fake answers for the next list request of custom objects instead of a page.
#[derive(Clone, Debug)]
pub enum ListFault {
    /// An error status (5xx, 429), with `Retry-After` seconds if given.
    Status { code: u16, retry_after: Option<u64> },
    /// No answer at all (a hung connection).
    Stall,
}

#[derive(Default)]
pub struct State {
    pub crds: BTreeMap<String, Value>,
    /// Custom objects of every CRD, by (crd, namespace, name).
    pub objects: BTreeMap<(String, String, String), StoredObject>,
    pub faults: BTreeMap<String, ObjectFault>,
    /// What `GET /metrics` answers.
    pub metrics_text: String,
    /// Top-level status fields each (policy, field manager) applied last.
    status_owners: BTreeMap<(String, String), Vec<String>>,
    /// Bumped to make every continue token issued before expire (410, samples 16, 27).
    list_epoch: u64,
    /// An etcd compaction after every this many list pages: tokens issued before it expire.
    pub compact_every_pages: Option<u64>,
    /// An etcd compaction every this long.
    pub compact_every: Option<std::time::Duration>,
    /// List pages served so far, and when the first was.
    pages_served: u64,
    first_list_at: Option<std::time::Instant>,
    /// A 410 without a fresh continue token. No recorded apiserver answers so (samples 16
    /// and 27 both carry one); this only drives the migrator's fallback of listing again.
    pub expired_without_token: bool,
    /// Faults for the next list requests of custom objects.
    pub list_faults: VecDeque<ListFault>,
    /// Requests for a CRD's resources (discovery included) that still see the CRD as it
    /// was before a change of its versions, as an apiserver that has not yet acted on the
    /// update (each apiserver of an HA pair swaps on its own watch; samples 25, 26).
    pub switch_lag: u32,
    /// The CRD as the lagging apiserver still sees it, and for how many more requests.
    lagging: BTreeMap<String, (Value, u32)>,
    /// Run after the next list page is served (objects change while a run goes on).
    after_list_page: VecDeque<Hook>,
    /// Artificial latency of every custom-object request, to observe concurrency.
    pub latency: std::time::Duration,
    pub in_flight: usize,
    pub max_in_flight: usize,

    pub policies: BTreeMap<String, Value>,
    /// Requests for routes the fake does not serve (`METHOD path?query`): a test whose
    /// code sent one fails (see `assert_only_known_requests`).
    pub unknown_requests: Vec<String>,
    /// Set by tests that run code whose requests the fake knowingly does not serve.
    pub unknown_requests_allowed: bool,
    pub events: Vec<Value>,
    pub leases: BTreeMap<String, Value>,
    /// Lease requests get no answer (an apiserver or network that hangs).
    pub leases_stall: bool,
    pub secrets: BTreeMap<String, Value>,
    pub requests: Vec<Recorded>,
    resource_version: u64,
    /// Run just before the next CRD patch is applied: another writer racing us.
    before_crd_patch: VecDeque<Hook>,
    /// Canned failures for the next CRD patches: (status code, message).
    crd_patch_failures: VecDeque<(u16, String)>,
}

impl State {
    /// Every continue token issued so far expires (etcd compacted them away).
    pub fn expire_continue_tokens(&mut self) {
        self.list_epoch += 1;
    }

    /// Compactions so far: a token is valid only in the epoch it was issued in.
    fn token_epoch(&self) -> u64 {
        let by_pages = self
            .compact_every_pages
            .map_or(0, |k| self.pages_served / k.max(1));
        let by_time = match (self.compact_every, self.first_list_at) {
            (Some(every), Some(first)) => (first.elapsed().as_nanos() / every.as_nanos().max(1)) as u64,
            _ => 0,
        };
        self.list_epoch + by_pages + by_time
    }

    /// The CRD as the apiserver answering this request sees it (see `switch_lag`).
    fn effective_crd(&mut self, name: &str) -> Option<Value> {
        if let Some((previous, remaining)) = self.lagging.get_mut(name) {
            if *remaining > 0 {
                *remaining -= 1;
                return Some(previous.clone());
            }
            self.lagging.remove(name);
        }
        self.crds.get(name).cloned()
    }

    fn next_resource_version(&mut self) -> String {
        self.resource_version += 1;
        (10_000 + self.resource_version).to_string()
    }

    /// Stores a CRD as the apiserver would after a write: new resourceVersion, generation
    /// bumped when the spec changed.
    pub fn store_crd(&mut self, mut crd: Value, spec_changed: bool) {
        let rv = self.next_resource_version();
        let name = crd["metadata"]["name"].as_str().expect("CRD name").to_owned();
        if self.switch_lag > 0
            && let Some(previous) = self.crds.get(&name)
            && previous["spec"]["versions"] != crd["spec"]["versions"]
        {
            self.lagging
                .insert(name.clone(), (previous.clone(), self.switch_lag));
        }
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

    /// Fails the test if any request went to a route the fake does not serve.
    pub fn assert_only_known_requests(&self) {
        let state = self.lock();
        if !state.unknown_requests_allowed && !state.unknown_requests.is_empty() {
            panic!(
                "requests the fake apiserver does not serve: {:?}",
                state.unknown_requests
            );
        }
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

    /// `kubectl delete vp NAME`.
    pub fn delete_policy(&self, name: &str) {
        delete_policy(&mut self.lock(), name);
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

    /// Creates `count` objects of the CRD spread over `namespaces` namespaces, encoded as
    /// `encoded_as` (names `w00000`, ... so that they list in creation order).
    pub fn add_objects(&self, crd: &str, count: usize, namespaces: usize, encoded_as: &str) {
        let mut state = self.lock();
        for i in 0..count {
            let namespace = format!("ns{}", i % namespaces.max(1));
            let name = format!("w{i:05}");
            let resource_version = state.next_resource_version();
            let data = json!({"metadata": {"name": name, "namespace": namespace}, "spec": {"size": i}});
            state.objects.insert(
                (crd.to_owned(), namespace, name),
                StoredObject {
                    encoded_as: encoded_as.to_owned(),
                    resource_version,
                    data,
                    managed_fields: Vec::new(),
                },
            );
        }
    }

    /// How many objects of the CRD are encoded in each version.
    pub fn encodings(&self, crd: &str) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for ((c, _, _), object) in &self.lock().objects {
            if c == crd {
                *counts.entry(object.encoded_as.clone()).or_default() += 1;
            }
        }
        counts
    }

    /// Gives an object managedFields entries (as a server-side apply through an old version
    /// leaves them, sample 29).
    pub fn set_managed_fields(&self, crd: &str, namespace: &str, name: &str, entries: Vec<Value>) {
        let mut state = self.lock();
        let key = (crd.to_owned(), namespace.to_owned(), name.to_owned());
        if let Some(object) = state.objects.get_mut(&key) {
            object.managed_fields = entries;
        }
    }

    /// An object's managedFields.
    pub fn managed_fields(&self, crd: &str, namespace: &str, name: &str) -> Vec<Value> {
        let key = (crd.to_owned(), namespace.to_owned(), name.to_owned());
        self.lock()
            .objects
            .get(&key)
            .map(|o| o.managed_fields.clone())
            .unwrap_or_default()
    }

    pub fn set_fault(&self, namespace: &str, name: &str, fault: ObjectFault) {
        self.lock().faults.insert(format!("{namespace}/{name}"), fault);
    }

    pub fn after_next_list_page(&self, hook: impl FnOnce(&mut State) + Send + 'static) {
        self.lock().after_list_page.push_back(Box::new(hook));
    }

    /// The custom-object requests (lists, reads, rewrites) received; discovery is not one.
    pub fn object_requests(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| {
                r.path.starts_with("/apis/")
                    && !r.path.contains(".k8s.io/")
                    && !r.path.contains("crdlifecycle.io")
                    && !is_discovery(&r.path)
            })
            .collect()
    }

    /// The metadata-only list requests (the migrator's pages), oldest first.
    pub fn metadata_lists(&self) -> Vec<Recorded> {
        self.object_requests()
            .into_iter()
            .filter(|r| r.method == "GET" && r.accept.contains("as=PartialObjectMetadataList"))
            .collect()
    }

    /// The discovery requests (`GET /apis/<group>/<version>`) for custom resources.
    pub fn discovery_requests(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| is_discovery(&r.path) && !r.path.contains(".k8s.io/"))
            .collect()
    }

    pub fn fail_next_crd_patch(&self, code: u16, message: &str) {
        self.lock()
            .crd_patch_failures
            .push_back((code, message.to_owned()));
    }

    pub async fn handle(&self, request: Request<Body>) -> Response<Body> {
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
            accept: parts
                .headers
                .get(http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            body: body.clone(),
            at: std::time::Instant::now(),
        };
        let segments: Vec<&str> = recorded.path.trim_start_matches('/').split('/').collect();
        if recorded.method == "GET"
            && let ["apis", group, version] = segments.as_slice()
            && !group.ends_with(".k8s.io")
        {
            let mut state = self.lock();
            state.requests.push(recorded.clone());
            return discovery(&mut state, group, version);
        }
        if recorded.path.starts_with("/apis/coordination.k8s.io/") && self.lock().leases_stall {
            self.lock().requests.push(recorded.clone());
            std::future::pending::<()>().await;
        }
        let custom = custom_resource(&mut self.lock(), &segments);
        if let Some(resource) = custom {
            if self.stalls(&resource) {
                self.lock().requests.push(recorded.clone());
                // A hung connection: the client's timeout must give up on it.
                std::future::pending::<()>().await;
            }
            let latency = {
                let mut state = self.lock();
                state.requests.push(recorded.clone());
                state.in_flight += 1;
                state.max_in_flight = state.max_in_flight.max(state.in_flight);
                state.latency
            };
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            let mut state = self.lock();
            state.in_flight -= 1;
            return serve_custom(&mut state, &recorded, &resource);
        }
        let mut state = self.lock();
        state.requests.push(recorded.clone());
        if recorded.method == "GET" && recorded.path == "/metrics" {
            return Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")
                .body(Body::from(state.metrics_text.clone().into_bytes()))
                .unwrap_or_else(|_| Response::new(Body::from(Vec::new())));
        }
        let (code, reply) = route(&mut state, &recorded, &segments, body);
        respond(code, &reply)
    }
}

impl FakeApiserver {
    /// Whether this request hangs (a `Stall` fault for its object, or for the next list).
    fn stalls(&self, resource: &CustomRequest) -> bool {
        let mut state = self.lock();
        match &resource.name {
            None => {
                if matches!(state.list_faults.front(), Some(ListFault::Stall)) {
                    state.list_faults.pop_front();
                    return true;
                }
                false
            }
            Some(name) => {
                let key = format!("{}/{name}", resource.namespace.clone().unwrap_or_default());
                match state.faults.get_mut(&key) {
                    Some(ObjectFault::Stall { times }) if *times > 0 => {
                        *times -= 1;
                        true
                    }
                    _ => false,
                }
            }
        }
    }
}

/// `/apis/<group>/<version>`: a discovery document, not a custom-object path.
fn is_discovery(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    matches!(segments.as_slice(), ["apis", _, _])
}

/// Discovery of a custom group version (samples 25, 26): every CRD of the group that serves
/// the version, as the answering apiserver sees it, with its `storageVersionHash` (derived
/// from the storage version; the derivation reproduces both samples, see
/// `discovery_hashes_are_the_recorded_ones`). A group version nobody serves answers the
/// plain-text 404 of an unserved path (as sample 15).
fn discovery(state: &mut State, group: &str, version: &str) -> Response<Body> {
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

/// An error status with `Retry-After` seconds if given (transient faults).
fn try_again_later(code: u16, retry_after: Option<u64>) -> Response<Body> {
    let mut response = respond(
        code,
        &status_body(code, "TooManyRequests", "please try again later"),
    );
    if let Some(seconds) = retry_after {
        response.headers_mut().insert(
            http::header::RETRY_AFTER,
            seconds.to_string().parse().expect("header"),
        );
    }
    response
}

fn plain_not_found() -> Response<Body> {
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(b"404 page not found\n".to_vec()))
        .unwrap_or_else(|_| Response::new(Body::from(Vec::new())))
}

fn route(state: &mut State, request: &Recorded, segments: &[&str], body: Value) -> (u16, Value) {
    match (request.method.as_str(), segments) {
        ("GET", ["version"]) => (200, json!({"major": "1", "minor": "21", "gitVersion": "v1.21.0"})),
        ("GET", ["apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions"]) => (
            200,
            json!({"kind": "CustomResourceDefinitionList", "apiVersion": "apiextensions.k8s.io/v1",
                   "metadata": {"resourceVersion": state.resource_version.to_string()},
                   "items": state.crds.values().cloned().collect::<Vec<_>>()}),
        ),
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
        ) => {
            let manager = request
                .query
                .split('&')
                .find_map(|pair| pair.strip_prefix("fieldManager="))
                .unwrap_or_default()
                .to_owned();
            apply_policy_status(state, name, &manager, body)
        }
        ("PATCH", ["apis", "crdlifecycle.io", "v1alpha1", "versionpolicies", name]) => {
            patch_policy(state, name, body)
        }
        ("DELETE", ["apis", "crdlifecycle.io", "v1alpha1", "versionpolicies", name]) => {
            delete_policy(state, name)
        }
        ("GET", ["apis", "crdlifecycle.io", "v1alpha1", "versionpolicies", name]) => {
            match state.policies.get(*name) {
                Some(policy) => (200, policy.clone()),
                None => not_found("versionpolicies.crdlifecycle.io", name),
            }
        }
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
        ("GET", ["api", "v1", "namespaces", _, "secrets", name]) => match state.secrets.get(*name) {
            Some(secret) => (200, secret.clone()),
            None => not_found("secrets", name),
        },
        ("POST", ["api", "v1", "namespaces", _, "secrets"]) => {
            let name = body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            if state.secrets.contains_key(&name) {
                return (
                    409,
                    status_body(
                        409,
                        "AlreadyExists",
                        &format!("secrets \"{name}\" already exists"),
                    ),
                );
            }
            let mut body = body;
            body["metadata"]["resourceVersion"] = state.next_resource_version().into();
            state.secrets.insert(name, body.clone());
            (201, body)
        }
        // PUT with the resourceVersion read: 409 when someone wrote since.
        ("PUT", ["api", "v1", "namespaces", _, "secrets", name]) => {
            let Some(current) = state.secrets.get(*name) else {
                return not_found("secrets", name);
            };
            if body["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"] {
                return conflict("secrets", name);
            }
            let mut body = body;
            body["metadata"]["resourceVersion"] = state.next_resource_version().into();
            state.secrets.insert((*name).to_owned(), body.clone());
            (200, body)
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
        // Not 404: that would read as "does not exist" and let a wrong path pass a test.
        _ => {
            state
                .unknown_requests
                .push(format!("{} {}?{}", request.method, request.path, request.query));
            (
                501,
                status_body(
                    501,
                    "NotImplemented",
                    &format!(
                        "the fake apiserver does not serve {} {}",
                        request.method, request.path
                    ),
                ),
            )
        }
    }
}

/// JSON Patch on a CRD, with the apiserver's checks:
/// - a failing `test` op answers 422 with a generic message (apiserver-samples/03);
/// - exactly one storage version (05), every stored version still in spec.versions (04);
/// - every deprecationWarning as `deprecation_warning_problem` (22-24);
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
    for (i, version) in versions.iter().enumerate() {
        if let Some(warning) = version["deprecationWarning"].as_str()
            && let Some(problem) = deprecation_warning_problem(warning)
        {
            let message = format!(
                "CustomResourceDefinition.apiextensions.k8s.io \"{name}\" is invalid: \
                 spec.versions[{i}].deprecationWarning: Invalid value: {}: {problem}",
                Value::String(warning.to_owned())
            );
            return (422, status_body(422, "Invalid", &message));
        }
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

/// The apiserver's deprecationWarning checks, with its messages: not empty (sample 23), at
/// most 256 bytes although the message says characters (22), printable only, naming the
/// byte index (24). Printable is Go's `unicode.IsPrint`: categories L, M, N, P, S and the
/// ASCII space.
fn deprecation_warning_problem(warning: &str) -> Option<String> {
    if warning.is_empty() {
        return Some("must not be an empty string".to_owned());
    }
    if warning.len() > 256 {
        return Some("must be <= 256 characters long".to_owned());
    }
    let not_printable = regex::Regex::new(r"[^\p{L}\p{M}\p{N}\p{P}\p{S} ]").expect("pattern");
    not_printable.find(warning).map(|found| {
        format!(
            "must only contain printable UTF-8 characters; non-printable character found at index {}",
            found.start()
        )
    })
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

/// Server-side apply of a policy's status, tracking ownership per field manager at the
/// granularity of the status' top-level fields: a manager's apply sets the fields it sends
/// and removes the ones it owned before and no longer sends; other managers' fields stay.
fn apply_policy_status(state: &mut State, name: &str, manager: &str, body: Value) -> (u16, Value) {
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
fn patch_policy(state: &mut State, name: &str, body: Value) -> (u16, Value) {
    let rv = state.next_resource_version();
    let Some(mut policy) = state.policies.get(name).cloned() else {
        return not_found("versionpolicies.crdlifecycle.io", name);
    };
    let Ok(patch) = serde_json::from_value::<json_patch::Patch>(body) else {
        return (400, status_body(400, "BadRequest", "invalid JSON Patch"));
    };
    if json_patch::patch(&mut policy, &patch).is_err() {
        return (
            422,
            status_body(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request",
            ),
        );
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
fn delete_policy(state: &mut State, name: &str) -> (u16, Value) {
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

/// A request for custom objects: which CRD, through which version, which object.
struct CustomRequest {
    crd: String,
    version: String,
    served: bool,
    storage: String,
    kind: String,
    group: String,
    plural: String,
    namespace: Option<String>,
    name: Option<String>,
    /// `status` for requests to the `/status` subresource.
    subresource: Option<String>,
}

fn custom_resource(state: &mut State, segments: &[&str]) -> Option<CustomRequest> {
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
fn serve_custom(state: &mut State, request: &Recorded, target: &CustomRequest) -> Response<Body> {
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
            let applied = serde_json::from_value::<json_patch::Patch>(request.body.clone())
                .ok()
                .is_some_and(|patch| json_patch::patch(&mut view, &patch).is_ok());
            if !applied {
                return respond(
                    422,
                    &status_body(
                        422,
                        "Invalid",
                        "the server rejected our request due to an error in our request",
                    ),
                );
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

fn object_json(object: &StoredObject, target: &CustomRequest, namespace: &str, name: &str) -> Value {
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
fn server_side_apply(
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
    let manager = request
        .query
        .split('&')
        .find_map(|pair| pair.strip_prefix("fieldManager="))
        .unwrap_or_default()
        .to_owned();
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
fn list_custom(state: &mut State, request: &Recorded, target: &CustomRequest) -> Response<Body> {
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
        state.first_list_at.get_or_insert_with(std::time::Instant::now);
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

fn percent_decode(text: &str) -> String {
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

/// A fake that fails the test when it goes out of scope if any request went to a route it
/// does not serve (the test's own handle: clones held by clients do not check).
pub struct CheckedFake(pub FakeApiserver);

impl std::ops::Deref for CheckedFake {
    type Target = FakeApiserver;

    fn deref(&self) -> &FakeApiserver {
        &self.0
    }
}

impl Drop for CheckedFake {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.0.assert_only_known_requests();
        }
    }
}
