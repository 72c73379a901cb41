//! HTTPS serving with certificates that can be replaced while running (rotation).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::BytesMut;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use super::metrics::{ReviewResult, WebhookMetrics};
use super::{Limits, Lookup, PolicySource, Readiness};

/// The serving certificate, replaceable at any time.
#[derive(Debug, Default)]
pub struct CertStore {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl CertStore {
    /// Installs a certificate chain and key (PEM).
    pub fn set_pem(&self, cert_pem: &str, key_pem: &str) -> Result<(), String> {
        let certified = certified_key(cert_pem, key_pem)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(certified);
        Ok(())
    }

    /// Whether a certificate chain and key (PEM) could be installed.
    pub fn check_pem(cert_pem: &str, key_pem: &str) -> Result<(), String> {
        certified_key(cert_pem, key_pem).map(|_| ())
    }

    /// Whether the certificate served is the first of this PEM chain.
    pub fn serves(&self, cert_pem: &str) -> bool {
        let Some(Ok(wanted)) = CertificateDer::pem_slice_iter(cert_pem.as_bytes()).next() else {
            return false;
        };
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|current| current.cert.first() == Some(&wanted))
    }

    pub fn is_ready(&self) -> bool {
        self.current.read().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// The certificate served (DER, the first of its chain), if any: what a TLS client of
    /// the webhook is shown.
    pub fn served(&self) -> Option<CertificateDer<'static>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|current| current.cert.first().cloned())
    }
}

fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("invalid certificate PEM: {e}"))?;
    if chain.is_empty() {
        return Err("no certificate in the PEM".to_owned());
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("invalid key PEM: {e}"))?;
    let signing_key =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| format!("unsupported key: {e}"))?;
    Ok(Arc::new(CertifiedKey::new(chain, signing_key)))
}

#[derive(Debug)]
struct Resolver(Arc<CertStore>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[derive(Clone)]
struct WebhookState {
    policies: Arc<dyn PolicySource>,
    metrics: Arc<WebhookMetrics>,
    limits: Arc<Limits>,
    /// Conversions running off the async runtime at once (one per core): a review that
    /// spends its whole budget holds one slot, never a runtime worker.
    conversions: Arc<Semaphore>,
    /// Reviews over `LARGE_REVIEW_BYTES` buffered at once, so memory stays bounded.
    large_reviews: Arc<Semaphore>,
}

/// A review up to this size is first answered on the async runtime with expressions limited
/// to `INLINE_COST` units: its cost is linear in these few bytes plus that budget (well
/// under a millisecond). One that needs more is answered again on the blocking pool with the
/// full budget (conversion is pure, so the retry is safe); a larger review goes there
/// straight away.
const INLINE_REVIEW_BYTES: usize = 64 << 10;
const INLINE_COST: u64 = 10_000;

/// Reviews larger than this need one of `LARGE_REVIEWS_AT_ONCE` slots to be read.
const LARGE_REVIEW_BYTES: usize = 1 << 20;
const LARGE_REVIEWS_AT_ONCE: usize = 2;

/// Bytes of an over-limit body kept to find its uid.
const PREFIX_BYTES: usize = 64 << 10;

/// `POST /convert/<policy>`, `GET /healthz` and `GET /readyz`; every review is counted in
/// `metrics`.
fn router(
    policies: Arc<dyn PolicySource>,
    metrics: Arc<WebhookMetrics>,
    limits: Limits,
    readiness: Arc<Readiness>,
) -> Router {
    let cores = std::thread::available_parallelism().map_or(2, usize::from).max(2);
    Router::new()
        .route("/convert/{policy}", post(convert))
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let readiness = readiness.clone();
                async move {
                    match readiness.check() {
                        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
                    }
                }
            }),
        )
        .with_state(WebhookState {
            policies,
            metrics,
            limits: Arc::new(limits),
            conversions: Arc::new(Semaphore::new(cores)),
            large_reviews: Arc::new(Semaphore::new(LARGE_REVIEWS_AT_ONCE)),
        })
}

async fn convert(
    State(state): State<WebhookState>,
    Path(policy): Path<String>,
    request: Request,
) -> Response {
    let started = std::time::Instant::now();
    let (parts, body) = request.into_parts();
    let length = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    let _large = match length {
        Some(length) if length <= LARGE_REVIEW_BYTES => None,
        _ => state.large_reviews.clone().acquire_owned().await.ok(),
    };
    let lookup = state.policies.converter(&policy);
    // Only policies the webhook knows become label values: any client can call any path.
    let label = if matches!(lookup, Lookup::Missing) {
        "unknown".to_owned()
    } else {
        policy.clone()
    };
    let limit = state.limits.max_review_bytes;
    let body = match read_body(body, length, limit).await {
        Ok(body) => body,
        Err(ReadError::TooLarge { prefix, size }) => {
            warn!(
                policy,
                size, limit, "refused a ConversionReview over the size limit"
            );
            state
                .metrics
                .observe_review(&label, ReviewResult::failure, started.elapsed());
            return json(StatusCode::OK, to_json(&super::too_large(&prefix, size, limit)));
        }
        Err(ReadError::Broken(error)) => {
            debug!(policy, error, "the ConversionReview's body could not be read");
            state
                .metrics
                .observe_review(&label, ReviewResult::invalid, started.elapsed());
            return StatusCode::BAD_REQUEST.into_response();
        }
    };
    let inline = (body.len() <= INLINE_REVIEW_BYTES)
        .then(|| {
            let limits = Limits {
                call_cost: state.limits.call_cost.min(INLINE_COST),
                review_cost: state.limits.review_cost.min(INLINE_COST),
                ..(*state.limits).clone()
            };
            super::answer(&body, &policy, lookup.clone(), &limits)
        })
        .filter(|answer| !answer.over_limit || state.limits.review_cost <= INLINE_COST);
    let answered = if let Some(answer) = inline {
        Answered::from(answer)
    } else {
        let Ok(slot) = state.conversions.clone().acquire_owned().await else {
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        };
        let limits = state.limits.clone();
        let path_policy = policy.clone();
        let blocking = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            respond(&body, &path_policy, lookup, &limits)
        });
        match blocking.await {
            Ok(answered) => answered,
            Err(error) => {
                warn!(policy, error = %error, "a conversion did not finish");
                state
                    .metrics
                    .observe_review(&label, ReviewResult::failure, started.elapsed());
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            }
        }
    };
    state
        .metrics
        .observe_review(&label, answered.result, started.elapsed());
    json(
        StatusCode::from_u16(answered.code).unwrap_or(StatusCode::BAD_REQUEST),
        answered.body,
    )
}

/// An answer, serialised.
struct Answered {
    code: u16,
    result: ReviewResult,
    body: Vec<u8>,
}

fn respond(body: &[u8], policy: &str, lookup: Lookup, limits: &Limits) -> Answered {
    Answered::from(super::answer(body, policy, lookup, limits))
}

impl From<super::Answer> for Answered {
    fn from(answer: super::Answer) -> Answered {
        Answered {
            code: answer.code,
            result: answer.result,
            body: to_json(&answer.review),
        }
    }
}

fn to_json(review: &kube::core::conversion::ConversionReview) -> Vec<u8> {
    // A ConversionReview of JSON values always serialises.
    serde_json::to_vec(review).unwrap_or_default()
}

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(http::header::CONTENT_TYPE, "application/json")], body).into_response()
}

enum ReadError {
    /// Over the limit: the first bytes (for the uid) and the size, if it was read to the end.
    TooLarge {
        prefix: Vec<u8>,
        size: Option<usize>,
    },
    Broken(String),
}

/// Reads a body of at most `limit` bytes. A larger one is read on (and dropped) up to four
/// times the limit, so the client gets the answer rather than a reset connection; only its
/// first `PREFIX_BYTES` are kept.
async fn read_body(mut body: Body, length: Option<usize>, limit: usize) -> Result<Bytes, ReadError> {
    let mut over = length.is_some_and(|length| length > limit);
    let mut buffer = BytesMut::with_capacity(if over { PREFIX_BYTES } else { length.unwrap_or(0) });
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| ReadError::Broken(error.to_string()))?;
        let Ok(data) = frame.into_data() else { continue };
        total += data.len();
        if total > limit && !over {
            over = true;
            buffer.truncate(PREFIX_BYTES);
        }
        if !over {
            buffer.extend_from_slice(&data);
        } else if buffer.len() < PREFIX_BYTES {
            let room = PREFIX_BYTES - buffer.len();
            buffer.extend_from_slice(&data[..room.min(data.len())]);
        }
        if total > limit.saturating_mul(4) {
            return Err(ReadError::TooLarge {
                prefix: buffer.to_vec(),
                size: None,
            });
        }
    }
    if over {
        return Err(ReadError::TooLarge {
            prefix: buffer.to_vec(),
            size: Some(total),
        });
    }
    Ok(buffer.freeze())
}

/// How the webhook's connections age and how the webhook stops.
#[derive(Clone, Copy, Debug)]
pub struct Connections {
    /// After the shutdown signal: how long the webhook keeps serving, not ready, so that the
    /// Service's endpoints drop it before it stops accepting.
    pub drain: Duration,
    /// Once the webhook stops accepting (and whenever a connection reaches `max_age`):
    /// how long requests in flight get to finish before their connection is closed.
    pub in_flight_deadline: Duration,
    /// A connection older than this (give or take a tenth, so that connections opened
    /// together do not all close together) is asked to close gracefully: HTTP/2 GOAWAY,
    /// HTTP/1.1 `Connection: close` on its next response. The client opens a new one,
    /// which the Service may send to another replica. `None`: never.
    pub max_age: Option<Duration>,
    /// An HTTP/1.1 connection asked to close (past `max_age`, or the webhook stopping) that
    /// sits idle is closed by the webhook only once it has been idle this long, longer than
    /// its client keeps an idle connection: until then the client closes it, or sends one
    /// more request, answered with `Connection: close`. Closing an idle HTTP/1.1 connection
    /// any sooner can close it under a request the client has just sent, which Go's client
    /// (the apiserver's) does not retry for a POST and reports as `EOF`.
    pub idle_grace: Duration,
}

/// Default `drain`: endpoint changes reach kube-proxy (or the apiserver's own endpoint
/// resolver) within a few seconds.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(10);
/// Default `in_flight_deadline`: a conversion's cost is bounded (see `Limits`); this is
/// for slow clients.
pub const DEFAULT_IN_FLIGHT_DEADLINE: Duration = Duration::from_secs(15);
/// Default `max_age`.
pub const DEFAULT_MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);
/// Default `idle_grace`: Go's `http.Transport` closes a connection idle for 90 s
/// (`IdleConnTimeout` of `http.DefaultTransport`, which the apiserver's webhook clients
/// keep) and never reuses one idle for longer; 10 s more for a busy client to get to it.
pub const DEFAULT_IDLE_GRACE: Duration = Duration::from_secs(100);

impl Connections {
    /// `drain`, `max_age` (zero: connections never age out) and `idle_grace`, with the
    /// default deadline for requests in flight.
    pub fn new(drain: Duration, max_age: Duration, idle_grace: Duration) -> Connections {
        Connections {
            drain,
            in_flight_deadline: DEFAULT_IN_FLIGHT_DEADLINE,
            max_age: (!max_age.is_zero()).then_some(max_age),
            idle_grace,
        }
    }

    /// How long the webhook may take to stop once it stops accepting: requests in flight
    /// finish within `in_flight_deadline`, then idle HTTP/1.1 connections get `idle_grace`.
    pub fn closing_deadline(&self) -> Duration {
        self.in_flight_deadline + self.idle_grace
    }
}

impl Default for Connections {
    fn default() -> Connections {
        Connections {
            drain: DEFAULT_DRAIN,
            in_flight_deadline: DEFAULT_IN_FLIGHT_DEADLINE,
            max_age: Some(DEFAULT_MAX_CONNECTION_AGE),
            idle_grace: DEFAULT_IDLE_GRACE,
        }
    }
}

/// A TLS handshake not done within this is dropped (a client that connects and sends
/// nothing holds no task for long).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The conversion webhook's HTTPS server.
pub struct Server {
    pub certs: Arc<CertStore>,
    pub policies: Arc<dyn PolicySource>,
    pub metrics: Arc<WebhookMetrics>,
    pub limits: Limits,
    /// What `/readyz` answers.
    pub readiness: Arc<Readiness>,
    pub connections: Connections,
}

/// Completes `drain` after `signal`, having marked `readiness` draining when `signal`
/// completed: the `stop` of [`Server::serve`] for a process that got SIGTERM.
pub async fn drain_after(signal: impl Future<Output = ()>, readiness: Arc<Readiness>, drain: Duration) {
    signal.await;
    readiness.begin_drain();
    info!(
        drain = ?drain,
        "draining the conversion webhook: not ready, still serving until endpoints drop this replica"
    );
    tokio::time::sleep(drain).await;
}

impl Server {
    /// Serves HTTPS on `listener` until `stop` completes. Then the listener closes (new
    /// connections are refused) and every connection is asked to close gracefully, never
    /// under a request its client may have sent: HTTP/2 gets GOAWAY (the client sends its
    /// next requests elsewhere, the streams in flight finish); an HTTP/1.1 connection
    /// answers its next request with `Connection: close` (from the drain's start on, see
    /// [`Readiness::is_draining`]) and, idle, is left for its client to close, for up to
    /// `idle_grace` of idleness. Requests in flight get `in_flight_deadline`; whatever is
    /// still open after [`Connections::closing_deadline`] is closed.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        stop: impl Future<Output = ()> + Send,
    ) -> std::io::Result<()> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(self.certs)));
        // HTTP/2 first, as the apiserver's client prefers it where it offers it (a loopback
        // URL, from Kubernetes 1.30 on); HTTP/1.1 for other clients, the apiserver's
        // webhook client included (it offers only http/1.1 for any other URL).
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        info!(address = %listener.local_addr()?, "serving the conversion webhook (HTTPS /convert/<policy>)");
        let app = router(
            self.policies,
            self.metrics.clone(),
            self.limits,
            self.readiness.clone(),
        );
        // The protocol is the one ALPN settled on (no ALPN: HTTP/1.1, as RFC 9113 allows
        // HTTP/2 over TLS only through ALPN), never guessed from the first bytes: a
        // connection still guessing when asked to close would be dropped at once.
        let http1 = auto::Builder::new(TokioExecutor::new()).http1_only();
        let http2 = auto::Builder::new(TokioExecutor::new()).http2_only();
        let connections = self.connections;
        // Told to every connection when the server stops.
        let (stopping, stopped) = watch::channel(false);
        let mut open = JoinSet::new();
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let connection = Connection {
                            acceptor: acceptor.clone(),
                            app: app.clone(),
                            http1: http1.clone(),
                            http2: http2.clone(),
                            stopped: stopped.clone(),
                            connections,
                            metrics: self.metrics.clone(),
                            readiness: self.readiness.clone(),
                        };
                        open.spawn(connection.serve(stream, peer));
                    }
                    Err(error) => warn!(error = %error, "accept failed"),
                },
                // Finished connections are reaped as they go.
                Some(_) = open.join_next(), if !open.is_empty() => {}
                () = &mut stop => break,
            }
        }
        drop(listener);
        info!(
            connections = open.len(),
            "the conversion webhook stopped accepting; asking its connections to close (HTTP/2 GOAWAY; HTTP/1.1 Connection: close, idle ones left to their clients)"
        );
        let _ = stopping.send(true);
        let all_closed = async { while open.join_next().await.is_some() {} };
        let deadline = connections.closing_deadline();
        if tokio::time::timeout(deadline, all_closed).await.is_err() {
            warn!(
                connections = open.len(),
                deadline = ?deadline,
                "connections still open at the deadline; closing them"
            );
            open.shutdown().await;
        }
        info!("the conversion webhook stopped");
        Ok(())
    }
}

/// One accepted connection and what it needs to serve itself.
struct Connection {
    acceptor: TlsAcceptor,
    app: Router,
    http1: auto::Builder<TokioExecutor>,
    http2: auto::Builder<TokioExecutor>,
    stopped: watch::Receiver<bool>,
    connections: Connections,
    metrics: Arc<WebhookMetrics>,
    readiness: Arc<Readiness>,
}

/// Counts a connection open while it lives.
struct Open(Arc<WebhookMetrics>);

impl Open {
    fn new(metrics: Arc<WebhookMetrics>) -> Open {
        metrics.open_connections.inc();
        Open(metrics)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open_connections.dec();
    }
}

/// What a connection shares with the service answering its requests.
#[derive(Debug)]
struct Activity {
    /// Asked to close: HTTP/1.1 answers say `Connection: close`.
    closing: AtomicBool,
    /// Requests whose answer is not completely written yet.
    in_flight: AtomicUsize,
    /// When the connection last became idle (opened, or an answer written).
    idle_since: std::sync::Mutex<tokio::time::Instant>,
    /// Told when an answer has been written.
    answered: Notify,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            closing: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            idle_since: std::sync::Mutex::new(tokio::time::Instant::now()),
            answered: Notify::new(),
        }
    }

    /// Completes once no request is in flight and none has been for `grace`.
    async fn idle_for(&self, grace: Duration) {
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
struct Answer {
    router: TowerToHyperService<Router>,
    activity: Arc<Activity>,
    readiness: Arc<Readiness>,
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

impl Connection {
    async fn serve(mut self, stream: tokio::net::TcpStream, peer: SocketAddr) {
        let _open = Open::new(self.metrics.clone());
        // A handshake under way when the server stops is finished, not dropped: its client
        // dialled to send a request, which it gets answered (and is then asked to close).
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(stream)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                debug!(%peer, error = %error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                debug!(%peer, "TLS handshake not done within {HANDSHAKE_TIMEOUT:?}");
                return;
            }
        };
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        debug!(%peer, protocol = if h2 { "h2" } else { "http/1.1" }, "connection opened");
        let activity = Arc::new(Activity::new());
        let answer = Answer {
            router: TowerToHyperService::new(self.app.clone()),
            activity: activity.clone(),
            readiness: self.readiness.clone(),
        };
        let builder = if h2 { &self.http2 } else { &self.http1 };
        let connection = builder.serve_connection(TokioIo::new(tls), answer);
        let mut connection = std::pin::pin!(connection);
        let max_age = self.connections.max_age.map(|age| jittered(age, peer));
        let in_flight_deadline = self.connections.in_flight_deadline;
        let mut timer = if max_age.is_some() { Timer::Age } else { Timer::Off };
        let mut deadline = std::pin::pin!(tokio::time::sleep(max_age.unwrap_or_default()));
        let mut stopped = false;
        let mut idle_closed = false;
        loop {
            let closing = activity.closing.load(Ordering::SeqCst);
            tokio::select! {
                served = connection.as_mut() => {
                    match served {
                        Ok(()) => debug!(%peer, closing, "connection closed"),
                        Err(error) => debug!(%peer, error = %error, "connection ended with an error"),
                    }
                    return;
                }
                () = deadline.as_mut(), if timer != Timer::Off => match timer {
                    Timer::Age => {
                        debug!(%peer, "connection reached its maximum age; asking the client to reconnect");
                        self.metrics.connections_aged_out.inc();
                        activity.closing.store(true, Ordering::SeqCst);
                        timer = Timer::Off;
                        if h2 {
                            connection.as_mut().graceful_shutdown();
                            timer = Timer::CutOff;
                            deadline.as_mut().reset(tokio::time::Instant::now() + in_flight_deadline);
                        }
                    }
                    Timer::CutOff => {
                        // HTTP/2 after GOAWAY: open only for its streams in flight.
                        if h2 || activity.in_flight.load(Ordering::SeqCst) > 0 {
                            debug!(%peer, deadline = ?in_flight_deadline, "requests still in flight past their deadline; closing the connection");
                            return;
                        }
                        timer = Timer::Off;
                    }
                    Timer::Off => {}
                },
                () = stopping(&mut self.stopped), if !stopped => {
                    stopped = true;
                    if !closing {
                        activity.closing.store(true, Ordering::SeqCst);
                        if h2 {
                            connection.as_mut().graceful_shutdown();
                        }
                    }
                    // Requests in flight get their deadline (HTTP/2 past its age has one
                    // already); the server bounds the rest of the wait.
                    if timer != Timer::CutOff {
                        timer = Timer::CutOff;
                        deadline.as_mut().reset(tokio::time::Instant::now() + in_flight_deadline);
                    }
                }
                // An HTTP/1.1 connection asked to close closes after its next answer; one
                // its client leaves idle is closed only when no client would still use it.
                () = activity.idle_for(self.connections.idle_grace), if !h2 && closing && !idle_closed => {
                    debug!(%peer, grace = ?self.connections.idle_grace, "closing an HTTP/1.1 connection idle past its grace");
                    idle_closed = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// What a connection's timer is set for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// Its maximum age.
    Age,
    /// The deadline of its requests in flight (after GOAWAY, or once the server stopped).
    CutOff,
    Off,
}

/// Completes once the server stops.
async fn stopping(stopped: &mut watch::Receiver<bool>) {
    // An error: the server is gone, which is a stop too.
    let _ = stopped.wait_for(|stopped| *stopped).await;
}

/// `age` give or take a tenth, different for every connection.
fn jittered(age: Duration, peer: SocketAddr) -> Duration {
    use std::hash::BuildHasher;
    let random = std::collections::hash_map::RandomState::new().hash_one((peer, std::time::Instant::now()));
    // A factor in [0.9, 1.1).
    let factor = 0.9 + (random % 2_000) as f64 / 10_000.0;
    age.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_drain_reports_not_ready_at_the_signal_and_ends_after_its_period() {
        let readiness = Arc::new(Readiness::ready());
        let (signal, signalled) = tokio::sync::oneshot::channel::<()>();
        let drain = tokio::spawn(drain_after(
            async {
                let _ = signalled.await;
            },
            readiness.clone(),
            Duration::from_secs(10),
        ));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(readiness.check(), Ok(()), "ready until the signal");
        assert!(!drain.is_finished());
        let signalled_at = tokio::time::Instant::now();
        let _ = signal.send(());
        tokio::task::yield_now().await;
        assert!(readiness.is_draining(), "not ready at once");
        tokio::time::sleep(Duration::from_millis(9_999)).await;
        assert!(!drain.is_finished(), "still serving during the drain");
        drain.await.expect("drained");
        assert_eq!(signalled_at.elapsed(), Duration::from_secs(10));
    }

    #[test]
    fn connection_ages_vary_by_a_tenth_at_most() {
        let age = Duration::from_secs(300);
        let peer: SocketAddr = ([10, 0, 0, 1], 44_123).into();
        let ages: Vec<Duration> = (0..200).map(|_| jittered(age, peer)).collect();
        assert!(
            ages.iter()
                .all(|a| *a >= age.mul_f64(0.9) && *a < age.mul_f64(1.1))
        );
        assert!(ages.iter().any(|a| *a != ages[0]), "not all the same");
    }

    #[test]
    fn connections_from_flags() {
        let connections = Connections::new(Duration::from_secs(7), Duration::ZERO, DEFAULT_IDLE_GRACE);
        assert_eq!(connections.max_age, None, "0s: connections never age out");
        assert_eq!(connections.drain, Duration::from_secs(7));
        assert_eq!(connections.in_flight_deadline, DEFAULT_IN_FLIGHT_DEADLINE);
        assert_eq!(connections.idle_grace, Duration::from_secs(100));
        assert_eq!(connections.closing_deadline(), Duration::from_secs(115));
        let aged = Connections::new(Duration::ZERO, Duration::from_secs(60), Duration::ZERO);
        assert_eq!(aged.max_age, Some(Duration::from_secs(60)));
        assert_eq!(aged.closing_deadline(), DEFAULT_IN_FLIGHT_DEADLINE);
    }
}
