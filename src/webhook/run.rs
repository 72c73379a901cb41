//! The conversion webhook as `crd-lifecycle run` serves it: its certificates (loaded,
//! renewed, their CA published to the CRDs), the policy cache it converts with, and its
//! server, each a supervised task. Every replica serves it, leader or not; SIGTERM drains it
//! (see [`crate::webhook::Connections`]) while the controller's writers stop at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tracing::{info, warn};

use super::ca::{CertificateRefresher, WebhookCrds, WebhookEndpoint};
use super::{CertStore, Connections, Readiness, Server, WebhookMetrics, WebhookSettings};
use crate::clock::Clock;
use crate::supervise::{SupervisedTask, Supervisor};

/// The webhook `crd-lifecycle run` serves, once started.
pub(crate) struct RunningWebhook {
    /// Its CRD settings and the CA bundle the leader writes to the CRDs.
    pub endpoint: Arc<WebhookEndpoint>,
    /// Completes once the server has stopped (after its drain, once the connections closed
    /// or their deadline passed).
    stopped: tokio::sync::oneshot::Receiver<()>,
    connections: Connections,
}

impl RunningWebhook {
    /// Waits until the server has drained and stopped (it started draining at the
    /// shutdown signal), for at most its drain and closing deadline and a little more.
    pub async fn drained(self, supervisor: &mut Supervisor) {
        let bound = self.connections.drain + self.connections.closing_deadline() + Duration::from_secs(2);
        info!("waiting for the conversion webhook to drain");
        tokio::select! {
            biased;
            _ = self.stopped => {}
            failed = supervisor.first_failure() => {
                warn!(error = %failed, "an essential task stopped while the conversion webhook drained");
            }
            () = tokio::time::sleep(bound) => warn!("the conversion webhook did not stop within {bound:?}"),
        }
    }
}

/// Starts the webhook: binds its address (a taken one fails at once), then serves at once
/// while its certificates and caches load. `readiness` says when it may be sent reviews,
/// `certs` holds the certificate it serves, `clock` dates the rotation record; `signal`
/// starts its drain. `Err`: its address cannot be listened on.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn start(
    client: Client,
    settings: WebhookSettings,
    metrics: Arc<WebhookMetrics>,
    readiness: Arc<Readiness>,
    certs: Arc<CertStore>,
    clock: Clock,
    signal: impl Future<Output = ()> + Send + 'static,
    supervisor: &mut Supervisor,
) -> std::io::Result<RunningWebhook> {
    let listener = tokio::net::TcpListener::bind(settings.address).await?;
    // The webhook's caches also say which CRDs its certificates must be trusted by.
    let (cache, watches) = super::CachedPolicies::watch(client.clone());
    let crds = WebhookCrds::new(&cache);
    let endpoint = Arc::new(WebhookEndpoint::new(settings.target.clone()).with_crds(crds));
    let refresher = CertificateRefresher::new(
        client.clone(),
        &settings,
        endpoint.clone(),
        certs.clone(),
        readiness.clone(),
        metrics.clone(),
    )
    .with_clock(clock);
    // Failures are retried with backoff and reported by /readyz; it never gives up.
    supervisor.add(SupervisedTask::spawn(
        "the webhook certificate refresher",
        async move {
            refresher.run().await;
            Err("it returned".to_owned())
        },
    ));

    let cache = Arc::new(cache);
    // Ready only once the webhook knows every policy and every CRD's recorded conversion:
    // before that it would refuse reviews it can answer.
    let loaded = {
        let (cache, readiness) = (cache.clone(), readiness.clone());
        async move {
            if cache.wait_until_ready().await {
                readiness.policies_loaded();
                info!("the conversion webhook's caches are filled");
            }
        }
    };
    supervisor.add(SupervisedTask::spawn(
        "the conversion webhook's watches",
        async move {
            futures::future::join(watches, loaded).await;
            Err("the watches ended".to_owned())
        },
    ));
    let connections = settings.connections;
    let server = Server {
        certs,
        policies: cache,
        metrics,
        limits: settings.limits.clone(),
        readiness: readiness.clone(),
        connections,
    };
    let stop = super::drain_after(signal, readiness, connections.drain);
    let (stopped, stopped_rx) = tokio::sync::oneshot::channel();
    supervisor.add(SupervisedTask::spawn(
        "the conversion webhook server",
        async move {
            let served = server.serve(listener, stop).await;
            let _ = stopped.send(());
            served.map_err(|error| error.to_string())
        },
    ));
    Ok(RunningWebhook {
        endpoint,
        stopped: stopped_rx,
        connections,
    })
}
