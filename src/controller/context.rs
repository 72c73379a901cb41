//! What every reconcile shares, and how it is built (`Context::builder`).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube::Client;
use kube::core::DeserializeGuard;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;

use super::crds_seen::CrdsSeen;
use super::jobs::BackgroundJobs;
use super::metrics::Metrics;
use super::patches_first::PatchesFirst;
use super::traffic::TrafficMonitor;
use super::watch::triggers::LastReconciles;
use super::writers_gate::WritersGateReads;
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
    /// The background jobs: migrations, managedFields cleanups, StorageVersionMigrations
    /// followed and conversion preflights.
    pub jobs: Arc<BackgroundJobs>,
    /// Samples the apiserver's request counters for traffic gates.
    pub traffic: Arc<TrafficMonitor>,
    /// Reads the objects' managedFields for writers gates, in the background.
    pub writers: Arc<WritersGateReads>,
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
    /// A context for `client`, whose reconciles find competing policies in `policies`; every
    /// other part as `run` makes it with its defaults unless the builder sets it.
    pub fn builder(client: Client, policies: Store<DeserializeGuard<VersionPolicy>>) -> ContextBuilder {
        ContextBuilder {
            client,
            policies,
            recorder: None,
            metrics: None,
            clock: Arc::new(Timestamp::now),
            resync: DEFAULT_RESYNC,
            jobs: None,
            traffic: None,
            writers: None,
            webhook: None,
            last_reconciles: None,
            crds_seen: None,
            patches_first: None,
        }
    }

    /// A builder holding every part of this context (shared, not copied): a restarted
    /// controller or a new leader in tests replaces some and keeps the rest. The background
    /// jobs keep the clock and metrics they were made with: replace them too when replacing
    /// those.
    pub fn rebuild(&self) -> ContextBuilder {
        ContextBuilder {
            client: self.client.clone(),
            policies: self.policies.clone(),
            recorder: Some(self.recorder.clone()),
            metrics: Some(self.metrics.clone()),
            clock: self.clock.clone(),
            resync: self.resync,
            jobs: Some(self.jobs.clone()),
            traffic: Some(self.traffic.clone()),
            writers: Some(self.writers.clone()),
            webhook: self.webhook.clone(),
            last_reconciles: Some(self.last_reconciles.clone()),
            crds_seen: Some(self.crds_seen.clone()),
            patches_first: Some(self.patches_first.clone()),
        }
    }

    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }
}

/// `run`'s default resync (`--resync`).
const DEFAULT_RESYNC: Duration = Duration::from_secs(600);

/// `run`'s default traffic sample interval (`--traffic-sample-interval`).
const DEFAULT_TRAFFIC_SAMPLE_INTERVAL: Duration = Duration::from_secs(30);

/// `run`'s default number of migrations at once (`--parallel-migrations`).
const DEFAULT_PARALLEL_MIGRATIONS: usize = 2;

/// Builds a [`Context`] (`Context::builder`, `Context::rebuild`).
#[must_use]
pub struct ContextBuilder {
    client: Client,
    policies: Store<DeserializeGuard<VersionPolicy>>,
    recorder: Option<Recorder>,
    metrics: Option<Arc<Metrics>>,
    clock: Clock,
    resync: Duration,
    jobs: Option<Arc<BackgroundJobs>>,
    traffic: Option<Arc<TrafficMonitor>>,
    writers: Option<Arc<WritersGateReads>>,
    webhook: Option<Arc<WebhookEndpoint>>,
    last_reconciles: Option<Arc<LastReconciles>>,
    crds_seen: Option<Arc<CrdsSeen>>,
    /// Kept by `rebuild` (the reconciles of both contexts order their patches together).
    patches_first: Option<Arc<PatchesFirst>>,
}

impl ContextBuilder {
    /// The Event recorder (default: reporting as controller `crd-lifecycle`, without the
    /// replica's identity that `run` adds).
    pub fn recorder(mut self, recorder: Recorder) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// The metrics (default: a registry of its own).
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The clock (default: the wall clock).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Reconcile at least this often (default 10m, as `--resync`).
    pub fn resync(mut self, resync: Duration) -> Self {
        self.resync = resync;
        self
    }

    /// The background jobs (default: two migrations at once, on this builder's client,
    /// recorder, metrics and clock).
    pub fn jobs(mut self, jobs: Arc<BackgroundJobs>) -> Self {
        self.jobs = Some(jobs);
        self
    }

    /// The traffic sampler (default: one sampling every 30 s, as `--traffic-sample-interval`,
    /// once its `run` is started; `run` starts it, a context alone does not).
    pub fn traffic(mut self, traffic: Arc<TrafficMonitor>) -> Self {
        self.traffic = Some(traffic);
        self
    }

    /// The managedFields reader of writers gates (default: `run`'s paging and retries).
    pub fn writers(mut self, writers: Arc<WritersGateReads>) -> Self {
        self.writers = Some(writers);
        self
    }

    /// The conversion webhook this controller serves (default: none).
    pub fn webhook(mut self, webhook: Option<Arc<WebhookEndpoint>>) -> Self {
        self.webhook = webhook;
        self
    }

    /// What each policy's last reconcile acted on, shared with the CRD watch's trigger
    /// (default: a record of its own).
    pub fn last_reconciles(mut self, last_reconciles: Arc<LastReconciles>) -> Self {
        self.last_reconciles = Some(last_reconciles);
        self
    }

    /// The CRDs seen, shared with the CRD watch that fills it (default: a record of its own).
    pub fn crds_seen(mut self, crds_seen: Arc<CrdsSeen>) -> Self {
        self.crds_seen = Some(crds_seen);
        self
    }

    /// The context; what was not set is made as `run` makes it by default.
    pub fn build(self) -> Context {
        let client = self.client;
        let recorder = self.recorder.unwrap_or_else(|| {
            let reporter = Reporter {
                controller: "crd-lifecycle".into(),
                instance: None,
            };
            Recorder::new(client.clone(), reporter)
        });
        let metrics = self.metrics.unwrap_or_default();
        let jobs = self.jobs.unwrap_or_else(|| {
            Arc::new(
                BackgroundJobs::new(
                    client.clone(),
                    recorder.clone(),
                    metrics.clone(),
                    DEFAULT_PARALLEL_MIGRATIONS,
                )
                .with_clock(self.clock.clone()),
            )
        });
        Context {
            traffic: self
                .traffic
                .unwrap_or_else(|| TrafficMonitor::new(client.clone(), DEFAULT_TRAFFIC_SAMPLE_INTERVAL)),
            writers: self
                .writers
                .unwrap_or_else(|| Arc::new(WritersGateReads::new(client.clone()))),
            client,
            recorder,
            metrics,
            policies: self.policies,
            clock: self.clock,
            resync: self.resync,
            jobs,
            webhook: self.webhook,
            last_reconciles: self.last_reconciles.unwrap_or_default(),
            patches_first: self.patches_first.unwrap_or_default(),
            crds_seen: self.crds_seen.unwrap_or_default(),
        }
    }
}
