//! Watches of VersionPolicies and CustomResourceDefinitions (metadata only, as the controller
//! asks for CRDs), as kube-runtime's watcher makes them, recorded from kube-apiserver v1.36.2
//! in `tests/fixtures/watch/`:
//!
//! - a list answers the latest resourceVersion; a watch from it streams one JSON event per
//!   line (`{"type": ..., "object": ...}`), `ADDED`, `MODIFIED`, `DELETED`, in
//!   resourceVersion order, and ends after `timeoutSeconds` (`versionpolicies.txt`);
//! - a metadata-only watch (`Accept: ...;as=PartialObjectMetadata;...`) streams
//!   `PartialObjectMetadata` objects (`crds-metadata.txt`);
//! - a write that changes nothing (a status apply or a JSON Patch with the same values)
//!   answers the same resourceVersion and sends no event (both files);
//! - a deletion held by a finalizer is a `MODIFIED` with `deletionTimestamp` and generation
//!   + 1; removing the last finalizer sends `DELETED` (`versionpolicies.txt`).
//!
//! Bookmarks are left out: the apiserver sends them when it chooses, and a watcher must do
//! without them. A watch of whole CRDs (the storage guard's) is `watch`'s.

use std::convert::Infallible;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use http::{Request, Response, StatusCode};
use http_body_util::StreamBody;
use hyper::body::Frame;
use kube::client::Body;
use serde_json::{Value, json};

use super::{FakeApiserver, Recorded, State};

/// What a watch streams.
pub type WatchBody = StreamBody<BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

/// The watched resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    Policies,
    Crds,
}

/// One change of a watched object.
#[derive(Clone, Debug)]
pub struct Change {
    pub resource: Watched,
    pub type_: &'static str,
    pub object: Value,
    pub resource_version: u64,
    /// When it was made.
    pub at: tokio::time::Instant,
}

impl State {
    /// Records a change for the open watches (the object carries its new resourceVersion).
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
}

/// A watched list or event object as asked for: the whole object, or its metadata only.
pub(super) fn as_asked(object: &Value, metadata_only: bool) -> Value {
    if metadata_only {
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"]})
    } else {
        object.clone()
    }
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
        // A CRD watch of whole objects (the storage guard's, by name) is `watch`'s, with its
        // bookmarks, its 410 after a compaction and its clock.
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
        let changes = state.changed.clone();
        drop(state);
        let fake = self.clone();
        let live = futures::stream::unfold(
            (fake, cursor, changes),
            move |(fake, mut cursor, changes)| async move {
                loop {
                    // Waiting before looking: a change made after the look still wakes it.
                    let changed = changes.clone().notified_owned();
                    tokio::pin!(changed);
                    changed.as_mut().enable();
                    let next = fake
                        .lock()
                        .changes
                        .iter()
                        .find(|c| c.resource == resource && c.resource_version > cursor)
                        .cloned();
                    if let Some(change) = next {
                        // A watch delivers a change some time after the write's answer.
                        let delay = fake.lock().watch_delay;
                        tokio::time::sleep_until(change.at + delay).await;
                        cursor = change.resource_version;
                        return Some((
                            event(change.type_, &change.object, metadata_only),
                            (fake, cursor, changes),
                        ));
                    }
                    let ended = async {
                        match deadline {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    };
                    // `biased`: an event before the deadline, in an order a simulation replays.
                    tokio::select! {
                        biased;
                        () = changed => {}
                        () = ended => return None,
                    }
                }
            },
        );
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

/// One line of a watch stream.
fn event(type_: &str, object: &Value, metadata_only: bool) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": type_, "object": as_asked(object, metadata_only)}))
        .unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}
