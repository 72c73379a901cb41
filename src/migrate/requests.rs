//! The requests of a migration, sent raw so that status codes, `Retry-After` and non-JSON
//! bodies are seen exactly as the apiserver sends them.

use std::time::Duration;

use http::{HeaderMap, StatusCode};
use kube::Client;
use kube::api::{ListParams, Patch, PatchParams};
use kube::client::Body;
use kube::core::{DynamicObject, ObjectList, PartialObjectMeta, Status};
use serde_json::json;

use super::target::Target;

/// One object to process, as listed (metadata only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectKey {
    pub namespace: Option<String>,
    pub name: String,
    pub resource_version: String,
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// One page of a metadata-only list.
#[derive(Debug)]
pub struct Page {
    pub objects: Vec<ObjectKey>,
    pub next: Option<String>,
    pub remaining: Option<u64>,
}

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
    },
    /// No answer: connection failure, reset, timeout.
    Transport(String),
}

/// Lists one page of objects (metadata only: `PartialObjectMetadataList`, samples 09-10).
pub async fn list_page(
    client: &Client,
    target: &Target,
    page_size: u32,
    token: Option<&str>,
) -> Result<Page, Answer> {
    let mut params = ListParams::default().limit(page_size);
    if let Some(token) = token {
        params = params.continue_token(token);
    }
    let request = kube::core::Request::new(target.list_path())
        .list_metadata(&params)
        .map_err(|e| Answer::Transport(e.to_string()))?;
    let bytes = send(client, request).await?;
    let list: ObjectList<PartialObjectMeta<DynamicObject>> = serde_json::from_slice(&bytes)
        .map_err(|e| Answer::Transport(format!("cannot decode the list: {e}")))?;
    let objects = list
        .items
        .into_iter()
        .map(|item| ObjectKey {
            namespace: item.metadata.namespace,
            name: item.metadata.name.unwrap_or_default(),
            resource_version: item.metadata.resource_version.unwrap_or_default(),
        })
        .collect();
    Ok(Page {
        objects,
        next: list.metadata.continue_.filter(|t| !t.is_empty()),
        remaining: list
            .metadata
            .remaining_item_count
            .and_then(|n| u64::try_from(n).ok()),
    })
}

/// Rewrites one object through the storage version: a merge patch carrying only its
/// resourceVersion changes nothing, but makes the apiserver decode the object and encode
/// it again in the storage version (apiserver-samples/11); the resourceVersion is a
/// precondition, so an object written since it was listed answers 409 (12).
pub async fn rewrite(client: &Client, target: &Target, object: &ObjectKey) -> Answer {
    let patch = json!({"metadata": {"resourceVersion": object.resource_version}});
    let request = kube::core::Request::new(target.collection_path(object.namespace.as_deref())).patch(
        &object.name,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    );
    match request {
        Ok(request) => send(client, request)
            .await
            .map_or_else(|answer| answer, |_| Answer::Ok),
        Err(e) => Answer::Transport(e.to_string()),
    }
}

/// Reads one object through the storage version, which runs its conversion (a conversion
/// preflight); writes nothing.
pub async fn read(client: &Client, target: &Target, object: &ObjectKey) -> Answer {
    let request = kube::core::Request::new(target.collection_path(object.namespace.as_deref()))
        .get(&object.name, &Default::default());
    match request {
        Ok(request) => send(client, request)
            .await
            .map_or_else(|answer| answer, |_| Answer::Ok),
        Err(e) => Answer::Transport(e.to_string()),
    }
}

/// Sends a request and returns the body of a 2xx answer.
async fn send(client: &Client, request: http::Request<Vec<u8>>) -> Result<bytes::Bytes, Answer> {
    let response = client
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
}

fn error_answer(code: StatusCode, body: &[u8], retry_after: Option<Duration>) -> Answer {
    match serde_json::from_slice::<Status>(body) {
        Ok(status) if !status.message.is_empty() || !status.reason.is_empty() => Answer::Status {
            code: code.as_u16(),
            reason: status.reason,
            message: status.message,
            retry_after,
            is_status_object: true,
        },
        _ => Answer::Status {
            code: code.as_u16(),
            reason: code.canonical_reason().unwrap_or_default().to_owned(),
            message: String::from_utf8_lossy(body).trim().to_owned(),
            retry_after,
            is_status_object: false,
        },
    }
}

/// `Retry-After` in seconds (the form the apiserver uses), capped at a minute.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
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
            ..
        } = error_answer(StatusCode::NOT_FOUND, body, None)
        else {
            panic!("status")
        };
        assert_eq!((reason.as_str(), is_status_object), ("NotFound", true));
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
