//! What a connection shares with the service answering its requests: the requests in
//! flight (until their answer is written), when it became idle, and whether it is asked to
//! close (HTTP/1.1 answers then say `Connection: close`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::Response;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Notify;

use crate::webhook::Readiness;

/// What a connection shares with the service answering its requests.
#[derive(Debug)]
pub(super) struct Activity {
    /// Asked to close: HTTP/1.1 answers say `Connection: close`.
    pub(super) closing: AtomicBool,
    /// Requests whose answer is not completely written yet.
    pub(super) in_flight: AtomicUsize,
    /// When the connection last became idle (opened, or an answer written).
    idle_since: std::sync::Mutex<tokio::time::Instant>,
    /// Told when an answer has been written.
    answered: Notify,
}

impl Activity {
    pub(super) fn new() -> Activity {
        Activity {
            closing: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            idle_since: std::sync::Mutex::new(tokio::time::Instant::now()),
            answered: Notify::new(),
        }
    }

    /// Completes once no request is in flight and none has been for `grace`.
    pub(super) async fn idle_for(&self, grace: Duration) {
        loop {
            let answered = self.answered.notified();
            let mut answered = std::pin::pin!(answered);
            answered.as_mut().enable();
            if self.in_flight.load(Ordering::SeqCst) > 0 {
                answered.await;
                continue;
            }
            let since = *crate::sync::lock(&self.idle_since);
            let until = since + grace;
            if tokio::time::Instant::now() >= until {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = answered => {}
            }
        }
    }
}

/// A request in flight on a connection, until its answer has been written (or dropped).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *crate::sync::lock(&self.0.idle_since) = tokio::time::Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.answered.notify_waiters();
    }
}

/// An answer's body, holding its request in flight until it is written.
struct Answering {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Answering {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The router, answering one connection's requests: counts them in flight, and on
/// HTTP/1.1 says `Connection: close` once the connection is asked to close or the webhook
/// drains (hyper then closes the connection after that answer: the client, having read it,
/// sends its next request over a new connection).
#[derive(Clone)]
pub(super) struct Answer {
    pub(super) router: TowerToHyperService<Router>,
    pub(super) activity: Arc<Activity>,
    pub(super) readiness: Arc<Readiness>,
}

type AnswerFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<Response, std::convert::Infallible>> + Send>>;

impl hyper::service::Service<Request<hyper::body::Incoming>> for Answer {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = AnswerFuture;

    fn call(&self, request: Request<hyper::body::Incoming>) -> AnswerFuture {
        let in_flight = InFlight::new(self.activity.clone());
        let http1 = request.version() < http::Version::HTTP_2;
        let answer = self.router.call(request);
        let (activity, readiness) = (self.activity.clone(), self.readiness.clone());
        Box::pin(async move {
            let mut response = answer.await?;
            if http1 && (activity.closing.load(Ordering::SeqCst) || readiness.is_draining()) {
                response
                    .headers_mut()
                    .insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            }
            Ok(response.map(|body| {
                Body::new(Answering {
                    body,
                    _in_flight: in_flight,
                })
            }))
        })
    }
}
