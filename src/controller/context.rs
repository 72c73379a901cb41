//! What every reconcile shares, and reading the governed CRD.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, GetParams};
use kube::core::DeserializeGuard;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use tracing::debug;

use super::crds_seen::CrdsSeen;
use super::error::Error;
use super::metrics::Metrics;
use super::migrations::Migrations;
use super::patches_first::PatchesFirst;
use super::traffic::TrafficMonitor;
use super::triggers::LastReconciles;
use super::writer_reads::WriterReads;
use crate::api::VersionPolicy;
use crate::webhook::ca::WebhookEndpoint;

use crate::clock::Clock;

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// The controller's cache of VersionPolicies, to find policies competing for a CRD.
    pub policies: Store<DeserializeGuard<VersionPolicy>>,
    pub clock: Clock,
    /// Reconcile at least this often even when nothing is scheduled.
    pub resync: Duration,
    /// The storage-version migrations running in the background.
    pub migrations: Arc<Migrations>,
    /// Samples the apiserver's request counters for traffic gates.
    pub traffic: Arc<TrafficMonitor>,
    /// Reads the objects' managedFields for writers gates, in the background.
    pub writers: Arc<WriterReads>,
    /// The conversion webhook this controller serves, if any.
    pub webhook: Option<Arc<WebhookEndpoint>>,
    /// What each policy's last reconcile acted on and wrote (`triggers::LastReconciles`).
    pub last_reconciles: Arc<LastReconciles>,
    /// Reconciles on their way to a CRD patch, whose landing the others' Events and status
    /// writes wait for (`patches_first`).
    pub patches_first: Arc<PatchesFirst>,
    /// The resourceVersions of CRDs this process saw (`crds_seen`).
    pub crds_seen: Arc<CrdsSeen>,
}

impl Context {
    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }
}

/// The CRD as it is now: a quorum read (etcd).
pub async fn get_crd(ctx: &Context, name: &str) -> Result<Option<CustomResourceDefinition>, Error> {
    let ticket = ctx.crds_seen.ticket();
    let crd = quorum_read(ctx, name).await?;
    if let Some(crd) = &crd {
        ctx.crds_seen.refresh(crd, ticket);
    }
    Ok(crd)
}

/// A quorum read; a CRD that is gone is forgotten (`CrdsSeen::forget`).
async fn quorum_read(ctx: &Context, name: &str) -> Result<Option<CustomResourceDefinition>, Error> {
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    let crd = api.get_opt(name).await?;
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
/// `get_crd`. Without a version seen, or when the cache cannot answer (a 504 after 3 s
/// behind), a quorum read.
pub async fn get_crd_seen(ctx: &Context, name: &str) -> Result<Option<Arc<CustomResourceDefinition>>, Error> {
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
