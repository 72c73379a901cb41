//! The read step: the governed CRD, as fresh as the step after it needs. Each function's
//! name says how fresh its answer is; both keep what they read in [`CrdsSeen`], the one
//! record of the CRDs this process saw.
//!
//! [`CrdsSeen`]: crate::controller::CrdsSeen

use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, GetParams};
use tracing::debug;

use crate::controller::Context;

/// Reading the governed CRD failed.
#[derive(Debug, thiserror::Error)]
#[error("reading CustomResourceDefinition {crd} failed: {source}")]
pub struct ReadError {
    /// The CRD's name.
    pub crd: String,
    #[source]
    pub source: kube::Error,
}

/// The CRD as it is now: a quorum read (etcd). `None`: it does not exist.
pub async fn from_etcd(ctx: &Context, name: &str) -> Result<Option<CustomResourceDefinition>, ReadError> {
    let ticket = ctx.crds_seen.ticket();
    let crd = quorum_read(ctx, name).await?;
    if let Some(crd) = &crd {
        ctx.crds_seen.refresh(crd, ticket);
    }
    Ok(crd)
}

/// A quorum read; a CRD that is gone is forgotten (`CrdsSeen::forget`).
async fn quorum_read(ctx: &Context, name: &str) -> Result<Option<CustomResourceDefinition>, ReadError> {
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    let crd = api.get_opt(name).await.map_err(|source| ReadError {
        crd: name.to_owned(),
        source,
    })?;
    if crd.is_none() {
        ctx.crds_seen.forget(name);
    }
    Ok(crd)
}

/// The CRD at least as new as this process last saw it (its watch event, its last read or
/// the answer to its own patch): the CRD as kept from that read or patch when nothing newer
/// was seen since (no request: 1,000 policies due at the same instant each make one request,
/// their patch, as a raw client would), else from the apiserver's watch cache (a
/// `resourceVersion` on a GET means "not older than" and spares etcd a read). Only for a
/// read whose decision lands through a patch guarded by the resourceVersion
/// (`patch::crd_patch`): a newer state makes that patch fail and the caller reads again with
/// [`from_etcd`]. Without a version seen, or when the cache cannot answer (a 504 after 3 s
/// behind), a quorum read.
pub async fn at_least_as_new_as_seen(
    ctx: &Context,
    name: &str,
) -> Result<Option<Arc<CustomResourceDefinition>>, ReadError> {
    if let Some(crd) = ctx.crds_seen.kept(name) {
        return Ok(Some(Arc::new(crd)));
    }
    let ticket = ctx.crds_seen.ticket();
    let crd = match ctx.crds_seen.get(name) {
        Some(seen) => {
            let api: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
            match api.get_with(name, &GetParams::at(&seen)).await {
                Ok(crd) => Some(crd),
                Err(error) => {
                    debug!(crd = name, error = %error, "the watch cache did not answer; reading from etcd");
                    quorum_read(ctx, name).await?
                }
            }
        }
        None => quorum_read(ctx, name).await?,
    };
    if let Some(crd) = &crd {
        ctx.crds_seen.keep(crd, ticket);
    }
    Ok(crd.map(Arc::new))
}
