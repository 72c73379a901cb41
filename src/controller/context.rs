//! What every reconcile shares, and reading the governed CRD.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;

use super::conversion_config::WebhookEndpoint;
use super::error::Error;
use super::metrics::Metrics;
use super::migrations::Migrations;
use super::patches_first::PatchesFirst;
use super::traffic::TrafficMonitor;
use super::triggers::LastReconciles;
use super::writer_reads::WriterReads;
use crate::api::VersionPolicy;

pub use super::clock::Clock;

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
}

impl Context {
    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }
}

pub async fn get_crd(ctx: &Context, name: &str) -> Result<Option<CustomResourceDefinition>, Error> {
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    Ok(api.get_opt(name).await?)
}
