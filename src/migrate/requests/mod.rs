//! The requests of a migration, sent raw so that status codes, `Retry-After` and non-JSON
//! bodies are seen exactly as the apiserver sends them. Every request waits for the rate
//! limiter and is bounded by a timeout: a hung connection answers `Answer::Transport`, which
//! the caller retries, instead of holding a worker slot forever.
//!
//! - `answer`: how a request ended (`Answer`), read from the status and body, and the
//!   retries of the transient ones;
//! - `reads`: pages of a metadata-only list, a count, discovery, one object;
//! - `writes`: an object's rewrite, its managedFields replaced.

mod answer;
mod reads;
mod writes;

use std::time::Duration;

use governor::DefaultDirectRateLimiter;
use kube::Client;
use kube::client::Body;

pub use answer::Answer;
pub(super) use answer::retried;
pub use reads::{Discovered, ObjectKey, Page};

use answer::{error_answer, retry_after};

/// Sends a migration's requests: throttled, each bounded by `timeout`.
#[derive(Clone, Copy)]
pub struct Requester<'a> {
    pub client: &'a Client,
    pub limiter: Option<&'a DefaultDirectRateLimiter>,
    pub timeout: Duration,
}

impl<'a> Requester<'a> {
    /// A run's requester: at most `limiter`'s rate (none without one), each request cut off
    /// at `timeout`.
    pub fn throttled(
        client: &'a Client,
        limiter: Option<&'a DefaultDirectRateLimiter>,
        timeout: Duration,
    ) -> Self {
        Requester {
            client,
            limiter,
            timeout,
        }
    }

    /// A requester without a rate limit, for the few requests outside a run.
    pub fn unthrottled(client: &'a Client, timeout: Duration) -> Self {
        Self::throttled(client, None, timeout)
    }
}

impl Requester<'_> {
    /// Sends a request as kube built it (or says why it could not be built) and says how it
    /// ended; the body of a 2xx answer is not read.
    pub(super) async fn answer(
        &self,
        request: Result<http::Request<Vec<u8>>, kube::core::request::Error>,
    ) -> Answer {
        match request {
            Ok(request) => self
                .send(request)
                .await
                .map_or_else(|answer| answer, |_| Answer::Ok),
            Err(e) => Answer::Transport(e.to_string()),
        }
    }

    /// Waits for the rate limiter, sends a request and returns the body of a 2xx answer;
    /// no answer (headers and body) within the timeout is `Answer::Transport`.
    pub(super) async fn send(&self, request: http::Request<Vec<u8>>) -> Result<bytes::Bytes, Answer> {
        if let Some(limiter) = self.limiter {
            limiter.until_ready().await;
        }
        let exchange = async {
            let response = self
                .client
                .send(request.map(Body::from))
                .await
                .map_err(|e| Answer::Transport(e.to_string()))?;
            let code = response.status();
            let retry_after = retry_after(response.headers());
            let body = response
                .into_body()
                .collect_bytes()
                .await
                .map_err(|e| Answer::Transport(format!("reading the response: {e}")))?;
            if code.is_success() {
                return Ok(body);
            }
            Err(error_answer(code, &body, retry_after))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(result) => result,
            Err(_) => Err(Answer::Transport(format!(
                "no answer within {:?} (timed out)",
                self.timeout
            ))),
        }
    }
}
