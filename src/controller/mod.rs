//! The controller: applies VersionPolicies to live CRDs on schedule, with status, events,
//! metrics, leader election and graceful shutdown.

pub mod conditions;
mod context;
pub mod crds_seen;
pub mod decide;
mod error;
pub mod events;
pub mod gate_inputs;
pub mod http;
pub mod jobs;
pub mod leader;
pub mod metrics;
mod observation;
pub mod patch;
pub mod patches_first;
mod reconcile;
mod release;
pub mod status;
pub mod traffic;
pub mod triggers;
pub mod writer_reads;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::core::DeserializeGuard;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tracing::{error, info, warn};

pub use context::{Context, ContextBuilder};
pub use crds_seen::CrdsSeen;
pub use error::{Error, status_code};
pub use reconcile::{competing_owner, error_policy, reconcile, requeue_after};
pub use release::RELEASE_FINALIZER;

use crate::api::VersionPolicy;
use crate::clock::Clock;
use crate::supervise::{self, Essential, Supervisor};
use crate::webhook::WebhookSettings;
use crate::webhook::ca::{CaBundleKeeper, WebhookEndpoint};
use crate::webhook::run::RunningWebhook;
use http::Health;
use jobs::BackgroundJobs;
use leader::{LeaderElector, LeaseSettings};
use metrics::Metrics;
use traffic::TrafficMonitor;

/// Settings of `crd-lifecycle run`.
#[derive(Clone, Debug)]
pub struct RunSettings {
    pub metrics_address: SocketAddr,
    /// `None` disables leader election (a single replica, or a local run).
    pub lease: Option<LeaseSettings>,
    pub resync: Duration,
    /// Name reported as the events' reporting instance.
    pub identity: String,
    /// Storage-version migrations that may run at once.
    pub parallel_migrations: usize,
    /// How often the apiserver's `/metrics` is sampled for traffic gates.
    pub traffic_sample_interval: Duration,
    /// How long a StorageVersionMigration may stay Pending before its run fails.
    pub svm_pending_deadline: Duration,
    /// The conversion webhook to serve, if any.
    pub webhook: Option<WebhookSettings>,
}

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

/// Why `run` stopped other than by a shutdown signal.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot reach the apiserver: {0}")]
    Unreachable(#[source] kube::Error),
    #[error("cannot serve metrics and probes on the --metrics-addr address: {0}")]
    Http(#[source] std::io::Error),
    #[error("cannot start the conversion webhook: {0}")]
    Webhook(String),
    #[error(transparent)]
    TaskFailed(#[from] supervise::TaskFailed),
}

/// How long after SIGTERM the controller may take to stop (the kubelet's default grace
/// period is 30 s; a rollout should not wait for it).
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(4);

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
    supervisor.add(Essential::spawn("the metrics server", async move {
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

/// Waits for leadership (when elected), then runs the controller on `clock` until
/// `shutdown` or a failed essential task; releases the lease unless it was lost.
///
/// A lost lease (no renewal for the renew deadline: an apiserver restart, a partition)
/// stops every writer at once and makes this replica a standby again in the same process:
/// it waits for leadership anew, then starts a new controller with empty memory, as a
/// restarted process would. The conversion webhook, the probes and the metrics serve on
/// throughout: exiting would cut the connections of reviews in flight (an `EOF` to the
/// apiserver's client where it speaks HTTP/1.1 to webhooks, as v1.24 does).
#[allow(clippy::too_many_arguments)]
async fn lead(
    client: Client,
    settings: RunSettings,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    webhook: Option<Arc<WebhookEndpoint>>,
    clock: Clock,
    shutdown: impl Future<Output = ()> + Clone + Send + Sync + 'static,
    supervisor: &mut Supervisor,
) -> Result<(), RunError> {
    let elector = settings
        .lease
        .clone()
        .map(|lease| Arc::new(LeaderElector::new(client.clone(), lease)));
    // After a lost lease: the standby's growing pauses, and the one before the next try.
    let mut standby: Option<backon::ExponentialBackoff> = None;
    let mut pause = Duration::ZERO;
    loop {
        if !pause.is_zero() {
            tokio::select! {
                biased;
                // The lease was lost, so there is nothing to release.
                () = shutdown.clone() => return Ok(()),
                failed = supervisor.first_failure() => return Err(failed.into()),
                () = tokio::time::sleep(pause) => {}
            }
        }
        let mut acquired = tokio::time::Instant::now();
        if let Some(elector) = &elector {
            // A standby replica is healthy and ready; it just does not reconcile.
            health.ready.store(true, Ordering::Relaxed);
            tokio::select! {
                biased;
                () = shutdown.clone() => {
                    // An acquiring write that landed as the signal came would keep the lease
                    // from the others for a whole lease duration: released if it is held.
                    elector.release().await;
                    return Ok(());
                }
                failed = supervisor.first_failure() => return Err(failed.into()),
                sent = elector.acquire() => acquired = sent,
            }
            metrics.leader.set(1);
            // The leader is ready once it has listed the policies (see `controller`).
            health.ready.store(false, Ordering::Relaxed);
        }

        let controller = controller(
            client.clone(),
            settings.clone(),
            metrics.clone(),
            health.clone(),
            webhook.clone(),
            clock.clone(),
            shutdown.clone(),
        );
        // Leadership lost or a task failed: dropping the controller future stops every writer
        // at once (reconciles with it, migrations and the sampler through `StopWriters`).
        let hold = async {
            match &elector {
                Some(elector) => elector.hold(acquired).await,
                None => std::future::pending().await,
            }
        };
        // SIGTERM stops the controller within SHUTDOWN_GRACE whatever the watches are doing
        // (refused, retrying, stalled): in-flight reconciles get that long to finish.
        let deadline = {
            let shutdown = shutdown.clone();
            async move {
                shutdown.await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            }
        };
        // A lost lease first: a controller that ended at the same instant still reports it.
        let result = tokio::select! {
            biased;
            lost = hold => {
                // The controller future is dropped as this arm runs: nothing of this term
                // writes any more, but requests it sent may still land. So this replica
                // stands by at least a lease duration, as long as any other replica waits
                // before taking over a lease it saw unrenewed (its own record would let it
                // renew at once), and longer after each term that ended so (an apiserver
                // too loaded to renew should not be sent a new term's lists and reads every
                // few seconds), back to a lease duration after a term of an hour.
                if acquired.elapsed() >= STABLE_TERM {
                    standby = None;
                }
                // Only an elected replica loses a lease: `settings.lease` is set.
                let lease_duration = settings.lease.as_ref().map(|l| l.lease_duration).unwrap_or_default();
                pause = standby
                    .get_or_insert_with(|| standby_backoff(lease_duration))
                    .next()
                    .unwrap_or(MAX_STANDBY);
                error!(error = %lost, standby = ?pause, "lost leadership; stopped every writer, standing by to lead again");
                metrics.leader.set(0);
                metrics.leadership_losses.inc();
                metrics.forget_policies();
                // A standby is ready (its webhook stays in the Service), also while it
                // pauses; a term that had not listed its policies yet left this false.
                health.ready.store(true, Ordering::Relaxed);
                continue;
            }
            result = controller => result,
            () = deadline => {
                warn!("the controller did not stop within {SHUTDOWN_GRACE:?} of the shutdown signal; stopping it anyway");
                Ok(())
            }
            failed = supervisor.first_failure() => {
                error!(error = %failed, "an essential task stopped; exiting");
                health.alive.store(false, Ordering::Relaxed);
                Err(failed.into())
            }
        };
        metrics.leader.set(0);
        if let Some(elector) = &elector {
            elector.release().await;
        }
        return result;
    }
}

/// The longest a replica that lost its lease stands by before it tries to lead again.
const MAX_STANDBY: Duration = Duration::from_secs(300);

/// A term at least this long resets the standby to a lease duration.
const STABLE_TERM: Duration = Duration::from_secs(3600);

/// From a lease duration, doubling after each lost term, up to `MAX_STANDBY`.
fn standby_backoff(lease_duration: Duration) -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::new()
        .with_min_delay(lease_duration)
        .with_max_delay(MAX_STANDBY)
        .without_max_times()
        .build()
}

/// Stops the controller's background writers when the controller stops, however it stops:
/// also when its future is dropped because leadership was lost.
struct StopWriters {
    jobs: Arc<BackgroundJobs>,
    sampler: Option<Essential>,
    ca_bundle_keeper: Option<Essential>,
}

impl Drop for StopWriters {
    fn drop(&mut self) {
        // Interrupted migrations resume from their checkpoints under the next leader.
        self.jobs.shutdown();
        drop(self.sampler.take());
        drop(self.ca_bundle_keeper.take());
    }
}

/// The controller itself, without the process around it (metrics server, webhook, leader
/// election): watches, reconciles and background runs until `shutdown`. `clock` is the
/// instant its decisions use (the wall clock; tests give one of their own).
pub async fn controller(
    client: Client,
    settings: RunSettings,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    webhook: Option<Arc<WebhookEndpoint>>,
    clock: Clock,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), RunError> {
    let policies: Api<DeserializeGuard<VersionPolicy>> = Api::all(client.clone());
    // Metadata is enough to know which CRD changed (and costs far less than the schemas).
    let crds: Api<PartialObjectMeta<CustomResourceDefinition>> = Api::all(client.clone());
    // The cache sees every change of a policy; only a change of what a reconcile acts on
    // starts one (`triggers::policy_inputs`), not its own status and finalizer writes.
    let (store, writer) = reflector::store();
    // Not `store.wait_until_ready()`: kube-runtime's `Controller` waits on it, and it wakes
    // one waiter only (`sync::Listed`).
    let (policies_listed, policy_lists) = crate::sync::Listed::new();
    let policy_changes = watcher(policies.clone(), watcher::Config::default().any_semantic())
        .reflect(writer)
        .inspect(policy_lists)
        .applied_objects()
        .predicate_filter(triggers::policy_inputs, Default::default());
    let mut controller = Controller::for_stream(policy_changes, store.clone());
    // A new CA bundle (a CA rotation) reaches every CRD at once, not at the next resync.
    if let Some(endpoint) = &webhook {
        let changes = futures::stream::unfold(endpoint.bundle_changes(), |mut changes| async move {
            changes.changed().await.ok()?;
            Some(((), changes))
        });
        controller = controller.reconcile_all_on(changes);
    }

    // A CRD event (including the migrator trimming status.storedVersions) reconciles the
    // policies that target it, except those whose last reconcile acted on the CRD at that
    // resourceVersion (its own patch coming back).
    let by_crd = store.clone();
    let last_reconciles = Arc::new(triggers::LastReconciles::default());
    let acted_on = last_reconciles.clone();
    // Each CRD's resourceVersion, whether the CRD watch is up (a kept CRD serves reads only
    // then), and deletions, before the events are mapped to reconciles.
    let crds_seen = Arc::new(CrdsSeen::default());
    let seen = crds_seen.clone();
    let crd_changes = watcher(crds, watcher::Config::default().any_semantic())
        .inspect(move |event| seen.watch_event(event))
        .touched_objects();
    // A policy created, deleted or moved to another CRD reconciles the other policies for
    // the same CRD (the loser of a conflict takes over when the winner is deleted).
    let by_competitor = store.clone();
    let competitors = watcher(policies, watcher::Config::default().any_semantic())
        .touched_objects()
        .predicate_filter(triggers::competition, Default::default());

    let reporter = Reporter {
        controller: "crd-lifecycle".into(),
        instance: Some(settings.identity.clone()),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let jobs = Arc::new(
        BackgroundJobs::new(
            client.clone(),
            recorder.clone(),
            metrics.clone(),
            settings.parallel_migrations,
        )
        .with_svm_pending_deadline(settings.svm_pending_deadline)
        .with_clock(clock.clone()),
    );
    let traffic = TrafficMonitor::new(client.clone(), settings.traffic_sample_interval);
    let sampler = traffic.clone();
    let mut stop_writers = StopWriters {
        jobs: jobs.clone(),
        sampler: Some(Essential::spawn("the traffic sampler", async move {
            sampler.run().await;
            Err("it returned".to_owned())
        })),
        // Every CRD pointed at the webhook trusts its CAs, governed or not.
        ca_bundle_keeper: webhook.clone().map(|endpoint| {
            let keeper = CaBundleKeeper::new(client.clone(), endpoint, recorder.clone());
            Essential::spawn("the CA bundle keeper", async move {
                keeper.run().await;
                Err("it returned".to_owned())
            })
        }),
    };
    let context = Arc::new(
        Context::builder(client, store)
            .recorder(recorder)
            .metrics(metrics)
            .clock(clock)
            .resync(settings.resync)
            .jobs(jobs.clone())
            .traffic(traffic)
            .webhook(webhook)
            .last_reconciles(last_reconciles)
            .crds_seen(crds_seen)
            .build(),
    );
    // Ready once the policies are listed: a controller whose watch is refused (no
    // VersionPolicy CRD, no permission) is not.
    let ready_when_listed = {
        let health = health.clone();
        async move {
            if policies_listed.wait().await {
                health.ready.store(true, Ordering::Relaxed);
                info!("VersionPolicies listed; ready");
            }
        }
    };
    // When each kind of watch failure was last reported.
    let watch_errors: Arc<std::sync::Mutex<std::collections::HashMap<String, tokio::time::Instant>>> =
        Arc::default();
    info!("controller started");
    let running = controller
        .watches_stream(crd_changes, move |crd| {
            let resource_version = crd.resource_version().unwrap_or_default();
            let mut policies = policies_for_crd(&by_crd, &crd.name_any(), None);
            policies.retain(|policy| !acted_on.acted_on(&policy.name, &resource_version));
            policies
        })
        .watches_stream(competitors, move |policy| {
            let crd_name = policy
                .0
                .as_ref()
                .map(|p| p.spec.crd_name.clone())
                .unwrap_or_default();
            policies_for_crd(&by_competitor, &crd_name, Some(&policy.name_any()))
        })
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(move |result| {
            let watch_errors = watch_errors.clone();
            async move {
                match result {
                    // A policy deleted between its event and its reconcile: routine.
                    Err(error @ kube::runtime::controller::Error::ObjectNotFound(_)) => {
                        tracing::debug!(error = %error, "policy gone before its reconcile");
                    }
                    // A watch resumed from a resourceVersion etcd compacted away answers
                    // 410 Expired: routine, the watcher lists again.
                    Err(kube::runtime::controller::Error::QueueError(
                        kube::runtime::watcher::Error::WatchError(status),
                    )) if status.code == 410 => {
                        tracing::debug!(error = %status.message, "a watch expired (410); listing again");
                    }
                    // A watch that keeps failing (no VersionPolicy CRD, no permission) is
                    // retried with backoff; saying so once a minute is enough.
                    Err(kube::runtime::controller::Error::QueueError(error)) => {
                        let hint = watch_failure_hint(&error);
                        let mut last = crate::sync::lock(&watch_errors);
                        let due = last
                            .get(&hint)
                            .is_none_or(|at: &tokio::time::Instant| at.elapsed() >= WATCH_ERROR_EVERY);
                        if due {
                            last.insert(hint.clone(), tokio::time::Instant::now());
                            error!(error = %error, "{hint}");
                        }
                    }
                    Err(error) => warn!(error = %error, "controller error"),
                    Ok(_) => {}
                }
            }
        });
    // The leader's own essential tasks: one that stops ends this term.
    let mut leader_tasks = Supervisor::default();
    leader_tasks.extend(stop_writers.sampler.take());
    leader_tasks.extend(stop_writers.ca_bundle_keeper.take());
    let result = tokio::select! {
        biased;
        failed = leader_tasks.first_failure() => Err(failed.into()),
        () = running => Ok(()),
        () = async { ready_when_listed.await; std::future::pending::<()>().await } => Ok(()),
    };
    drop(stop_writers);
    info!("controller stopped");
    result
}

/// How often a watch that keeps failing is reported.
const WATCH_ERROR_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// What a failing watch means for the person reading the log.
fn watch_failure_hint(error: &kube::runtime::watcher::Error) -> String {
    let text = error.to_string();
    if text.contains("404") || text.to_lowercase().contains("not found") {
        "cannot watch VersionPolicies: the VersionPolicy CRD is not installed (kubectl apply -f crds/versionpolicy.yaml); retrying, not ready".to_owned()
    } else if text.contains("403") || text.to_lowercase().contains("forbidden") {
        "cannot watch VersionPolicies or CustomResourceDefinitions: permission denied (apply deploy/rbac.yaml, or `kubectl auth can-i list versionpolicies.crdlifecycle.io`); retrying, not ready".to_owned()
    } else {
        "a watch of VersionPolicies or CustomResourceDefinitions keeps failing; retrying, not ready"
            .to_owned()
    }
}

/// The policies in the cache that target `crd_name`, except `except`.
fn policies_for_crd(
    store: &Store<DeserializeGuard<VersionPolicy>>,
    crd_name: &str,
    except: Option<&str>,
) -> Vec<ObjectRef<DeserializeGuard<VersionPolicy>>> {
    store
        .state()
        .iter()
        .filter(|guard| guard.0.as_ref().is_ok_and(|p| p.spec.crd_name == crd_name))
        .filter(|guard| Some(guard.name_any().as_str()) != except)
        .map(|guard| ObjectRef::from_obj(guard.as_ref()))
        .collect()
}
