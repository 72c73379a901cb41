//! One replica's serving certificate, kept fresh: read from files or a Secret (renewed
//! there when due), served once every CRD pointed at the webhook trusts its CA, recorded in
//! the rotation record, and its CA handed to the endpoint's bundle for the leader to write.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use kube::Client;
use tokio::time::Instant;
use tracing::{info, warn};

use super::endpoint::WebhookEndpoint;
use super::record::RotationRecord;
use super::rotation::{CaRotation, CertificateSet, CrdBundles, Rotation};
use crate::clock::Clock;
use crate::webhook::{CertStore, Readiness, WebhookMetrics, WebhookSettings};

/// Where the webhook's certificates come from.
#[derive(Clone, Debug)]
pub enum CertificateSource {
    /// Supplied by the user (e.g. cert-manager), checked for changes every
    /// [`FILES_CHECKED_EVERY`].
    Files { cert: String, key: String, ca: String },
    /// Self-signed, kept (and renewed) in this Secret, read every [`SECRET_READ_EVERY`].
    Secret { namespace: String, name: String },
}

/// How often certificate files are read to see whether they changed (a local read; the
/// CRDs are read only when they did).
pub const FILES_CHECKED_EVERY: Duration = Duration::from_secs(15);
/// How often the certificate Secret is read (it changes only when the serving certificate
/// is renewed, a month before it expires, or when someone deletes it).
pub const SECRET_READ_EVERY: Duration = Duration::from_secs(3600);

/// Keeps one replica's serving certificate fresh and the CAs the replicas need in the
/// bundle the leader writes to the CRDs. Each pass reads the certificates (files, or the
/// Secret, renewing it when due); the CRDs are looked at only when there is something to
/// learn from them: a new certificate set, a set waiting for its CA to be trusted, a served
/// CA some CRD does not trust, or a CA a live replica serves that this one has no copy of.
/// Looking costs a GET of each CRD the webhook serves that changed since it was read, and
/// nothing else (`pointed_crds`: never a list of the CRDs). What this replica serves is recorded on the Secret (`RotationRecord`) at least
/// every third of the record's time to live. Reading certificates or CRDs and writing the
/// record fail and are retried independently, with backoff; the bundle reaches the CRDs even
/// while the record cannot be written (without pruning: liveness unknown). `/readyz` is
/// Ready only while this replica serves a certificate whose CA every CRD pointed at the
/// webhook trusts.
pub struct CertificateRefresher {
    client: Client,
    source: CertificateSource,
    names: Vec<String>,
    endpoint: Arc<WebhookEndpoint>,
    certs: Arc<CertStore>,
    readiness: Arc<Readiness>,
    metrics: Arc<WebhookMetrics>,
    record: Option<RotationRecord>,
    rotation: CaRotation,
    /// The set last loaded into `rotation`.
    loaded: Option<CertificateSet>,
    /// The CRDs as last read.
    crds: Option<CrdBundles>,
    /// A live replica serves a CA this one has no copy of: read the CRDs.
    unknown_ca: bool,
    /// Why the last certificate pass failed, if it did.
    failure: Option<String>,
    /// Failed passes in a row; checks in a row while something waits on the CRDs.
    retries: Option<ExponentialBackoff>,
    rechecks: Option<ExponentialBackoff>,
    /// When the record is due next, what it last said this replica serves, and failed
    /// writes in a row.
    record_due: Instant,
    recorded: Option<Option<String>>,
    record_retries: Option<ExponentialBackoff>,
    /// What the record's entries are dated by (the wall clock unless `with_clock`).
    clock: Clock,
}

/// After a failure: 1 s, then twice as long each time (with jitter), at most a minute
/// ([`UNREADY_RETRY_MAX`] while not Ready).
fn retry_backoff() -> ExponentialBackoff {
    doubling(Duration::from_secs(60)).with_jitter().build()
}

/// The longest wait between failed passes while this replica serves no certificate the CRDs
/// trust (not Ready): after an apiserver outage it is Ready again within this.
const UNREADY_RETRY_MAX: Duration = Duration::from_secs(5);

/// While a set waits for the CRDs: 1 s, then twice as long each time, at most 30 s.
fn recheck_backoff() -> ExponentialBackoff {
    doubling(Duration::from_secs(30)).build()
}

/// 1 s, then twice as long each time up to `max`, without end.
fn doubling(max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(Duration::from_secs(1))
        .with_max_delay(max)
        .without_max_times()
}

impl CertificateRefresher {
    /// The refresher of the webhook `settings` describe. `certs` is what its server
    /// serves, `readiness` what its `/readyz` says.
    pub fn new(
        client: Client,
        settings: &WebhookSettings,
        endpoint: Arc<WebhookEndpoint>,
        certs: Arc<CertStore>,
        readiness: Arc<Readiness>,
        metrics: Arc<WebhookMetrics>,
    ) -> CertificateRefresher {
        CertificateRefresher {
            client,
            source: settings.certificates.clone(),
            names: settings.target.certificate_names(),
            endpoint,
            certs,
            readiness,
            metrics,
            record: settings.record.clone(),
            rotation: CaRotation::default(),
            loaded: None,
            crds: None,
            unknown_ca: false,
            failure: None,
            retries: None,
            rechecks: None,
            record_due: Instant::now(),
            recorded: None,
            record_retries: None,
            clock: Arc::new(jiff::Timestamp::now),
        }
    }

    /// Dates the rotation record's entries by `clock` (the controller's) rather than the
    /// wall clock.
    pub fn with_clock(mut self, clock: Clock) -> CertificateRefresher {
        self.clock = clock;
        self
    }

    /// Refreshes forever.
    pub async fn run(mut self) {
        loop {
            let wait = self.refresh().await;
            tokio::time::sleep(wait).await;
        }
    }

    /// One pass; returns how long until the next one is due.
    pub async fn refresh(&mut self) -> Duration {
        let certificate_wait = match self.refresh_certificate().await {
            Ok(wait) => {
                self.failure = None;
                self.retries = None;
                wait
            }
            Err(error) => {
                warn!(error = %error, "cannot refresh the conversion webhook's certificate; retrying");
                self.failure = Some(error);
                let wait = next(&mut self.retries, retry_backoff);
                if self.serving_trusted() {
                    wait
                } else {
                    // Not Ready until a pass succeeds: a Service may have no other endpoint
                    // (the other replica restarting), so retry soon after the apiserver is back.
                    wait.min(UNREADY_RETRY_MAX)
                }
            }
        };
        let record_wait = self.refresh_record().await;
        // Whatever the record's fate: the CAs the replicas need reach the CRDs.
        if let Some(bundle) = self.rotation.bundle() {
            self.endpoint.set_ca_bundle(bundle);
        }
        self.update_readiness();
        if self.unknown_ca && self.failure.is_none() {
            // Learn that CA from the CRDs before this replica's bundle can drop it.
            return Duration::ZERO;
        }
        certificate_wait.min(record_wait)
    }

    /// Reads the certificates and, when there is something to learn, the CRDs; serves a
    /// set once the CRDs trust its CA.
    async fn refresh_certificate(&mut self) -> Result<Duration, String> {
        let set = self.read_set().await?;
        let changed = self.loaded.as_ref() != Some(&set);
        let unsettled = self.rotation.pending_ca().is_some() || !self.serving_trusted();
        if changed || unsettled || self.unknown_ca {
            // A set that cannot be served is refused before it changes anything.
            CertStore::check_pem(&set.cert, &set.key)?;
            let crds =
                self.endpoint.read_bundles(&self.client).await.map_err(|error| {
                    format!("cannot read the CustomResourceDefinitions' caBundle: {error}")
                })?;
            self.unknown_ca = false;
            match self.rotation.load(set.clone(), &crds) {
                Rotation::Serve(set) => self.serve(&set)?,
                Rotation::Pending => {
                    let (trusting, total) = crds.trusting(&set.ca);
                    info!(
                        trusting,
                        total,
                        "a new CA is in this replica's caBundle; the certificate it signed is served once every CRD pointed at the webhook trusts it"
                    );
                }
                Rotation::Unchanged => {}
            }
            self.crds = Some(crds);
            self.loaded = Some(set);
        }
        if self.rotation.pending_ca().is_some() || !self.serving_trusted() {
            return Ok(next(&mut self.rechecks, recheck_backoff));
        }
        self.rechecks = None;
        Ok(match self.source {
            CertificateSource::Files { .. } => FILES_CHECKED_EVERY,
            CertificateSource::Secret { .. } => SECRET_READ_EVERY,
        })
    }

    async fn read_set(&self) -> Result<CertificateSet, String> {
        match &self.source {
            CertificateSource::Files { cert, key, ca } => crate::webhook::certs::read_files(cert, key, ca)
                .map(|(cert, key, ca)| CertificateSet { cert, key, ca })
                .map_err(|error| error.to_string()),
            CertificateSource::Secret { namespace, name } => {
                crate::webhook::certs::ensure_secret(&self.client, namespace, name, &self.names)
                    .await
                    .map(|bundle| CertificateSet {
                        cert: bundle.cert_pem,
                        key: bundle.key_pem,
                        ca: bundle.ca_pem,
                    })
                    .map_err(|error| error.to_string())
            }
        }
    }

    fn serve(&self, set: &CertificateSet) -> Result<(), String> {
        self.certs.set_pem(&set.cert, &set.key)?;
        // The certificate now served: its expiry for the alert.
        if let Err(error) = self.metrics.set_certificate(&set.cert) {
            warn!(error = %error, "cannot read the serving certificate's expiry");
        }
        info!("serving a new certificate for the conversion webhook");
        Ok(())
    }

    /// Whether every CRD pointed at the webhook, as last read, trusts the CA served.
    fn serving_trusted(&self) -> bool {
        match (self.rotation.serving(), &self.crds) {
            (Some(set), Some(crds)) => crds.all_trust(&set.ca),
            _ => false,
        }
    }

    /// Records what this replica serves when it changed or the record is due, and drops
    /// from the bundle the CAs no live replica serves. Returns how long until it is due.
    async fn refresh_record(&mut self) -> Duration {
        let Some(record) = &self.record else {
            return SECRET_READ_EVERY;
        };
        let serving = self.rotation.serving_fingerprint();
        let now = Instant::now();
        if now < self.record_due && self.recorded.as_ref() == Some(&serving) {
            return self.record_due - now;
        }
        match record
            .publish(&self.client, serving.as_deref(), (self.clock)())
            .await
        {
            Ok(live) => {
                self.unknown_ca = live
                    .fingerprints
                    .iter()
                    .any(|fingerprint| !self.rotation.knows(fingerprint));
                // A record younger than its time to live may miss a replica: no CA leaves.
                if live.complete {
                    self.rotation.prune(&live.fingerprints);
                }
                self.recorded = Some(serving);
                self.record_retries = None;
                self.record_due = now + record.ttl / 3;
            }
            Err(error) => {
                // Nothing is pruned: which replicas are alive is unknown.
                warn!(error = %error, "cannot record what this replica serves; retrying (the caBundle keeps every CA it holds)");
                self.record_due = now + next(&mut self.record_retries, retry_backoff);
            }
        }
        self.record_due - now
    }

    fn update_readiness(&self) {
        let trusting = |ca: &str| self.crds.as_ref().map_or((0, 0), |crds| crds.trusting(ca));
        match (self.rotation.serving(), self.rotation.pending_ca()) {
            (Some(_), _) if self.serving_trusted() => self.readiness.certificate_served(),
            (Some(set), _) => {
                let (trusting, total) = trusting(&set.ca);
                self.readiness.certificate_not_served(format!(
                    "the CA of the certificate served is in the caBundle of {trusting} of the {total} CRDs pointed at the webhook; waiting for the leader to add it"
                ));
            }
            (None, Some(ca)) => {
                let (trusting, total) = trusting(ca);
                self.readiness.certificate_not_served(format!(
                    "the serving certificate's CA is new: waiting until every CRD pointed at the webhook trusts it ({trusting} of {total} do)"
                ));
            }
            (None, None) => self.readiness.certificate_not_served(match &self.failure {
                Some(error) => format!("no serving certificate: {error}"),
                None => "no serving certificate yet".to_owned(),
            }),
        }
    }
}

/// The next delay of a backoff, starting it if needed.
fn next(backoff: &mut Option<ExponentialBackoff>, start: fn() -> ExponentialBackoff) -> Duration {
    backoff
        .get_or_insert_with(start)
        .next()
        .unwrap_or(Duration::from_secs(60))
}
