//! The requests of a migration, sent raw so that status codes, `Retry-After` and non-JSON
//! bodies are seen exactly as the apiserver sends them. Every request waits for the rate
//! limiter and is bounded by a timeout: a hung connection answers `Answer::Transport`, which
//! the caller retries, instead of holding a worker slot forever.

use std::time::Duration;

use backon::Retryable;
use governor::DefaultDirectRateLimiter;
use http::{HeaderMap, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::Client;
use kube::api::{ListParams, Patch, PatchParams};
use kube::client::Body;
use kube::core::{DynamicObject, ObjectList, PartialObjectMeta};
use serde_json::{Value, json};

use super::settings::RetryPolicy;
use super::target::Target;

/// The `Accept` of a write whose answer is not read: the object's metadata, or (from an
/// apiserver that cannot answer so) the whole object.
const METADATA_ONLY_ANSWER: &str =
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

/// One object to process, as listed (metadata only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectKey {
    pub namespace: Option<String>,
    pub name: String,
    pub resource_version: String,
    /// Its `metadata.managedFields` (JSON), when a managedFields cleanup asked for them.
    pub managed_fields: Vec<Value>,
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
pub(super) async fn retried<T, F, Fut>(retry: &RetryPolicy, what: &str, request: F) -> Result<T, Answer>
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

impl<'a> Requester<'a> {
    /// A requester without a rate limit, for the few requests outside a run.
    pub fn unthrottled(client: &'a Client, timeout: Duration) -> Self {
        Requester {
            client,
            limiter: None,
            timeout,
        }
    }
}

/// What discovery (`GET /apis/<group>/<version>`) says of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovered {
    /// The group version is served but does not list the resource, or is not served at all.
    Absent,
    /// The resource is served; its `storageVersionHash`, if the apiserver gives one
    /// (samples 25, 26).
    Served { storage_version_hash: Option<String> },
}

/// Sends a migration's requests: throttled, each bounded by `timeout`.
#[derive(Clone, Copy)]
pub struct Requester<'a> {
    pub client: &'a Client,
    pub limiter: Option<&'a DefaultDirectRateLimiter>,
    pub timeout: Duration,
}

impl Requester<'_> {
    /// Lists one page of objects (metadata only: `PartialObjectMetadataList`, samples 09-10).
    pub async fn list_page(
        &self,
        target: &Target,
        page_size: u32,
        token: Option<&str>,
        with_managed_fields: bool,
    ) -> Result<Page, Answer> {
        self.list_page_at(&target.list_path(), page_size, token, with_managed_fields)
            .await
    }

    /// Lists one page of the collection at `path` (metadata only).
    pub(super) async fn list_page_at(
        &self,
        path: &str,
        page_size: u32,
        token: Option<&str>,
        with_managed_fields: bool,
    ) -> Result<Page, Answer> {
        let mut params = ListParams::default().limit(page_size);
        if let Some(token) = token {
            params = params.continue_token(token);
        }
        let request = kube::core::Request::new(path)
            .list_metadata(&params)
            .map_err(|e| Answer::Transport(e.to_string()))?;
        let bytes = self.send(request).await?;
        let list: ObjectList<PartialObjectMeta<DynamicObject>> = serde_json::from_slice(&bytes)
            .map_err(|e| Answer::Transport(format!("cannot decode the list: {e}")))?;
        let objects = list
            .items
            .into_iter()
            .map(|item| ObjectKey {
                managed_fields: match (with_managed_fields, &item.metadata.managed_fields) {
                    (true, Some(entries)) => entries
                        .iter()
                        .filter_map(|e| serde_json::to_value(e).ok())
                        .collect(),
                    _ => Vec::new(),
                },
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

    /// How many objects there are: a list of full objects with `limit=1` carries
    /// `remainingItemCount`, which limited metadata-only lists do not (sample 30).
    /// `None` when the apiserver gives no count.
    pub async fn count(&self, target: &Target) -> Result<Option<u64>, Answer> {
        let request = kube::core::Request::new(target.list_path())
            .list(&ListParams::default().limit(1))
            .map_err(|e| Answer::Transport(e.to_string()))?;
        let bytes = self.send(request).await?;
        let list: Value = serde_json::from_slice(&bytes)
            .map_err(|e| Answer::Transport(format!("cannot decode the list: {e}")))?;
        let items = list["items"].as_array().map_or(0, Vec::len) as u64;
        let more = list["metadata"]["continue"]
            .as_str()
            .is_some_and(|t| !t.is_empty());
        Ok(match list["metadata"]["remainingItemCount"].as_u64() {
            Some(remaining) => Some(items + remaining),
            None if !more => Some(items),
            None => None,
        })
    }

    /// What discovery of `group/version` says of `plural`.
    /// Whether the CRD still exists (a GET: 404 is `false`).
    pub async fn crd_exists(&self, name: &str) -> Result<bool, Answer> {
        let request = http::Request::get(format!(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        ))
        .body(Vec::new())
        .map_err(|e| Answer::Transport(e.to_string()))?;
        match self.send(request).await {
            Ok(_) => Ok(true),
            Err(Answer::Status { code: 404, .. }) => Ok(false),
            Err(answer) => Err(answer),
        }
    }

    pub async fn discover(&self, group: &str, version: &str, plural: &str) -> Result<Discovered, Answer> {
        let request = http::Request::get(format!("/apis/{group}/{version}"))
            .body(Vec::new())
            .map_err(|e| Answer::Transport(e.to_string()))?;
        let bytes = match self.send(request).await {
            Ok(bytes) => bytes,
            // A group version nobody serves yet.
            Err(Answer::Status { code: 404, .. }) => return Ok(Discovered::Absent),
            Err(answer) => return Err(answer),
        };
        let list: APIResourceList = serde_json::from_slice(&bytes)
            .map_err(|e| Answer::Transport(format!("cannot decode discovery: {e}")))?;
        Ok(list
            .resources
            .into_iter()
            .find(|r| r.name == plural)
            .map_or(Discovered::Absent, |r| Discovered::Served {
                storage_version_hash: r.storage_version_hash.filter(|h| !h.is_empty()),
            }))
    }

    /// Rewrites one object through the storage version: a merge patch carrying only its
    /// resourceVersion changes nothing, but makes the apiserver decode the object and encode
    /// it again in the storage version (apiserver-samples/11); the resourceVersion is a
    /// precondition, so an object written since it was listed answers 409 (12). The answer
    /// is asked for as metadata only (tests/fixtures/rewrite-metadata-only-answer.txt): the
    /// apiserver then encodes no spec or status for a reply nobody reads. `application/json`
    /// after it: an apiserver that cannot answer so answers the whole object.
    pub async fn rewrite(&self, target: &Target, object: &ObjectKey) -> Answer {
        let patch = json!({"metadata": {"resourceVersion": object.resource_version}});
        let collection = kube::core::Request::new(target.collection_path(object.namespace.as_deref()));
        let params = PatchParams::default();
        let request = match target.subresource.as_deref() {
            Some(subresource) => {
                collection.patch_subresource(subresource, &object.name, &params, &Patch::Merge(&patch))
            }
            None => collection.patch(&object.name, &params, &Patch::Merge(&patch)),
        };
        self.answer(request.map(|mut request| {
            request.headers_mut().insert(
                http::header::ACCEPT,
                http::HeaderValue::from_static(METADATA_ONLY_ANSWER),
            );
            request
        }))
        .await
    }

    /// Replaces the object's `metadata.managedFields` with `entries`, guarded by a `test` of
    /// the resourceVersion it was read at (a JSON Patch of managedFields repairs an object,
    /// apiserver-samples/29).
    pub async fn replace_managed_fields(
        &self,
        target: &Target,
        object: &ObjectKey,
        resource_version: &str,
        entries: &[Value],
    ) -> Answer {
        let ops: json_patch::Patch = match serde_json::from_value(json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            {"op": "replace", "path": "/metadata/managedFields", "value": entries},
        ])) {
            Ok(ops) => ops,
            Err(e) => return Answer::Transport(e.to_string()),
        };
        let request = kube::core::Request::new(target.collection_path(object.namespace.as_deref())).patch(
            &object.name,
            &PatchParams::default(),
            &Patch::<()>::Json(ops),
        );
        self.answer(request).await
    }

    /// The whole object, read through the target's version.
    pub async fn object(&self, target: &Target, object: &ObjectKey) -> Result<Value, Answer> {
        let request = kube::core::Request::new(target.collection_path(object.namespace.as_deref()))
            .get(&object.name, &Default::default())
            .map_err(|e| Answer::Transport(e.to_string()))?;
        serde_json::from_slice(&self.send(request).await?)
            .map_err(|e| Answer::Transport(format!("cannot decode {object}: {e}")))
    }

    /// The object's resourceVersion and managedFields, read again.
    pub async fn managed_fields(
        &self,
        target: &Target,
        object: &ObjectKey,
    ) -> Result<(String, Vec<Value>), Answer> {
        let body = self.object(target, object).await?;
        let resource_version = body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let entries = body["metadata"]["managedFields"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok((resource_version, entries))
    }

    /// Reads one object through the storage version, which runs its conversion (a
    /// conversion preflight); writes nothing.
    pub async fn read(&self, target: &Target, object: &ObjectKey) -> Answer {
        let request = kube::core::Request::new(target.collection_path(object.namespace.as_deref()))
            .get(&object.name, &Default::default());
        self.answer(request).await
    }

    async fn answer(&self, request: Result<http::Request<Vec<u8>>, kube::core::request::Error>) -> Answer {
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
    async fn send(&self, request: http::Request<Vec<u8>>) -> Result<bytes::Bytes, Answer> {
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

fn error_answer(code: StatusCode, body: &[u8], retry_after: Option<Duration>) -> Answer {
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
