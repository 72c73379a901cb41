//! The CRD a migration is for, read with kube's typed client (each request bounded by the
//! request timeout and retried while it fails transiently), as a `Target`.

use std::future::Future;

use backon::Retryable;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use tracing::warn;

use super::apiserver_clock;
use super::{Error, Mode, Settings, Target};

/// Runs a request to the apiserver made with kube's typed API: bounded by the request
/// timeout, retried while it fails transiently.
pub(super) async fn kube_request<T, F, Fut>(settings: &Settings, what: &str, request: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut request = request;
    let timeout = settings.request_timeout;
    let bounded = || {
        let pending = request();
        async move {
            tokio::time::timeout(timeout, pending)
                .await
                .map_err(|_| Error::Timeout {
                    what: what.to_owned(),
                    after: timeout,
                })?
                .map_err(Error::from)
        }
    };
    bounded
        .retry(settings.retry.backoff())
        .sleep(tokio::time::sleep)
        .when(Error::is_transient)
        .notify(|error, wait| warn!(error = %error, "{what} failed; retrying in {wait:?}"))
        .await
}

/// The CRD, and the apiserver's clock when it was read.
pub(super) async fn read_crd(
    client: &Client,
    crd_name: &str,
    settings: &Settings,
) -> Result<apiserver_clock::Dated<CustomResourceDefinition>, Error> {
    let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd_name}");
    kube_request(
        settings,
        &format!("reading CustomResourceDefinition {crd_name}"),
        || apiserver_clock::get(client, &path),
    )
    .await?
    .ok_or_else(|| Error::CrdNotFound(crd_name.to_owned()))
}

/// The CRD as it is now, as a target through its storage version.
pub(super) async fn read_current(
    client: &Client,
    crd_name: &str,
    settings: &Settings,
) -> Result<Target, Error> {
    let read = read_crd(client, crd_name, settings).await?;
    let mut target = Target::from_crd(&read.value).map_err(|reason| Error::Unmigratable {
        crd: crd_name.to_owned(),
        reason,
    })?;
    target.read_at = read.date;
    Ok(target)
}

pub(super) async fn read_target(
    client: &Client,
    crd_name: &str,
    through: Option<&str>,
    settings: &Settings,
) -> Result<Target, Error> {
    let read = read_crd(client, crd_name, settings).await?;
    let crd = &read.value;
    let unmigratable = |reason| Error::Unmigratable {
        crd: crd_name.to_owned(),
        reason,
    };
    let mut target = Target::from_crd(crd).map_err(unmigratable)?;
    target.read_at = read.date;
    if settings.through_status && settings.mode == Mode::Rewrite {
        target = target.through_status(crd).map_err(unmigratable)?;
    }
    match through {
        Some(version) => target.through(crd, version).map_err(unmigratable),
        None => Ok(target),
    }
}
