//! Reads that also say what time it is on the apiserver: the `date` header every answer
//! carries (tests/fixtures/apiserver/crd-get-date-header.txt). The apiserver's own timestamps
//! (managedFields `time`, `creationTimestamp`, condition times) are compared with it, never
//! with this machine's clock, which may be skewed by any amount.

use jiff::Timestamp;
use kube::Client;
use kube::client::Body;
use kube::core::Status;
use serde::de::DeserializeOwned;

/// An answer and the apiserver's clock when it gave it.
#[derive(Clone, Debug)]
pub(crate) struct Dated<T> {
    pub(crate) value: T,
    /// The answer's `date` header; `None` if it had none (or an unreadable one).
    pub(crate) date: Option<Timestamp>,
}

/// GET `path`: `None` for a 404 whose body is a `Status` (the object does not exist), an
/// `Error::Api` for any other failure, as kube's typed API reports them.
pub(crate) async fn get<T: DeserializeOwned>(
    client: &Client,
    path: &str,
) -> Result<Option<Dated<T>>, kube::Error> {
    let request = http::Request::get(path)
        .body(Body::empty())
        .map_err(kube::Error::HttpError)?;
    let response = client.send(request).await?;
    let code = response.status();
    let date = response
        .headers()
        .get(http::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_http_date);
    let bytes = response.into_body().collect_bytes().await?;
    if code.is_client_error() || code.is_server_error() {
        let status = match serde_json::from_slice::<Status>(&bytes) {
            Ok(status) if code.as_u16() == 404 && status.code == 404 => return Ok(None),
            Ok(status) => status,
            Err(_) => Status::failure(
                String::from_utf8_lossy(&bytes).trim(),
                "Failed to parse error data",
            )
            .with_code(code.as_u16()),
        };
        return Err(kube::Error::Api(status.boxed()));
    }
    let value = serde_json::from_slice(&bytes).map_err(kube::Error::SerdeError)?;
    Ok(Some(Dated { value, date }))
}

/// An HTTP `date` (RFC 9110 IMF-fixdate, `Wed, 25 Nov 2026 19:19:54 GMT`).
pub(crate) fn parse_http_date(text: &str) -> Option<Timestamp> {
    jiff::fmt::rfc2822::DateTimeParser::new()
        .parse_timestamp(text)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_recorded_date() {
        // tests/fixtures/apiserver/crd-get-date-header.txt
        assert_eq!(
            parse_http_date("Wed, 25 Nov 2026 19:19:54 GMT"),
            Some("2026-11-25T19:19:54Z".parse().expect("instant"))
        );
        assert_eq!(parse_http_date("yesterday"), None);
    }
}
