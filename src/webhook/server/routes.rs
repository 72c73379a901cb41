//! The webhook's routes: `POST /convert/<policy>` (a small review answered on the async
//! runtime within a small budget, any other on the blocking pool, large ones a few at a
//! time), `GET /healthz` and `GET /readyz`.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::review_body::{ReadError, read_body};
use crate::webhook::metrics::{ReviewResult, WebhookMetrics};
use crate::webhook::{Limits, Lookup, PolicySource, Readiness};

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

/// `POST /convert/<policy>`, `GET /healthz` and `GET /readyz`; every review is counted in
/// `metrics`.
pub(super) fn router(
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
    let body = match read_review(&state, body, length, &policy, &label, started).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let inline = answer_inline(&state, &body, &policy, &lookup);
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

/// The review's body, or the answer to a review over the size limit (counted a failure) or
/// one whose body could not be read (counted invalid).
async fn read_review(
    state: &WebhookState,
    body: Body,
    length: Option<usize>,
    policy: &str,
    label: &str,
    started: std::time::Instant,
) -> Result<Bytes, Response> {
    let limit = state.limits.max_review_bytes;
    match read_body(body, length, limit).await {
        Ok(body) => Ok(body),
        Err(ReadError::TooLarge { prefix, size }) => {
            warn!(
                policy,
                size, limit, "refused a ConversionReview over the size limit"
            );
            state
                .metrics
                .observe_review(label, ReviewResult::failure, started.elapsed());
            Err(json(
                StatusCode::OK,
                to_json(&crate::webhook::too_large(&prefix, size, limit)),
            ))
        }
        Err(ReadError::Broken(error)) => {
            debug!(policy, error, "the ConversionReview's body could not be read");
            state
                .metrics
                .observe_review(label, ReviewResult::invalid, started.elapsed());
            Err(StatusCode::BAD_REQUEST.into_response())
        }
    }
}

/// A review of at most `INLINE_REVIEW_BYTES` answered on the async runtime within
/// `INLINE_COST`, unless it needs more than that (and the limits allow more): `None` sends
/// it to the blocking pool.
fn answer_inline(
    state: &WebhookState,
    body: &[u8],
    policy: &str,
    lookup: &Lookup,
) -> Option<crate::webhook::Answer> {
    (body.len() <= INLINE_REVIEW_BYTES)
        .then(|| {
            let limits = Limits {
                call_cost: state.limits.call_cost.min(INLINE_COST),
                review_cost: state.limits.review_cost.min(INLINE_COST),
                ..(*state.limits).clone()
            };
            crate::webhook::answer(body, policy, lookup.clone(), &limits)
        })
        .filter(|answer| !answer.over_limit || state.limits.review_cost <= INLINE_COST)
}

/// An answer, serialised.
struct Answered {
    code: u16,
    result: ReviewResult,
    body: Vec<u8>,
}

fn respond(body: &[u8], policy: &str, lookup: Lookup, limits: &Limits) -> Answered {
    Answered::from(crate::webhook::answer(body, policy, lookup, limits))
}

impl From<crate::webhook::Answer> for Answered {
    fn from(answer: crate::webhook::Answer) -> Answered {
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
