//! HTTPS serving with certificates that can be replaced while running (rotation).

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

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
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use super::metrics::{ReviewResult, WebhookMetrics};
use super::{Limits, Lookup, PolicySource};

/// The serving certificate, replaceable at any time.
#[derive(Debug, Default)]
pub struct CertStore {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl CertStore {
    /// Installs a certificate chain and key (PEM).
    pub fn set_pem(&self, cert_pem: &str, key_pem: &str) -> Result<(), String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("invalid certificate PEM: {e}"))?;
        if chain.is_empty() {
            return Err("no certificate in the PEM".to_owned());
        }
        let key =
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("invalid key PEM: {e}"))?;
        let signing_key = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| format!("unsupported key: {e}"))?;
        let certified = Arc::new(CertifiedKey::new(chain, signing_key));
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(certified);
        Ok(())
    }

    pub fn is_ready(&self) -> bool {
        self.current.read().unwrap_or_else(|p| p.into_inner()).is_some()
    }
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

/// `POST /convert/<policy>` and `GET /healthz`; every review is counted in `metrics`.
pub fn router(policies: Arc<dyn PolicySource>, metrics: Arc<WebhookMetrics>, limits: Limits) -> Router {
    let cores = std::thread::available_parallelism().map_or(2, usize::from).max(2);
    Router::new()
        .route("/convert/{policy}", post(convert))
        .route("/healthz", get(|| async { "ok\n" }))
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

/// Serves HTTPS on `address` until `shutdown` completes.
pub async fn serve(
    address: SocketAddr,
    certs: Arc<CertStore>,
    policies: Arc<dyn PolicySource>,
    metrics: Arc<WebhookMetrics>,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Resolver(certs)));
    // HTTP/2 first, as the apiserver's client prefers it; HTTP/1.1 for other clients.
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind(address).await?;
    info!(address = %listener.local_addr()?, "serving the conversion webhook (HTTPS /convert/<policy>)");
    let app = router(policies, metrics, limits);
    let connections = auto::Builder::new(TokioExecutor::new());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(error = %error, "accept failed");
                    continue;
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        let connections = connections.clone();
        tokio::spawn(async move {
            let tls = match acceptor.accept(stream).await {
                Ok(tls) => tls,
                Err(error) => {
                    debug!(%peer, error = %error, "TLS handshake failed");
                    return;
                }
            };
            let served = connections.serve_connection(TokioIo::new(tls), service).await;
            if let Err(error) = served {
                debug!(%peer, error = %error, "connection ended with an error");
            }
        });
    }
}
