//! How a request ended (`Answer`): 2xx, the apiserver's error status as it sent it
//! (`Retry-After`, a non-JSON body, a 410's fresh continue token), or no answer; and the
//! retries of those that may succeed later.

use std::time::Duration;

use backon::Retryable;
use http::{HeaderMap, StatusCode};
use serde_json::Value;

use crate::migrate::settings::RetryPolicy;

/// How a request ended.
#[derive(Debug)]
pub enum Answer {
    /// 2xx.
    Ok,
    /// The apiserver answered with an error status.
    Status {
        code: u16,
        reason: String,
        message: String,
        /// `Retry-After`, when given.
        retry_after: Option<Duration>,
        /// Whether the body was a Kubernetes `Status` (a plain-text 404 means the path is
        /// not served at all, apiserver-samples/15).
        is_status_object: bool,
        /// `metadata.continue` of the Status: a 410 for an expired continue token carries
        /// a fresh token that goes on from where the list stopped (samples 27, 28).
        continue_token: Option<String>,
    },
    /// No answer: connection failure, reset, timeout.
    Transport(String),
}

impl Answer {
    /// Worth asking again: no answer, 429, or 5xx (which may also be a conversion webhook
    /// failing for good: the retries are bounded).
    pub fn is_transient(&self) -> bool {
        match self {
            Answer::Status { code, .. } => *code == 429 || *code >= 500,
            Answer::Transport(_) => true,
            Answer::Ok => false,
        }
    }

    /// The wait the apiserver asked for (`Retry-After`), if any.
    fn asked_wait(&self) -> Option<Duration> {
        match self {
            Answer::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// Sends `request` until it succeeds, fails for good, or `retry` is used up: transient
/// failures (`Answer::is_transient`) are retried with backoff, or after the apiserver's
/// `Retry-After` where it gives one.
pub(in crate::migrate) async fn retried<T, F, Fut>(
    retry: &RetryPolicy,
    what: &str,
    request: F,
) -> Result<T, Answer>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Answer>>,
{
    request
        .retry(retry.backoff())
        .sleep(tokio::time::sleep)
        .when(Answer::is_transient)
        .adjust(|answer, backoff| backoff.map(|wait| answer.asked_wait().unwrap_or(wait)))
        .notify(|answer, wait| tracing::warn!("{what}: {answer}; retrying in {wait:?}"))
        .await
}

impl std::fmt::Display for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Answer::Ok => f.write_str("ok"),
            Answer::Status {
                code,
                reason,
                message,
                ..
            } => write!(f, "{code} {reason}: {message}"),
            Answer::Transport(message) => f.write_str(message),
        }
    }
}

pub(super) fn error_answer(code: StatusCode, body: &[u8], retry_after: Option<Duration>) -> Answer {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    match parsed.filter(|s| s["kind"] == "Status" || s.get("reason").is_some() || s.get("message").is_some())
    {
        Some(status) => Answer::Status {
            code: code.as_u16(),
            reason: status["reason"].as_str().unwrap_or_default().to_owned(),
            message: status["message"].as_str().unwrap_or_default().to_owned(),
            retry_after,
            is_status_object: true,
            continue_token: status["metadata"]["continue"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(str::to_owned),
        },
        None => Answer::Status {
            code: code.as_u16(),
            reason: code.canonical_reason().unwrap_or_default().to_owned(),
            message: String::from_utf8_lossy(body).trim().to_owned(),
            retry_after,
            is_status_object: false,
            continue_token: None,
        },
    }
}

/// `Retry-After` in seconds (the form the apiserver uses), capped at a minute.
pub(super) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds.min(60)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_404_is_not_a_status() {
        // apiserver-samples/15: an unserved version.
        let answer = error_answer(StatusCode::NOT_FOUND, b"404 page not found\n", None);
        let Answer::Status {
            code,
            is_status_object,
            message,
            ..
        } = answer
        else {
            panic!("status")
        };
        assert_eq!(
            (code, is_status_object, message.as_str()),
            (404, false, "404 page not found")
        );
    }

    #[test]
    fn status_bodies_are_parsed() {
        // apiserver-samples/13: deleted object.
        let body = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"widgets.example.com \"gone\" not found","reason":"NotFound","details":{"name":"gone","group":"example.com","kind":"widgets"},"code":404}"#;
        let Answer::Status {
            reason,
            is_status_object,
            continue_token,
            ..
        } = error_answer(StatusCode::NOT_FOUND, body, None)
        else {
            panic!("status")
        };
        assert_eq!(
            (reason.as_str(), is_status_object, continue_token),
            ("NotFound", true, None)
        );
    }

    #[test]
    fn an_expired_token_answer_carries_the_fresh_token() {
        // apiserver-samples/27, verbatim but for the long message.
        let body = br#"{"kind":"Status","apiVersion":"v1","metadata":{"continue":"eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoibnMwL3cyXHUwMDAwIn0"},"status":"Failure","message":"The provided continue parameter is too old to display a consistent list result.","reason":"Expired","code":410}"#;
        let Answer::Status {
            code,
            reason,
            continue_token,
            ..
        } = error_answer(StatusCode::GONE, body, None)
        else {
            panic!("status")
        };
        assert_eq!((code, reason.as_str()), (410, "Expired"));
        assert_eq!(
            continue_token.as_deref(),
            Some("eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoibnMwL3cyXHUwMDAwIn0")
        );
    }

    #[test]
    fn retry_after_seconds() {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, "3".parse().expect("header"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert(
            http::header::RETRY_AFTER,
            "Wed, 21 Oct 2026 07:28:00 GMT".parse().expect("header"),
        );
        assert_eq!(retry_after(&headers), None);
    }
}
