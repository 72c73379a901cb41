//! Watches, as kube-runtime's watcher and the storage guard make them and kube-apiserver
//! v1.36.2 answers them, and the apiserver's clock. Every write of a VersionPolicy or a CRD is
//! one `Change` in one log (`State::record`), and every watch delivers it through one
//! `Follower` (the changes after its resourceVersion, as they are made, until its deadline).
//! The rules, each as recorded:
//!
//! Every watch (`tests/fixtures/watch/`):
//! - a list answers the latest resourceVersion; a watch from it streams one JSON event per
//!   line (`{"type": ..., "object": ...}`), `ADDED`, `MODIFIED`, `DELETED`, in
//!   resourceVersion order, and ends after `timeoutSeconds` (`versionpolicies.txt`);
//! - a write that changes nothing (a status apply or a JSON Patch with the same values)
//!   answers the same resourceVersion and sends no event (both files);
//! - a deletion held by a finalizer is a `MODIFIED` with `deletionTimestamp` and generation
//!   + 1; removing the last finalizer sends `DELETED` (`versionpolicies.txt`).
//!
//! Watches of VersionPolicies, and of CRDs' metadata (`FakeApiserver::watch`):
//! - a metadata-only watch (`Accept: ...;as=PartialObjectMetadata;...`) streams
//!   `PartialObjectMetadata` objects (`crds-metadata.txt`);
//! - bookmarks are left out: the apiserver sends them when it chooses, and a watcher must do
//!   without them.
//!
//! Watches of whole CRDs, one by name or every one (the storage guard's, `watch_crd`), from
//! `tests/fixtures/apiserver/`:
//! - `GET .../customresourcedefinitions?watch=true&fieldSelector=metadata.name=NAME&resourceVersion=RV`
//!   answers 200 and streams one JSON line per write of that CRD after RV, oldest first
//!   (`ADDED` for its creation, `MODIFIED` for every other write, status writes included),
//!   each with the whole CRD at its new resourceVersion; then every later write as it
//!   happens (crd-watch-events-and-bookmarks.txt); a deletion is `DELETED` with the CRD as
//!   last stored, at a new resourceVersion (crd-deletion-v1.36.txt);
//! - with `allowWatchBookmarks`, `BOOKMARK` events carry only a resourceVersion, the store's
//!   (not the CRD's); they came shortly before `timeoutSeconds`, when the server ends the
//!   stream (same file): here one bookmark just before the end;
//! - a watch from a resourceVersion the apiserver can no longer serve (etcd compacted and the
//!   apiserver's watch cache started after it, e.g. after a restart) answers 200 with one
//!   `ERROR` event carrying a `Status` 410 `Expired`, and ends at once (crd-watch-expired.txt);
//! - every response carries the apiserver's clock in its `date` header, on the same clock as
//!   the managedFields `time`s (crd-get-date-header.txt).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use http_body_util::StreamBody;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Frame;
use kube::client::Body;
use serde_json::{Value, json};

use super::{FakeApiserver, Recorded, State};

/// The fake's response body: one chunk, or a watch stream.
pub type FakeBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// What a watch of VersionPolicies or CRDs' metadata streams.
pub type WatchBody = StreamBody<BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

/// The watched resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    Policies,
    Crds,
}

/// One change of a watched object: the log every watch replays and follows.
#[derive(Clone, Debug)]
pub struct Change {
    pub resource: Watched,
    pub type_: &'static str,
    pub object: Value,
    pub resource_version: u64,
    /// When it was made.
    pub at: tokio::time::Instant,
}

/// A watch's place in the log: the changes of one resource (of one object, by name) after a
/// resourceVersion, as they are made, until its deadline.
struct Follower {
    fake: FakeApiserver,
    resource: Watched,
    /// `fieldSelector=metadata.name=`: only that object's changes.
    name: Option<String>,
    /// The resourceVersion of the last change delivered.
    cursor: u64,
    /// Whether a change is delivered `watch_delay` after it was made (kube-runtime's
    /// watchers); a whole-CRD watch gets it at once.
    delayed: bool,
    deadline: Option<tokio::time::Instant>,
    /// A whole-CRD watch ends at the apiserver's restart (`expire_watch_history`): the
    /// restarts before it started.
    restarts: Option<u64>,
}

/// What a watch does next.
enum Next {
    Deliver(Change),
    /// Its `timeoutSeconds` passed.
    TimedOut,
    /// The apiserver restarted (see `expire_watch_history`).
    Ended,
}

impl Follower {
    /// The next change to deliver, once it is due.
    async fn next(&mut self) -> Next {
        let changes = self.fake.lock().changed.clone();
        loop {
            // Waiting before looking: a change made after the look still wakes it.
            let changed = changes.clone().notified_owned();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (next, ended) = {
                let state = self.fake.lock();
                let ended = self.restarts.is_some_and(|r| r != state.watch_restarts);
                let next = state
                    .changes
                    .iter()
                    .find(|c| {
                        c.resource == self.resource
                            && c.resource_version > self.cursor
                            && self
                                .name
                                .as_ref()
                                .is_none_or(|n| c.object["metadata"]["name"] == n.as_str())
                            && (!ended || c.resource_version <= state.watch_history_from)
                    })
                    .cloned();
                (next, ended)
            };
            if let Some(change) = next {
                if self.delayed {
                    // A watch delivers a change some time after the write's answer.
                    let delay = self.fake.lock().watch_delay;
                    tokio::time::sleep_until(change.at + delay).await;
                }
                self.cursor = change.resource_version;
                return Next::Deliver(change);
            }
            if ended {
                return Next::Ended;
            }
            let deadline = self.deadline;
            let timed_out = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            // `biased`: an event before the deadline, in an order a simulation replays.
            tokio::select! {
                biased;
                () = changed => {}
                () = timed_out => return Next::TimedOut,
            }
        }
    }
}

impl State {
    /// The apiserver's clock: this machine's, shifted by `clock_offset`, advancing with
    /// tokio's clock (so that paused tests move it).
    pub fn now(&mut self) -> jiff::Timestamp {
        let (wall, at) = *self
            .clock_base
            .get_or_insert_with(|| (jiff::Timestamp::now(), tokio::time::Instant::now()));
        let elapsed = jiff::SignedDuration::try_from(at.elapsed()).unwrap_or_default();
        wall + elapsed + self.clock_offset
    }

    /// Records a change for the watches (the object carries its new resourceVersion), and
    /// wakes them.
    pub(super) fn record(&mut self, resource: Watched, type_: &'static str, object: &Value) {
        let resource_version = object["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0);
        self.changes.push(Change {
            resource,
            type_,
            object: object.clone(),
            resource_version,
            at: tokio::time::Instant::now(),
        });
        self.changed.notify_waiters();
    }

    /// The resourceVersion of the latest write, as a list answers it.
    pub(super) fn latest_resource_version(&self) -> String {
        (10_000 + self.resource_version).to_string()
    }

    /// The apiserver restarted after an etcd compaction: open watches of whole CRDs end, and
    /// one from any resourceVersion before now answers 410 Expired (crd-watch-expired.txt).
    pub fn expire_watch_history(&mut self) {
        self.watch_history_from = self.resource_version + 10_000;
        self.watch_restarts += 1;
        self.changed.notify_waiters();
    }
}

/// A watched list or event object as asked for: the whole object, or its metadata only.
pub(super) fn as_asked(object: &Value, metadata_only: bool) -> Value {
    if metadata_only {
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"]})
    } else {
        object.clone()
    }
}

/// One line of a watch stream: an event, then a newline.
fn line(event: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// The line of a change as asked for.
fn event(type_: &str, object: &Value, metadata_only: bool) -> Bytes {
    line(&json!({"type": type_, "object": as_asked(object, metadata_only)}))
}

impl FakeApiserver {
    /// The answer to a watch request (`?watch=true` on VersionPolicies or CRDs), `None` for
    /// any other request.
    pub(super) fn watch(&self, request: &Request<Body>) -> Option<Response<WatchBody>> {
        let path = request.uri().path();
        let resource = match path {
            "/apis/crdlifecycle.io/v1alpha1/versionpolicies" => Watched::Policies,
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions" => Watched::Crds,
            _ => return None,
        };
        let query = request.uri().query().unwrap_or_default().to_owned();
        let param = |name: &str| {
            query
                .split('&')
                .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
                .map(str::to_owned)
        };
        if !matches!(param("watch").as_deref(), Some("true" | "1")) {
            return None;
        }
        let accept = request
            .headers()
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let metadata_only = accept.contains("as=PartialObjectMetadata");
        // A CRD watch of whole objects (the storage guard's, by name) is `watch_crd`'s, with
        // its bookmarks, its 410 after a compaction and its clock.
        if resource == Watched::Crds && !metadata_only {
            return None;
        }
        let deadline = param("timeoutSeconds")
            .and_then(|s| s.parse().ok())
            .map(|s| tokio::time::Instant::now() + std::time::Duration::from_secs(s));
        let mut state = self.lock();
        state.requests.push(Recorded {
            method: "GET".into(),
            path: path.to_owned(),
            query: query.clone(),
            content_type: String::new(),
            accept,
            body: Value::Null,
            at: tokio::time::Instant::now(),
            actor: self.actor.unwrap_or("controller"),
        });
        if resource == Watched::Policies && state.policies_unserved {
            return None;
        }
        // From a resourceVersion: the changes after it. From "0" or none: every object as
        // ADDED, then the changes.
        let from: u64 = param("resourceVersion")
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0);
        let mut initial = Vec::new();
        let cursor = if from == 0 {
            let objects: Vec<&Value> = match resource {
                Watched::Policies => state.policies.values().collect(),
                Watched::Crds => state.crds.values().collect(),
            };
            initial = objects
                .into_iter()
                .map(|o| event("ADDED", o, metadata_only))
                .collect();
            10_000 + state.resource_version
        } else {
            from
        };
        drop(state);
        let follower = Follower {
            fake: self.clone(),
            resource,
            name: None,
            cursor,
            delayed: true,
            deadline,
            restarts: None,
        };
        let live = futures::stream::unfold(follower, move |mut follower| async move {
            match follower.next().await {
                Next::Deliver(change) => Some((event(change.type_, &change.object, metadata_only), follower)),
                Next::TimedOut | Next::Ended => None,
            }
        });
        let lines = futures::stream::iter(initial)
            .chain(live)
            .map(|line| Ok(Frame::data(line)))
            .boxed();
        Some(
            Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(StreamBody::new(lines))
                .unwrap_or_else(|_| Response::new(StreamBody::new(futures::stream::empty().boxed()))),
        )
    }
}

/// Whether the request is a watch of CRDs.
pub(super) fn is_crd_watch(request: &Recorded) -> bool {
    request.method == "GET"
        && request.path == "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        && request.query_param("watch") == "true"
}

/// `date` as the apiserver writes it (RFC 7231 IMF-fixdate).
pub(super) fn http_date(at: jiff::Timestamp) -> String {
    at.strftime("%a, %d %b %Y %H:%M:%S GMT").to_string()
}

/// An answer of one chunk, `bytes`.
fn once(code: u16, bytes: Bytes) -> Response<FakeBody> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(
            http_body_util::Full::new(bytes)
                .map_err(|never: Infallible| match never {})
                .boxed_unsync(),
        )
        .unwrap_or_else(|_| Response::new(FakeBody::default()))
}

/// Answers a watch of whole CRDs, one by name or every one (see the module's documentation).
pub(super) fn watch_crd(fake: &FakeApiserver, request: &Recorded) -> Response<FakeBody> {
    // One CRD by name (recorded), or every CRD (the same events for each; the controller's
    // own watch of CRDs).
    let selector = request.query_param("fieldSelector").replace("%3D", "=");
    let name = selector.strip_prefix("metadata.name=").map(str::to_owned);
    let Ok(from) = request.query_param("resourceVersion").parse::<u64>() else {
        let mut state = fake.lock();
        state
            .unknown_requests
            .push(format!("{} {}?{}", request.method, request.path, request.query));
        let status = super::status_body(501, "NotImplemented", "a watch without a resourceVersion");
        return once(501, Bytes::from(serde_json::to_vec(&status).unwrap_or_default()));
    };
    let timeout = request
        .query_param("timeoutSeconds")
        .parse::<u64>()
        .unwrap_or(1800);
    let bookmarks = request.query_param("allowWatchBookmarks") == "true";
    let mut state = fake.lock();
    let now = state.now();
    let dated = |mut response: Response<FakeBody>| {
        if let Ok(value) = http_date(now).parse() {
            response.headers_mut().insert(http::header::DATE, value);
        }
        response
    };
    if from < state.watch_history_from {
        let current = state.resource_version + 10_000;
        let expired = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": format!("too old resource version: {from} ({current})"),
            "reason": "Expired", "code": 410}});
        return dated(once(200, line(&expired)));
    }
    let follower = Follower {
        fake: fake.clone(),
        resource: Watched::Crds,
        name,
        cursor: from,
        delayed: false,
        deadline: Some(tokio::time::Instant::now() + Duration::from_secs(timeout)),
        restarts: Some(state.watch_restarts),
    };
    drop(state);
    let stream = futures::stream::unfold(Some(follower), move |follower| async move {
        let mut follower = follower?;
        let line = match follower.next().await {
            Next::Deliver(change) => line(&json!({"type": change.type_, "object": change.object})),
            Next::Ended => return None,
            Next::TimedOut if bookmarks => {
                let current = follower.fake.lock().resource_version + 10_000;
                let bookmark = json!({"type": "BOOKMARK", "object": {
                    "kind": "CustomResourceDefinition", "apiVersion": "apiextensions.k8s.io/v1",
                    "metadata": {"resourceVersion": current.to_string()},
                    "spec": {"group": "", "names": {"plural": "", "kind": ""}, "scope": "", "versions": null},
                    "status": {"conditions": null, "acceptedNames": {"plural": "", "kind": ""}, "storedVersions": null}}});
                return Some((Ok(Frame::data(line(&bookmark))), None));
            }
            Next::TimedOut => return None,
        };
        Some((Ok(Frame::data(line)), Some(follower)))
    });
    dated(
        Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(http_body_util::StreamBody::new(stream).boxed_unsync())
            .unwrap_or_else(|_| Response::new(FakeBody::default())),
    )
}
