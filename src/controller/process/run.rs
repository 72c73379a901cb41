//! `run` and `replica`: what one replica of the controller starts, and in what order.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::FutureExt;
use kube::Client;
use tracing::info;

use super::http::{self, Health};
use super::lead::lead;
use super::settings::{RunError, RunSettings};
use crate::clock::Clock;
use crate::controller::metrics::Metrics;
use crate::supervise::{SupervisedTask, Supervisor};
use crate::webhook::run::RunningWebhook;

/// What the outside sees of one replica: the probes `run` serves on `/healthz` and
/// `/readyz` (`health`, with the conversion webhook's readiness when the replica serves the
/// webhook), and the certificate its webhook presents in every TLS handshake. `run` makes
/// them and serves them over HTTP; [`replica`], which has no HTTP server of its own, fills
/// the ones its caller made, so that a test reads them as the kubelet and the apiserver
/// would see them, without network I/O.
#[derive(Clone)]
pub struct Probes {
    pub health: Arc<Health>,
    /// The serving certificate of the conversion webhook (none served: empty).
    pub certificate: Arc<crate::webhook::CertStore>,
}

impl Probes {
    /// The probes of a replica run with `settings`: with the webhook's readiness when it
    /// serves one.
    pub fn new(settings: &RunSettings) -> Probes {
        Probes {
            health: Arc::new(Health {
                webhook: settings
                    .webhook
                    .as_ref()
                    .map(|_| Arc::new(crate::webhook::Readiness::default())),
                ..Health::default()
            }),
            certificate: Arc::default(),
        }
    }
}

/// Runs the controller until SIGTERM / SIGINT or a failed essential task.
///
/// SIGTERM ends two jobs on two clocks. The controller's writers (reconciles, migrations,
/// cleanups, the sampler) stop within [`SHUTDOWN_GRACE`] and the leader releases its lease
/// at once, so that a standby takes over without waiting for the lease to expire: a
/// terminating replica writes nothing more. The conversion webhook, which writes nothing
/// (it answers the apiserver's reviews; its certificate Secret and rotation record are per
/// replica and guarded by resourceVersion), keeps serving, not ready, for its drain period,
/// then sends GOAWAY and lets its requests in flight finish (see
/// [`crate::webhook::Connections`]); the process exits once both are done, and `/healthz`,
/// `/readyz` and `/metrics` answer until then. A lost lease stops the writers and makes the
/// replica a standby again (see [`lead`]); a failed essential task exits at once, webhook
/// included: the process is restarted.
pub async fn run(client: Client, settings: RunSettings) -> Result<(), RunError> {
    let metrics = Arc::new(Metrics::default());
    let probes = Probes::new(&settings);
    let health = probes.health.clone();
    health.alive.store(true, Ordering::Relaxed);
    let clock: Clock = Arc::new(jiff::Timestamp::now);
    let signal = crate::signals::terminated().shared();

    // Bound first, so that an address in use stops the process at once.
    let listener = tokio::net::TcpListener::bind(settings.metrics_address)
        .await
        .map_err(RunError::Http)?;
    let version = client.apiserver_version().await.map_err(RunError::Unreachable)?;
    info!(apiserver = %version.git_version, "connected");
    let mut supervisor = Supervisor::default();
    // The probes and metrics answer until the process exits (the webhook's drain included).
    let (exiting, exited) = tokio::sync::oneshot::channel::<()>();
    let server = http::serve(listener, metrics.clone(), health.clone(), async move {
        let _ = exited.await;
    });
    supervisor.add(SupervisedTask::spawn("the metrics server", async move {
        server.await.map_err(|error| error.to_string())
    }));

    // Every replica serves the conversion webhook (the Service spreads calls over them),
    // leader or not.
    let webhook = serve_webhook(
        &client,
        &settings,
        &metrics,
        &probes,
        &clock,
        signal.clone(),
        &mut supervisor,
    )
    .await?;
    let endpoint = webhook.as_ref().map(|webhook| webhook.endpoint.clone());
    let result = lead(
        client,
        settings,
        metrics,
        health,
        endpoint,
        clock,
        signal.clone(),
        &mut supervisor,
    )
    .await;
    // Stopped by the signal: the writers are stopped and the lease is released; the
    // webhook drains on.
    if let Some(webhook) = webhook
        && result.is_ok()
        && signal.peek().is_some()
    {
        webhook.drained(&mut supervisor).await;
    }
    let _ = exiting.send(());
    result
}

/// The conversion webhook `settings` ask for, if any, started as [`run`] starts it: serving
/// `probes.certificate`, ready as `probes.health` says, draining after `signal`.
async fn serve_webhook(
    client: &Client,
    settings: &RunSettings,
    metrics: &Metrics,
    probes: &Probes,
    clock: &Clock,
    signal: impl Future<Output = ()> + Send + 'static,
    supervisor: &mut Supervisor,
) -> Result<Option<RunningWebhook>, RunError> {
    let (Some(webhook_settings), Some(readiness)) = (&settings.webhook, &probes.health.webhook) else {
        return Ok(None);
    };
    crate::webhook::run::start(
        client.clone(),
        webhook_settings.clone(),
        metrics.webhook.clone(),
        readiness.clone(),
        probes.certificate.clone(),
        clock.clone(),
        signal,
        supervisor,
    )
    .await
    .map(Some)
    .map_err(|error| {
        RunError::Webhook(format!(
            "cannot listen on {} (--webhook-port): {error}",
            webhook_settings.address
        ))
    })
}

/// One replica as [`run`] leads it, without the process around it (metrics server, probes'
/// HTTP server, signals): its conversion webhook when `settings.webhook` is set (serving on
/// its address, its certificate refresher dating its record by `clock`), leader election when
/// `settings.lease` is set, then the controller on `clock`, until `shutdown` or a failed
/// essential task. `probes` (made with [`Probes::new`] from the same `settings`) show what
/// its `/readyz` would answer and the certificate its webhook serves. What a simulation runs
/// two of against one apiserver.
pub async fn replica(
    client: Client,
    settings: RunSettings,
    clock: Clock,
    probes: Probes,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
) -> Result<(), RunError> {
    let mut supervisor = Supervisor::default();
    let metrics = Arc::new(Metrics::default());
    let webhook = serve_webhook(
        &client,
        &settings,
        &metrics,
        &probes,
        &clock,
        shutdown.clone(),
        &mut supervisor,
    )
    .await?;
    lead(
        client,
        settings,
        metrics,
        probes.health,
        webhook.map(|webhook| webhook.endpoint),
        clock,
        shutdown,
        &mut supervisor,
    )
    .await
}
