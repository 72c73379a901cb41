//! The conversion webhook as the controller runs it: its certificates (loaded, renewed,
//! their CA published to the CRDs), the policy cache it converts with, and its server, each
//! a supervised task. Every replica serves it, leader or not; SIGTERM drains it (see
//! [`crate::webhook::Connections`]) while the controller's writers stop at once.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tracing::{info, warn};

use super::RunError;
use super::conversion_config::{self, WebhookEndpoint, WebhookTarget};
use super::supervise::{Essential, Supervisor};
use crate::webhook::{CertStore, Connections, Readiness, Server, WebhookMetrics};

/// Where the conversion webhook listens, how the apiserver reaches it, and its
/// certificates.
#[derive(Clone, Debug)]
pub struct WebhookSettings {
    pub address: SocketAddr,
    pub target: WebhookTarget,
    pub certificates: CertificateSource,
    /// What one review may cost.
    pub limits: crate::webhook::Limits,
    /// Where each replica records what it serves (so that a CA stays trusted while a
    /// replica serves a certificate it signed, across restarts).
    pub record: Option<super::rotation_record::RotationRecord>,
    /// How connections age, and the drain after SIGTERM.
    pub connections: Connections,
}

/// Where the webhook's certificates come from.
#[derive(Clone, Debug)]
pub enum CertificateSource {
    /// Supplied by the user (e.g. cert-manager), re-read every minute.
    Files { cert: String, key: String, ca: String },
    /// Self-signed, kept (and renewed) in this Secret.
    Secret { namespace: String, name: String },
}

/// The webhook `run` serves.
pub(super) struct Webhook {
    /// Its CRD settings and the CA bundle the leader writes to the CRDs.
    pub endpoint: Arc<WebhookEndpoint>,
    /// Completes once the server has stopped (after its drain, once the connections closed
    /// or their deadline passed).
    stopped: tokio::sync::oneshot::Receiver<()>,
    connections: Connections,
}

impl Webhook {
    /// Waits until the server has drained and stopped (it started draining at the
    /// shutdown signal), for at most its drain and in-flight deadline and a little more.
    pub async fn drained(self, supervisor: &mut Supervisor) {
        let bound = self.connections.drain + self.connections.in_flight_deadline + Duration::from_secs(2);
        info!("waiting for the conversion webhook to drain");
        tokio::select! {
            _ = self.stopped => {}
            failed = supervisor.first_failure() => {
                warn!(error = %failed, "an essential task stopped while the conversion webhook drained");
            }
            () = tokio::time::sleep(bound) => warn!("the conversion webhook did not stop within {bound:?}"),
        }
    }
}

/// Loads the certificates, keeps them fresh, and serves the webhook with a cache of the
/// policies of its own. `readiness` says when it may be sent reviews; `signal` starts its
/// drain.
pub(super) async fn start_webhook(
    client: Client,
    settings: WebhookSettings,
    metrics: Arc<WebhookMetrics>,
    readiness: Arc<Readiness>,
    signal: impl Future<Output = ()> + Send + 'static,
    supervisor: &mut Supervisor,
) -> Result<Webhook, RunError> {
    // A taken address fails at once.
    let listener = tokio::net::TcpListener::bind(settings.address)
        .await
        .map_err(|error| {
            RunError::Webhook(format!(
                "cannot listen on {} (--webhook-port): {error}",
                settings.address
            ))
        })?;
    let endpoint = Arc::new(WebhookEndpoint::new(settings.target.clone()));
    let certs = Arc::new(CertStore::default());
    let rotation = Arc::new(std::sync::Mutex::new(conversion_config::CaRotation::default()));
    let refresh = {
        let (client, endpoint, certs, source, rotation, metrics, record) = (
            client.clone(),
            endpoint.clone(),
            certs.clone(),
            settings.certificates.clone(),
            rotation.clone(),
            metrics.clone(),
            settings.record.clone(),
        );
        let names = settings.target.certificate_names();
        move || {
            let (client, endpoint, certs, source, names, rotation, metrics, record) = (
                client.clone(),
                endpoint.clone(),
                certs.clone(),
                source.clone(),
                names.clone(),
                rotation.clone(),
                metrics.clone(),
                record.clone(),
            );
            async move {
                let loaded = match &source {
                    CertificateSource::Files { cert, key, ca } => {
                        crate::webhook::certs::read_files(cert, key, ca).map_err(|e| e.to_string())
                    }
                    CertificateSource::Secret { namespace, name } => {
                        crate::webhook::certs::ensure_secret(&client, namespace, name, &names)
                            .await
                            .map(|b| (b.cert_pem, b.key_pem, b.ca_pem))
                            .map_err(|e| e.to_string())
                    }
                };
                let result = match loaded {
                    Ok((cert, key, ca)) => {
                        let set = conversion_config::CertificateSet { cert, key, ca };
                        conversion_config::refresh(set, &rotation, &endpoint, &client, record.as_ref(), |s| {
                            certs.set_pem(&s.cert, &s.key)?;
                            // The certificate now served: its expiry for the alert.
                            if let Err(error) = metrics.set_certificate(&s.cert) {
                                warn!(error = %error, "cannot read the serving certificate's expiry");
                            }
                            Ok(())
                        })
                        .await
                    }
                    Err(error) => Err(error),
                };
                if let Err(error) = &result {
                    warn!(error = %error, "cannot load the conversion webhook's certificates");
                }
                result.map(|_| ())
            }
        }
    };
    refresh().await.map_err(RunError::Webhook)?;
    readiness.certificate_served();
    let interval = match settings.certificates {
        CertificateSource::Files { .. } => Duration::from_secs(60),
        CertificateSource::Secret { .. } => Duration::from_secs(3600),
    };
    // A failed refresh keeps the certificates in use and is tried again next time.
    supervisor.add(Essential::spawn(
        "the webhook certificate refresher",
        async move {
            loop {
                tokio::time::sleep(interval).await;
                let _ = refresh().await;
            }
        },
    ));

    let (cache, watches) = crate::webhook::CachedPolicies::watch(client);
    supervisor.add(Essential::spawn("the conversion webhook's watches", async move {
        watches.await;
        Err("the watches ended".to_owned())
    }));
    let cache = Arc::new(cache);
    let connections = settings.connections;
    let server = Server {
        certs,
        policies: cache.clone(),
        metrics,
        limits: settings.limits.clone(),
        readiness: readiness.clone(),
        connections,
    };
    let stop = crate::webhook::drain_after(signal, readiness.clone(), connections.drain);
    let (stopped, stopped_rx) = tokio::sync::oneshot::channel();
    supervisor.add(Essential::spawn("the conversion webhook server", async move {
        let served = server.serve(listener, stop).await;
        let _ = stopped.send(());
        served.map_err(|error| error.to_string())
    }));
    // Ready (and so in the Service) only once the webhook knows every policy and every
    // CRD's recorded conversion: before that it would refuse reviews it can answer.
    info!("waiting for the conversion webhook's caches");
    tokio::select! {
        ready = cache.wait_until_ready() => ready.map_err(|e| RunError::Webhook(e.to_string()))?,
        failed = supervisor.first_failure() => return Err(failed.into()),
    }
    readiness.policies_loaded();
    Ok(Webhook {
        endpoint,
        stopped: stopped_rx,
        connections,
    })
}
