//! Watches of one CRD by name (or of every CRD, with the same events), and the apiserver's clock, as recorded from a v1.36.2
//! kube-apiserver (`tests/fixtures/apiserver/`):
//! - `GET .../customresourcedefinitions?watch=true&fieldSelector=metadata.name=NAME&resourceVersion=RV`
//!   answers 200 and streams one JSON line per write of that CRD after RV, oldest first
//!   (`ADDED` for its creation, `MODIFIED` for every other write, status writes included),
//!   each with the whole CRD at its new resourceVersion; then every later write as it
//!   happens (crd-watch-events-and-bookmarks.txt);
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
use http::{Response, StatusCode};
use http_body_util::BodyExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{FakeApiserver, Recorded, State};

/// The fake's response body: one chunk, or a watch stream.
pub type FakeBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// One write of a CRD, as a watch replays it.
#[derive(Clone, Debug)]
pub(super) struct CrdWrite {
    resource_version: u64,
    name: String,
    event: Value,
}

/// An open watch of one CRD.
pub(super) struct CrdWatcher {
    /// `None`: every CRD.
    name: Option<String>,
    events: mpsc::UnboundedSender<Value>,
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

    /// Records a write of a CRD for watches (`ADDED` when it is new) and sends it to the
    /// open watches of that CRD.
    pub(super) fn crd_written(&mut self, name: &str, created: bool) {
        let Some(crd) = self.crds.get(name).cloned() else {
            return;
        };
        self.send_crd_event(name, if created { "ADDED" } else { "MODIFIED" }, &crd);
    }

    /// A CRD's deletion, for the watches of whole CRDs (`DELETED` with the CRD as last
    /// stored, at a new resourceVersion: tests/fixtures/apiserver/crd-deletion-v1.36.txt).
    pub(super) fn crd_gone(&mut self, name: &str, crd: &Value) {
        self.send_crd_event(name, "DELETED", crd);
    }

    /// Keeps an event of a CRD for watches that start later, and sends it to the open
    /// watches of that CRD.
    fn send_crd_event(&mut self, name: &str, type_: &str, crd: &Value) {
        let resource_version = crd["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|rv| rv.parse().ok())
            .unwrap_or(0);
        let event = json!({"type": type_, "object": crd});
        self.crd_history.push(CrdWrite {
            resource_version,
            name: name.to_owned(),
            event: event.clone(),
        });
        self.crd_watchers
            .retain(|w| w.name.as_ref().is_some_and(|n| n != name) || w.events.send(event.clone()).is_ok());
    }

    /// The apiserver restarted after an etcd compaction: open watches end, and a watch from
    /// any resourceVersion before now answers 410 Expired (crd-watch-expired.txt).
    pub fn expire_watch_history(&mut self) {
        self.watch_history_from = self.resource_version + 10_000;
        self.crd_watchers.clear();
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

fn once(code: u16, body: &Value) -> Response<FakeBody> {
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
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

fn line(event: &Value) -> Result<hyper::body::Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>> {
    let mut bytes = serde_json::to_vec(event).unwrap_or_default();
    bytes.push(b'\n');
    Ok(hyper::body::Frame::data(Bytes::from(bytes)))
}

/// Where a watch stream is.
enum Phase {
    Replay(std::vec::IntoIter<Value>),
    Live,
    Done,
}

/// Answers a watch of one CRD by name (see the module's documentation).
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
        return once(
            501,
            &super::status_body(501, "NotImplemented", "a watch without a resourceVersion"),
        );
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
        let mut bytes = serde_json::to_vec(&expired).unwrap_or_default();
        bytes.push(b'\n');
        return dated(
            Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(
                    http_body_util::Full::new(Bytes::from(bytes))
                        .map_err(|never: Infallible| match never {})
                        .boxed_unsync(),
                )
                .unwrap_or_else(|_| Response::new(FakeBody::default())),
        );
    }
    let replay: Vec<Value> = state
        .crd_history
        .iter()
        .filter(|w| name.as_ref().is_none_or(|n| *n == w.name) && w.resource_version > from)
        .map(|w| w.event.clone())
        .collect();
    let (sender, receiver) = mpsc::unbounded_channel();
    state.crd_watchers.push(CrdWatcher { name, events: sender });
    drop(state);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    let fake = fake.clone();
    let stream = futures::stream::unfold(
        (Phase::Replay(replay.into_iter()), receiver, fake),
        move |(mut phase, mut receiver, fake)| async move {
            loop {
                match phase {
                    Phase::Replay(ref mut events) => match events.next() {
                        Some(event) => return Some((line(&event), (phase, receiver, fake))),
                        None => phase = Phase::Live,
                    },
                    Phase::Live => {
                        // `biased`: an event before the deadline, in an order a simulation replays.
                        tokio::select! {
                            biased;
                            event = receiver.recv() => match event {
                                Some(event) => return Some((line(&event), (phase, receiver, fake))),
                                // The apiserver went away (see `expire_watch_history`).
                                None => return None,
                            },
                            () = tokio::time::sleep_until(deadline) => {
                                phase = Phase::Done;
                                if bookmarks {
                                    let current = fake.lock().resource_version + 10_000;
                                    let bookmark = json!({"type": "BOOKMARK", "object": {
                                        "kind": "CustomResourceDefinition", "apiVersion": "apiextensions.k8s.io/v1",
                                        "metadata": {"resourceVersion": current.to_string()},
                                        "spec": {"group": "", "names": {"plural": "", "kind": ""}, "scope": "", "versions": null},
                                        "status": {"conditions": null, "acceptedNames": {"plural": "", "kind": ""}, "storedVersions": null}}});
                                    return Some((line(&bookmark), (phase, receiver, fake)));
                                }
                            }
                        }
                    }
                    Phase::Done => return None,
                }
            }
        },
    );
    dated(
        Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(http_body_util::StreamBody::new(stream).boxed_unsync())
            .unwrap_or_else(|_| Response::new(FakeBody::default())),
    )
}
