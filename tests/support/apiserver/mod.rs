//! A small stateful in-memory apiserver behind kube's `Client`, for flows that span many
//! calls. It implements only what crd-lifecycle uses, and each apiserver rule it encodes
//! cites the recorded response in `../shared/apiserver-samples/` it was checked against.

#![allow(dead_code)]

mod access;
mod crds;
mod leases;
mod migrations;
mod objects;
mod policies;
mod watch;

pub use access::Denied;
use access::review_access;
use crds::{dry_run_update_crd, patch_crd, patch_crd_status};
use leases::{create_lease, replace_lease};
use objects::{CustomRequest, custom_resource, discovery, is_discovery, serve_custom};
pub use objects::{ListFault, ObjectFault, StoredObject};
use policies::{apply_policy_status, delete_policy, patch_policy};
pub use watch::{Change, FakeBody, Watched};
use watch::{http_date, is_crd_watch, watch_crd};

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
    pub at: tokio::time::Instant,
    /// Who sent it (`client_as`; "controller" for the plain client).
    pub actor: &'static str,
}

impl Recorded {
    /// A query parameter's value ("" when absent), e.g. `fieldManager`.
    pub fn query_param(&self, name: &str) -> String {
        self.query
            .split('&')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_default()
            .to_owned()
    }
}

type Hook = Box<dyn FnOnce(&mut State) + Send>;

/// Whether a request (actor, method, path) is the one a `Trigger` waits for.
type Matcher = Box<dyn Fn(&State, &str, &str, &str) -> bool + Send>;

/// A hook run once, just before the `skip + 1`-th request `when` matches (actor, method,
/// path) is answered: a fault triggered by the client's own progress (Sieve's
/// intermediate states), not by the clock.
pub struct Trigger {
    when: Matcher,
    skip: u32,
    hook: Hook,
}

/// The simulation's invariants, called after every step; `true` halts the fake.
pub type Checker = Box<dyn FnMut(&State) -> bool + Send>;

#[derive(Default)]
pub struct State {
    pub crds: BTreeMap<String, Value>,
    /// The (group, plural) of every CRD deleted (`finish_crd_deletion`): their objects' paths
    /// answer the plain-text 404 of an unserved path.
    pub gone_resources: std::collections::BTreeSet<(String, String)>,
    /// Custom objects of every CRD, by (crd, namespace, name).
    pub objects: BTreeMap<(String, String, String), StoredObject>,
    pub faults: BTreeMap<String, ObjectFault>,
    /// What `GET /metrics` answers.
    pub metrics_text: String,
    /// The status fields, and entries of list maps (`field\0[key]`), each (policy, field
    /// manager) applied last.
    status_owners: BTreeMap<(String, String), Vec<String>>,
    /// Bumped to make every continue token issued before expire (410, samples 16, 27).
    list_epoch: u64,
    /// An etcd compaction after every this many list pages: tokens issued before it expire.
    pub compact_every_pages: Option<u64>,
    /// An etcd compaction every this long.
    pub compact_every: Option<std::time::Duration>,
    /// List pages served so far, and when the first was.
    pages_served: u64,
    first_list_at: Option<tokio::time::Instant>,
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
    /// Run before the requests they match (`FakeApiserver::before_request`).
    triggers: Vec<Trigger>,
    /// Artificial latency of every custom-object request, to observe concurrency.
    pub latency: std::time::Duration,
    /// Artificial latency of every VersionPolicy status write (a loaded apiserver), to
    /// observe the controller's timing.
    pub status_latency: std::time::Duration,
    /// How long after a change the policy and metadata-only CRD watches deliver it (a
    /// loaded apiserver), to observe the controller's timing.
    pub watch_delay: std::time::Duration,
    pub in_flight: usize,
    pub max_in_flight: usize,

    pub policies: BTreeMap<String, Value>,
    /// Requests for routes the fake does not serve (`METHOD path?query`): a test whose
    /// code sent one fails (see `assert_only_known_requests`).
    pub unknown_requests: Vec<String>,
    /// Set by tests that run code whose requests the fake knowingly does not serve.
    pub unknown_requests_allowed: bool,
    pub events: Vec<Value>,
    /// Permissions SelfSubjectAccessReviews answer "not allowed" for.
    pub denied: Vec<Denied>,
    /// Every SelfSubjectAccessReview asked, in order.
    pub access_reviews: Vec<Denied>,
    pub leases: BTreeMap<String, Value>,
    /// Lease requests get no answer (an apiserver or network that hangs).
    pub leases_stall: bool,
    /// Lease requests of this actor alone get no answer (a leader cut off from the lease).
    pub leases_stall_for: Option<String>,
    /// Per lease holder, when the fake last stored a lease it holds (created or renewed)
    /// and for how long (`leaseDurationSeconds`): what the others wait out before taking
    /// over (client-go's rule), so the fencing a simulation checks.
    pub lease_held: BTreeMap<String, (tokio::time::Instant, std::time::Duration)>,
    /// The write being answered (method, path), for the checker; `None` during a read or
    /// another writer's change.
    pub current_write: Option<(String, String)>,
    /// Whether the controllers elect a leader (a simulation of several replicas): the
    /// checker then holds each of their writes against `lease_held`.
    pub fenced: bool,
    /// Lease requests are applied at once but answered this much later (a slow network on
    /// the way back: the write has happened when the client learns of it).
    pub lease_answer_delay: std::time::Duration,
    pub secrets: BTreeMap<String, Value>,
    /// How many of the next requests to Secrets, by method (`GET`, `PUT`), are refused as
    /// RBAC refuses a user without the grant (see `forbidden_secret`).
    pub secrets_forbidden: BTreeMap<String, usize>,
    pub requests: Vec<Recorded>,
    resource_version: u64,
    /// Every change of a VersionPolicy or CRD, oldest first, for watches (`watch`).
    pub changes: Vec<Change>,
    /// Wakes the open watches after a change (`Notify` wakes its waiters in a fixed order,
    /// a `watch` channel's receivers in a random one: a simulation must replay exactly).
    changed: std::sync::Arc<tokio::sync::Notify>,
    /// Run just before the next CRD patch is applied: another writer racing us.
    before_crd_patch: VecDeque<Hook>,
    /// Run just before the next patch of a CRD's status is applied.
    before_crd_status_patch: VecDeque<Hook>,
    /// Canned failures for the next CRD patches: (status code, message).
    crd_patch_failures: VecDeque<(u16, String)>,
    /// VersionPolicies are not served (their CRD is not installed): their paths answer the
    /// plain-text 404 of a path nobody serves (as sample 15).
    pub policies_unserved: bool,
    /// Whether `storagemigration.k8s.io/v1beta1` is served (1.35+ with the feature on).
    pub svm_served: bool,
    /// StorageVersionMigrations by name.
    pub svms: BTreeMap<String, Value>,
    /// The built-in migrator makes no progress (its controller is not running).
    pub svm_paused: bool,
    /// The next migrations fail with this message.
    pub svm_fail: Option<String>,
    /// The CRD generation each migration started running at (`finishCRDMigration` trims
    /// only if it did not move).
    pub svm_generations: BTreeMap<String, Value>,
    /// The migrations of these names fail with these messages (another's migration that
    /// fails while ours do not).
    pub svm_fail_by_name: BTreeMap<String, String>,
    /// The built-in migrator succeeds without trimming `storedVersions` (so that the
    /// operator's own trim shows).
    pub svm_leaves_stored_versions: bool,
    /// Lists of StorageVersionMigrations answer this status (a transient server error, as
    /// `ObjectFault::Transient` answers for objects).
    pub svm_list_fault: Option<u16>,
    /// The apiserver's clock minus this machine's (a skewed node: negative when this machine
    /// is ahead). Dates every response and every time the fake records.
    pub clock_offset: jiff::SignedDuration,
    /// This machine's clock and tokio's when the fake's clock was first read.
    clock_base: Option<(jiff::Timestamp, tokio::time::Instant)>,
    /// How many times the apiserver restarted (`expire_watch_history`): the whole-CRD
    /// watches open before end.
    watch_restarts: u64,
    /// Watches from a resourceVersion before this one answer 410 Expired.
    watch_history_from: u64,
    /// Who made the change being processed, for the checker (`step`): the client's actor
    /// (`controller` unless named, `client_as`), or a test acting as another writer (a
    /// GitOps tool, Kubernetes' own migrator) while it changes the state.
    pub actor: String,
    /// Who sent the request being answered (`client_as`; `controller` unless named).
    pub sender: String,
    /// Called after every step (a request answered, or another writer's change), with the
    /// state as that step left it: the simulation's invariants. It answers `true` to halt:
    /// from then on no request gets an answer (a client looping without waiting is stopped,
    /// and time goes on).
    pub checker: Option<Checker>,
    /// Set when the checker halted the fake.
    pub halted: bool,
    /// Steps taken so far.
    pub steps: u64,
    /// How much later than its effect the answer to a write (any method but GET) reaches
    /// the client: a slow network on the way back, so that a client stopped meanwhile has
    /// written without learning it.
    pub write_answer_delay: std::time::Duration,
    /// How much later than its effect the answer to the request being handled reaches the
    /// client, set by a trigger's hook for that one request (a slow answer on the way back,
    /// during which other actors move on).
    pub this_answer_delay: std::time::Duration,
    /// Watch starts still to refuse with API Priority and Fairness' 429
    /// (`refused_watch_start`): an apiserver shedding load, as in a burst of reconciles.
    pub refuse_watch_starts: u32,
    /// How long every request (but a watch) waits before the fake acts on it (a loaded
    /// apiserver or a slow network on the way there: other writers act meanwhile).
    pub request_latency: std::time::Duration,
    /// CRD patches refused because `status.storedVersions` would name a version the patch
    /// drops (sample 04), with who sent each: one of the controller's is a write it should
    /// never have sent.
    pub refused_stored_version_drops: Vec<(String, String)>,
    /// CRD patches refused by the apiserver's validation of the CRD (its `caBundle`, its
    /// storage versions, its deprecation warnings: a 422 that no race explains), with who
    /// sent each.
    pub refused_crd_validations: Vec<(String, String)>,
    /// The Kubernetes version the fake answers `/version` with and words its refusals as
    /// (`None`: 1.21, the version of apiserver-samples/00).
    pub server_version: Option<(u32, u32)>,
    /// Updates of CRDs are refused (403) as RBAC refuses a caller without `update` on them
    /// (see `crds::dry_run_update_crd`).
    pub crd_updates_forbidden: bool,
}

impl State {
    /// Runs the triggers a request (actor, method, path) fires, in the order they were set.
    fn fire_triggers(&mut self, actor: &str, method: &str, path: &str) {
        let mut i = 0;
        while i < self.triggers.len() {
            if !(self.triggers[i].when)(self, actor, method, path) {
                i += 1;
            } else if self.triggers[i].skip > 0 {
                self.triggers[i].skip -= 1;
                i += 1;
            } else {
                let trigger = self.triggers.remove(i);
                (trigger.hook)(self);
            }
        }
    }

    /// One step taken by `actor`: the invariants (`checker`) see the state it left.
    pub fn step(&mut self, actor: &str) {
        self.steps += 1;
        let previous = std::mem::replace(&mut self.actor, actor.to_owned());
        if let Some(mut check) = self.checker.take() {
            if check(self) {
                self.halted = true;
            }
            self.checker = Some(check);
        }
        self.actor = previous;
    }

    /// Sets the apiserver's clock to `wall` at tokio's instant now (a simulation starts every
    /// run at the same instant, so that a seed replays exactly).
    pub fn set_clock(&mut self, wall: jiff::Timestamp) {
        self.clock_base = Some((wall, tokio::time::Instant::now()));
    }

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

    /// The Kubernetes version the fake plays (`server_version`, else 1.21).
    pub fn version(&self) -> (u32, u32) {
        self.server_version.unwrap_or((1, 21))
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
        let created = !self.crds.contains_key(&name);
        let now = self.now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        if self.switch_lag > 0
            && let Some(previous) = self.crds.get(&name)
            && previous["spec"]["versions"] != crd["spec"]["versions"]
        {
            self.lagging
                .insert(name.clone(), (previous.clone(), self.switch_lag));
        }
        let meta = crd["metadata"].as_object_mut().expect("metadata");
        meta.insert("resourceVersion".into(), rv.into());
        // A change of the spec gives its writer's managedFields entry the time of the change
        // (sample 02: the patching manager's `time` moves to the patch's second). Only where
        // the test gave the CRD entries: the others carry none, as a CRD whose entries were
        // cleared.
        if spec_changed && let Some(entries) = meta.get_mut("managedFields").and_then(Value::as_array_mut) {
            entries.retain(|e| e["manager"] != "writer");
            entries.push(json!({
                "manager": "writer", "operation": "Update", "apiVersion": "apiextensions.k8s.io/v1",
                "time": now, "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}},
            }));
        }
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
        self.record(Watched::Crds, if created { "ADDED" } else { "MODIFIED" }, &crd);
        self.crds.insert(name, crd);
    }
}

/// The fake; clone it freely, every clone shares the state.
#[derive(Clone, Default)]
pub struct FakeApiserver {
    pub state: Arc<Mutex<State>>,
    /// Who sends the requests of this handle's clients (`step`): `controller` unless named.
    actor: Option<&'static str>,
}

impl FakeApiserver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates a StorageVersionMigration as another client would (`kubectl create`).
    pub fn create_svm(&self, body: Value) -> (u16, Value) {
        migrations::create(&mut self.lock(), body)
    }

    /// A kube client talking to this fake (watches included).
    pub fn client(&self) -> Client {
        let fake = self.clone();
        let service = tower::service_fn(move |request: Request<Body>| {
            let fake = fake.clone();
            async move {
                if let Some(refused) = fake.refuse_watch_start(&request) {
                    return Ok::<_, Infallible>(refused.map(http_body_util::Either::Left));
                }
                if let Some(watch) = fake.watch(&request) {
                    return Ok::<_, Infallible>(watch.map(http_body_util::Either::Right));
                }
                Ok(fake.handle(request).await.map(http_body_util::Either::Left))
            }
        });
        Client::new(service, "default")
    }

    /// A watch start refused by API Priority and Fairness while `refuse_watch_starts` lasts,
    /// as kube-apiserver v1.36.2 refuses one
    /// (tests/fixtures/apiserver/watch-start-refused-429-v1.36.txt): 429 at once, `Retry-After:
    /// 1`, a plain-text body (not a Status), the priority level's headers.
    fn refuse_watch_start(&self, request: &Request<Body>) -> Option<Response<FakeBody>> {
        use http_body_util::BodyExt as _;
        let query = request.uri().query().unwrap_or_default();
        if request.method() != http::Method::GET
            || !query.split('&').any(|p| p == "watch=true" || p == "watch=1")
        {
            return None;
        }
        let mut state = self.lock();
        if state.refuse_watch_starts == 0 {
            return None;
        }
        state.refuse_watch_starts -= 1;
        state.requests.push(Recorded {
            method: "GET".into(),
            path: request.uri().path().to_owned(),
            query: query.to_owned(),
            content_type: String::new(),
            accept: String::new(),
            body: Value::Null,
            at: tokio::time::Instant::now(),
            actor: self.actor.unwrap_or("controller"),
        });
        let date = http_date(state.now());
        drop(state);
        Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .header(http::header::RETRY_AFTER, "1")
            .header(
                "x-kubernetes-pf-flowschema-uid",
                "1aa285a1-f3e7-44ae-81b3-1ebae2fe17b2",
            )
            .header(
                "x-kubernetes-pf-prioritylevel-uid",
                "94bafbf1-ee7f-442f-b663-23f1d98cc07f",
            )
            .header(http::header::DATE, date)
            .body(
                Body::from(b"Too many requests, please try again later.\n".to_vec())
                    .map_err(Into::into)
                    .boxed_unsync(),
            )
            .ok()
    }

    /// A kube client whose requests are `actor`'s steps, not the controller's (another
    /// writer: a user's client, a GitOps tool).
    pub fn client_as(&self, actor: &'static str) -> Client {
        Self {
            state: self.state.clone(),
            actor: Some(actor),
        }
        .client()
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

    /// Creates a policy; like the apiserver, its generation starts at 1 unless given.
    pub fn create_policy(&self, policy: Value) {
        let mut state = self.lock();
        let rv = state.next_resource_version();
        let name = policy["metadata"]["name"].as_str().expect("name").to_owned();
        let mut policy = policy;
        policy["metadata"]["resourceVersion"] = rv.into();
        if policy["metadata"].get("generation").is_none() {
            policy["metadata"]["generation"] = json!(1);
        }
        state.record(Watched::Policies, "ADDED", &policy);
        state.policies.insert(name, policy);
    }

    /// Another writer changes the policy (`kubectl edit`, an approval annotation): a spec
    /// change adds 1 to its generation (tests/fixtures/watch/versionpolicies.txt).
    pub fn edit_policy(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        let mut state = self.lock();
        let mut policy = state.policies.get(name).cloned().expect("policy exists");
        let before = policy["spec"].clone();
        edit(&mut policy);
        if policy["spec"] != before {
            let generation = policy["metadata"]["generation"].as_i64().unwrap_or(1);
            policy["metadata"]["generation"] = json!(generation + 1);
        }
        policy["metadata"]["resourceVersion"] = state.next_resource_version().into();
        state.record(Watched::Policies, "MODIFIED", &policy);
        state.policies.insert(name.to_owned(), policy);
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

    /// The writes (anything but GET, and but a dry run) to CRDs.
    pub fn crd_writes(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| {
                r.method != "GET"
                    && r.path.starts_with("/apis/apiextensions.k8s.io/")
                    && r.query_param("dryRun") != "All"
            })
            .collect()
    }

    /// The dry runs (`dryRun=All`) of CRD writes.
    pub fn crd_dry_runs(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| r.path.starts_with("/apis/apiextensions.k8s.io/") && r.query_param("dryRun") == "All")
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

    /// Runs `hook` just before the next patch of a CRD's status (the trim) is applied.
    pub fn before_next_crd_status_patch(&self, hook: impl FnOnce(&mut State) + Send + 'static) {
        self.lock().before_crd_status_patch.push_back(Box::new(hook));
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

    /// (namespace, name) of every object of the CRD, in order.
    pub fn object_keys(&self, crd: &str) -> Vec<(String, String)> {
        self.lock()
            .objects
            .keys()
            .filter(|(c, _, _)| c == crd)
            .map(|(_, ns, name)| (ns.clone(), name.clone()))
            .collect()
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

    /// SelfSubjectAccessReviews for `verb` on `resource[/subresource]` of `group` answer
    /// "not allowed" (`subresource` "" for the resource itself).
    pub fn deny(&self, verb: &str, group: &str, resource: &str, subresource: &str) {
        self.lock()
            .denied
            .push((verb.into(), group.into(), resource.into(), subresource.into()));
    }

    /// Allows everything again.
    pub fn allow_all(&self) {
        self.lock().denied.clear();
    }

    pub fn set_fault(&self, namespace: &str, name: &str, fault: ObjectFault) {
        self.lock().faults.insert(format!("{namespace}/{name}"), fault);
    }

    pub fn after_next_list_page(&self, hook: impl FnOnce(&mut State) + Send + 'static) {
        self.lock().after_list_page.push_back(Box::new(hook));
    }

    /// Runs `hook` just before the `skip + 1`-th request from now that `when` (the state as
    /// the request arrives, actor, method, path) matches is answered.
    pub fn before_request(
        &self,
        when: impl Fn(&State, &str, &str, &str) -> bool + Send + 'static,
        skip: u32,
        hook: impl FnOnce(&mut State) + Send + 'static,
    ) {
        self.lock().triggers.push(Trigger {
            when: Box::new(when),
            skip,
            hook: Box::new(hook),
        });
    }

    /// Forgets every hook not run yet (a simulation's faults stop).
    pub fn clear_hooks(&self) {
        let mut state = self.lock();
        state.triggers.clear();
        state.after_list_page.clear();
        state.before_crd_patch.clear();
        state.before_crd_status_patch.clear();
    }

    /// The custom-object requests (lists, reads, rewrites) received; discovery is not one.
    pub fn object_requests(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(|r| {
                r.path.starts_with("/apis/")
                    && !r.path.contains(".k8s.io/")
                    && !r.path.ends_with(".k8s.io")
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

    /// Answers one request: a watch of a CRD streams (see `watch`), anything else is
    /// answered at once; every answer is dated by the fake's clock.
    pub async fn handle(&self, request: Request<Body>) -> Response<FakeBody> {
        use http_body_util::BodyExt as _;
        let watch = Recorded {
            method: request.method().to_string(),
            path: request.uri().path().to_owned(),
            query: request.uri().query().unwrap_or_default().to_owned(),
            content_type: String::new(),
            accept: String::new(),
            body: Value::Null,
            at: tokio::time::Instant::now(),
            actor: self.actor.unwrap_or("controller"),
        };
        if is_crd_watch(&watch) {
            self.lock().requests.push(watch.clone());
            return watch_crd(self, &watch);
        }
        let write = watch.method != "GET";
        if self.lock().halted {
            std::future::pending::<()>().await;
        }
        let latency = self.lock().request_latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let triggered_delay = {
            let mut state = self.lock();
            state.fire_triggers(self.actor.unwrap_or("controller"), &watch.method, &watch.path);
            std::mem::take(&mut state.this_answer_delay)
        };
        let mut response = self.answer(request).await;
        let delay = {
            let mut state = self.lock();
            state.current_write = write.then(|| (watch.method.clone(), watch.path.clone()));
            state.step(self.actor.unwrap_or("controller"));
            state.current_write = None;
            triggered_delay
                + if write {
                    state.write_answer_delay
                } else {
                    std::time::Duration::ZERO
                }
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let date = http_date(self.lock().now());
        if let Ok(value) = date.parse() {
            response.headers_mut().insert(http::header::DATE, value);
        }
        response.map(|body| body.map_err(Into::into).boxed_unsync())
    }

    async fn answer(&self, request: Request<Body>) -> Response<Body> {
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
            at: tokio::time::Instant::now(),
            actor: self.actor.unwrap_or("controller"),
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
        if recorded.path.starts_with("/apis/coordination.k8s.io/") {
            let stalled = {
                let state = self.lock();
                state.leases_stall
                    || (self.actor.is_some() && state.leases_stall_for.as_deref() == self.actor)
            };
            if stalled {
                self.lock().requests.push(recorded.clone());
                std::future::pending::<()>().await;
            }
            let delay = self.lock().lease_answer_delay;
            if !delay.is_zero() {
                let response = {
                    let mut state = self.lock();
                    state.requests.push(recorded.clone());
                    let (code, reply) = route(&mut state, &recorded, &segments, body);
                    respond(code, &reply)
                };
                tokio::time::sleep(delay).await;
                return response;
            }
        }
        let custom = custom_resource(&mut self.lock(), &segments);
        // A deleted CRD's paths, all of them (cluster-wide and namespaced LIST, GET, PATCH,
        // /status, DELETE, POST): `404 page not found` in plain text, at once and 3 s later
        // (tests/fixtures/apiserver/crd-gone-paths-v1.36.txt, crd-deletion-v1.36.txt).
        if custom.is_none()
            && let ["apis", group, _, rest @ ..] = segments.as_slice()
            && let Some(plural) = match rest {
                [plural, ..] if *plural != "namespaces" => Some(*plural),
                ["namespaces", _, plural, ..] => Some(*plural),
                _ => None,
            }
        {
            let mut state = self.lock();
            if state
                .gone_resources
                .contains(&((*group).to_owned(), plural.to_owned()))
            {
                state.requests.push(recorded.clone());
                return plain_not_found();
            }
        }
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
        let status_latency = self.lock().status_latency;
        if !status_latency.is_zero()
            && recorded.method == "PATCH"
            && recorded.path.starts_with("/apis/crdlifecycle.io/")
            && recorded.path.ends_with("/status")
        {
            tokio::time::sleep(status_latency).await;
        }
        let mut state = self.lock();
        state.requests.push(recorded.clone());
        // Set under the same lock as the answer: another request may be answered at any await.
        state.sender = self.actor.unwrap_or("controller").to_owned();
        if recorded.method == "GET" && recorded.path == "/metrics" {
            return Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")
                .body(Body::from(state.metrics_text.clone().into_bytes()))
                .unwrap_or_else(|_| Response::new(Body::from(Vec::new())));
        }
        if recorded.method == "GET" && segments == ["apis", migrations::GROUP] && !state.svm_served {
            return plain_not_found();
        }
        if state.policies_unserved && recorded.path.starts_with("/apis/crdlifecycle.io/") {
            return plain_not_found();
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

/// An error status with `Retry-After` seconds if given (transient faults).
pub(super) fn try_again_later(code: u16, retry_after: Option<u64>) -> Response<Body> {
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

pub(super) fn plain_not_found() -> Response<Body> {
    Response::builder()
        .status(StatusCode::NOT_FOUND)
        .header(http::header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::from(b"404 page not found\n".to_vec()))
        .unwrap_or_else(|_| Response::new(Body::from(Vec::new())))
}

fn route(state: &mut State, request: &Recorded, segments: &[&str], body: Value) -> (u16, Value) {
    match (request.method.as_str(), segments) {
        // The shape of apiserver-samples/00 (v1.21), at the fake's version.
        ("GET", ["version"]) => {
            let (major, minor) = state.version();
            (
                200,
                json!({"major": major.to_string(), "minor": minor.to_string(), "gitVersion": format!("v{major}.{minor}.0")}),
            )
        }
        // The list's resourceVersion is the store's (the latest write's, the one a watch
        // starts from); `fieldSelector=metadata.name=` keeps one
        // (tests/fixtures/apiserver/crd-list-by-name-after-compaction.txt); a metadata-only
        // list answers PartialObjectMetadataList (sample 09, tests/fixtures/watch/crds-metadata.txt).
        ("GET", ["apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions"]) => {
            let selector = request.query_param("fieldSelector").replace("%3D", "=");
            let name = selector.strip_prefix("metadata.name=");
            let metadata_only = request.accept.contains("as=PartialObjectMetadataList");
            let items: Vec<Value> = state
                .crds
                .iter()
                .filter(|(n, _)| name.is_none_or(|name| name == n.as_str()))
                .map(|(_, crd)| watch::as_asked(crd, metadata_only))
                .collect();
            let (kind, api_version) = if metadata_only {
                ("PartialObjectMetadataList", "meta.k8s.io/v1")
            } else {
                ("CustomResourceDefinitionList", "apiextensions.k8s.io/v1")
            };
            (
                200,
                json!({"kind": kind, "apiVersion": api_version,
                       "metadata": {"resourceVersion": state.latest_resource_version()}, "items": items}),
            )
        }
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
        ) => patch_crd(
            state,
            name,
            body,
            request.content_type.starts_with("application/merge-patch+json"),
        ),
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
            "PUT",
            [
                "apis",
                "apiextensions.k8s.io",
                "v1",
                "customresourcedefinitions",
                name,
            ],
        ) if request.query_param("dryRun") == "All" => dry_run_update_crd(state, name, body),
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
        ) => apply_policy_status(state, name, &request.query_param("fieldManager"), body),
        ("PATCH", ["apis", "crdlifecycle.io", "v1alpha1", "versionpolicies", name]) => {
            patch_policy(state, name, body)
        }
        ("DELETE", ["apis", "crdlifecycle.io", "v1alpha1", "versionpolicies", name]) => {
            delete_policy(state, name)
        }
        // A list, as any list of custom objects (samples 09, 10 show their shape).
        ("GET", ["apis", "crdlifecycle.io", "v1alpha1", "versionpolicies"]) => (
            200,
            json!({"kind": "VersionPolicyList", "apiVersion": "crdlifecycle.io/v1alpha1",
                   "metadata": {"resourceVersion": state.latest_resource_version()},
                   "items": state.policies.values().cloned().collect::<Vec<_>>()}),
        ),
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
        (method @ ("GET" | "PUT"), ["api", "v1", "namespaces", namespace, "secrets", name])
            if state.secrets_forbidden.get(method).is_some_and(|n| *n > 0) =>
        {
            if let Some(n) = state.secrets_forbidden.get_mut(method) {
                *n -= 1;
            }
            forbidden_secret(method, namespace, name)
        }
        // Secrets as recorded (tests/fixtures/apiserver/secret-answers-v1.36.txt): 404 and 409
        // name the Secret in `details`; POST fills namespace, uid, creationTimestamp and type;
        // a PUT keeps uid and creationTimestamp, answers 409 for a stale resourceVersion (none:
        // unconditional), 422 for a type change (none sent: Opaque) and 404 for a Secret that
        // is gone (it never creates one).
        ("GET", ["api", "v1", "namespaces", _, "secrets", name]) => match state.secrets.get(*name) {
            Some(secret) => (200, secret.clone()),
            None => secret_failure(not_found("secrets", name), name),
        },
        ("POST", ["api", "v1", "namespaces", namespace, "secrets"]) => {
            let mut body = body;
            let name = body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            body["metadata"]["namespace"] = (*namespace).into();
            body["metadata"]["uid"] = format!("secret-{name}-{}", state.steps).into();
            body["metadata"]["creationTimestamp"] =
                json!(state.now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
            if body.get("type").is_none() {
                body["type"] = "Opaque".into();
            }
            secret_failure(
                create_named(state, |state| &mut state.secrets, "secrets", body),
                &name,
            )
        }
        ("PUT", ["api", "v1", "namespaces", _, "secrets", name]) => {
            let Some(current) = state.secrets.get(*name) else {
                return secret_failure(not_found("secrets", name), name);
            };
            // Without a resourceVersion the update is unconditional.
            let sent = &body["metadata"]["resourceVersion"];
            if !sent.is_null() && *sent != current["metadata"]["resourceVersion"] {
                return secret_failure(conflict("secrets", name), name);
            }
            let mut body = body;
            for kept in ["namespace", "uid", "creationTimestamp"] {
                body["metadata"][kept] = current["metadata"][kept].clone();
            }
            // The type is immutable; none sent means Opaque, then compared.
            if body.get("type").is_none() {
                body["type"] = "Opaque".into();
            }
            if body["type"] != current["type"] {
                let sent = body["type"].as_str().unwrap_or_default();
                let mut refusal = status_body(
                    422,
                    "Invalid",
                    &format!(
                        "Secret \"{name}\" is invalid: type: Invalid value: \"{sent}\": field is immutable"
                    ),
                );
                refusal["details"] = json!({"name": name, "kind": "Secret", "causes": [{
                    "reason": "FieldValueInvalid",
                    "message": format!("Invalid value: \"{sent}\": field is immutable"),
                    "field": "type"}]});
                return (422, refusal);
            }
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
        ("POST", ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"]) => {
            review_access(state, body)
        }
        ("GET", ["apis", migrations::GROUP]) if state.svm_served => {
            (200, migrations::api_group(state).unwrap_or_default())
        }
        ("POST", ["apis", migrations::GROUP, "v1beta1", "storageversionmigrations"]) if state.svm_served => {
            migrations::create(state, body)
        }
        ("GET", ["apis", migrations::GROUP, "v1beta1", "storageversionmigrations"]) if state.svm_served => {
            match state.svm_list_fault {
                Some(code) => (
                    code,
                    status_body(code, "ServiceUnavailable", "please try again later"),
                ),
                None => migrations::list(state),
            }
        }
        (
            "GET",
            [
                "apis",
                migrations::GROUP,
                "v1beta1",
                "storageversionmigrations",
                name,
            ],
        ) if state.svm_served => migrations::get(state, name),
        (
            "PATCH",
            [
                "apis",
                migrations::GROUP,
                "v1beta1",
                "storageversionmigrations",
                name,
            ],
        ) if state.svm_served => migrations::patch(state, name, &body),
        (
            "DELETE",
            [
                "apis",
                migrations::GROUP,
                "v1beta1",
                "storageversionmigrations",
                name,
            ],
        ) if state.svm_served => migrations::delete(state, name, &body),
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

/// Creates an object named by its `metadata.name` in one of the state's maps: 409
/// AlreadyExists when the name is taken, else 201 with a fresh resourceVersion.
pub(super) fn create_named(
    state: &mut State,
    store: fn(&mut State) -> &mut BTreeMap<String, Value>,
    resource: &str,
    mut body: Value,
) -> (u16, Value) {
    let name = body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
    if store(state).contains_key(&name) {
        return (
            409,
            status_body(
                409,
                "AlreadyExists",
                &format!("{resource} \"{name}\" already exists"),
            ),
        );
    }
    body["metadata"]["resourceVersion"] = state.next_resource_version().into();
    store(state).insert(name, body.clone());
    (201, body)
}

/// A Secret request RBAC refuses: 403 Forbidden naming the verb
/// (tests/fixtures/apiserver/secret-get-forbidden.txt, secret-put-forbidden.txt, recorded
/// from kube-apiserver v1.36.2).
fn forbidden_secret(method: &str, namespace: &str, name: &str) -> (u16, Value) {
    let verb = if method == "PUT" { "update" } else { "get" };
    let mut body = status_body(
        403,
        "Forbidden",
        &format!(
            "secrets \"{name}\" is forbidden: User \"system:serviceaccount:crd-lifecycle:crd-lifecycle\" \
             cannot {verb} resource \"secrets\" in API group \"\" in the namespace \"{namespace}\""
        ),
    );
    body["details"] = json!({"name": name, "kind": "secrets"});
    (403, body)
}

/// A Secret's failure as recorded: its `details` name the Secret
/// (tests/fixtures/apiserver/secret-answers-v1.36.txt).
fn secret_failure((code, mut body): (u16, Value), name: &str) -> (u16, Value) {
    if code >= 400 {
        body["details"] = json!({"name": name, "kind": "secrets"});
    }
    (code, body)
}

pub(super) fn not_found(resource: &str, name: &str) -> (u16, Value) {
    (
        404,
        status_body(404, "NotFound", &format!("{resource} \"{name}\" not found")),
    )
}

pub(super) fn conflict(resource: &str, name: &str) -> (u16, Value) {
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

/// Applies a JSON Patch as the apiserver does: 400 for a body that is not one; 422 with
/// the generic message when an op (a failing `test`) does not apply (sample 03, and on v1.36
/// tests/fixtures/apiserver/crd-ca-bundle-writes-v1.36.txt, 2b). Unlike RFC 6902 and the
/// `json_patch` crate, the apiserver's JSON Patch (evanphx/json-patch v4, the same for every
/// resource) applies a `replace` of a missing member of an existing object as an `add` (ibid.,
/// 2a); under a missing parent it is the generic 422 (ibid., 2c).
pub(super) fn apply_json_patch(target: &mut Value, body: &Value) -> Result<(), (u16, Value)> {
    let Ok(patch) = serde_json::from_value::<json_patch::Patch>(body.clone()) else {
        return Err((400, status_body(400, "BadRequest", "invalid JSON Patch")));
    };
    let refused = || {
        (
            422,
            status_body(
                422,
                "Invalid",
                "the server rejected our request due to an error in our request",
            ),
        )
    };
    // Op by op on a copy: whether a member is missing depends on the ops before it.
    let mut patched = target.clone();
    for op in patch.0 {
        let op = match op {
            json_patch::PatchOperation::Replace(replace) if missing_member(&patched, &replace.path) => {
                json_patch::PatchOperation::Add(json_patch::AddOperation {
                    path: replace.path,
                    value: replace.value,
                })
            }
            op => op,
        };
        json_patch::patch(&mut patched, &[op]).map_err(|_| refused())?;
    }
    *target = patched;
    Ok(())
}

/// Whether `path` names a member its parent object does not have (the parent exists).
fn missing_member(document: &Value, path: &json_patch::jsonptr::Pointer) -> bool {
    let Some((parent, member)) = path.split_back() else {
        return false;
    };
    match parent.resolve(document) {
        Ok(Value::Object(object)) => !object.contains_key(member.decoded().as_ref()),
        _ => false,
    }
}

pub(super) fn respond(code: u16, body: &Value) -> Response<Body> {
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
